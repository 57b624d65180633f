//! The lease on a finished room's pages: decode's notification ends it, its heartbeat
//! renews it, its expiry frees the pages whoever still means to read them (vLLM's
//! `_reqs_to_send` expiry in the worker); an abort before the forward.

use super::state::{Phase, VllmPrefill};
use crate::bugs::Bug;
use crate::decode::handle_count;
use crate::env::{Outbox, Timer};
use crate::gpu::{zero_on_free, Gpu};
use crate::ids::{PageTag, RoomKey};
use crate::kv::PageState;
use crate::msg::Status;
use crate::trace::{NodeFault, TraceEvent};

impl<G: Gpu> VllmPrefill<G> {
    /// The lease of `room` ended: decode's notification (`expired` false) or its
    /// timer. The pages are released and the room retired; anything else (a
    /// duplicate notification, a stale timer) changes nothing.
    pub(super) fn lease_ended(&mut self, room: RoomKey, expired: bool, env: &mut Outbox<G::Kv>) {
        let Some(Phase::Leased { pages, .. }) = self.requests.get(&room).map(|r| &r.phase) else {
            return;
        };
        let pages = pages.clone();
        let node = self.id;
        env.trace(TraceEvent::LeaseEnded {
            node,
            room,
            expired,
        });
        if !expired {
            env.cancel_timer(Timer::Lease(room));
        }
        self.release(room, &pages, env);
        self.requests.remove(&room);
    }

    /// NIXL's notification of READ handle `rank`: the lease ends once every handle
    /// decode posts for the room ([`handle_count`] over the room's pages and
    /// `EngineConfig::ranks`) has notified (vLLM counts a request's notifications up
    /// to its number of remote ranks before it frees the blocks); a repeated or
    /// out-of-range rank counts nothing.
    pub(super) fn on_notify(&mut self, room: RoomKey, rank: u32, env: &mut Outbox<G::Kv>) {
        let ranks = self.cfg.ranks;
        let Some(Phase::Leased { pages, notified }) =
            self.requests.get_mut(&room).map(|r| &mut r.phase)
        else {
            return;
        };
        let expected = handle_count(pages.len(), ranks);
        if rank < expected {
            notified.insert(rank);
        }
        if notified.len() as u32 >= expected {
            self.lease_ended(room, false, env);
        }
    }

    /// A heartbeat from the room's decode: the lease runs from now again (not with
    /// `lease-ignores-heartbeat`: vLLM #20139's timeout counts from the finish).
    pub(super) fn renew(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if self.cfg.bugs.has(Bug::LeaseIgnoresHeartbeat) {
            return;
        }
        if let Some(Phase::Leased { .. }) = self.requests.get(&room).map(|r| &r.phase) {
            env.set_timer(Timer::Lease(room), self.cfg.timeouts.lease_ns);
        }
    }

    /// The router's abort. Before the forward the request ends here (499); once
    /// answered, vLLM keeps the blocks for the reader until its notification or the
    /// lease ("we should never get an abort after setting an expiry timer"): the
    /// abort repeats the first answer.
    pub(super) fn on_abort(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(r) = self.requests.get(&room) else {
            // Unknown or already let go: answer again (the first answer, if it gave
            // one), so that a lost answer cannot wedge the router's room.
            return self.answer(room, Status::CLIENT_CLOSED, None, env);
        };
        match &r.phase {
            Phase::Leased { .. } => {}
            Phase::Waiting => {
                self.requests.remove(&room);
                self.waiting.retain(|w| *w != room);
            }
            Phase::Forward { pages } => {
                let pages = pages.clone();
                self.release(room, &pages, env);
                self.requests.remove(&room);
            }
        }
        self.answer(room, Status::CLIENT_CLOSED, None, env);
    }

    /// Free `room`'s `pages` (zeroed with defense 7), then let the queue have them.
    pub(super) fn release(&mut self, room: RoomKey, pages: &[PageTag], env: &mut Outbox<G::Kv>) {
        if let Err(e) = self.pool.release(room, pages) {
            let id = self.id;
            self.counters
                .fault(env, id, NodeFault::record_refused(room, "release", &e));
            return;
        }
        self.flush(env);
        if self.cfg.defenses.zero_on_free {
            let pool = &self.pool;
            let is_free = |p| pool.record(p).is_some_and(|r| r.state == PageState::Free);
            let node = (self.id, &mut self.counters);
            zero_on_free(&mut self.gpu, env, node, pages, is_free);
        }
        if !self.waiting.is_empty() {
            self.arm_compute(env);
        }
    }
}
