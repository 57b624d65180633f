//! The end of a request: finish and release, failure and abort, quarantine until the
//! drain ack for the exact room use (defense 3), and the drain retry that fails the node
//! loudly instead of releasing. It does not land KV.

use super::state::{DecodeNode, Phase, Quarantine};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::{zero_on_free, Gpu};
use crate::ids::{PageTag, RoomKey};
use crate::kv::{PageRecords, PageState};
use crate::msg::{Msg, Status, Why};
use crate::trace::{NodeFault, ReleaseKind, Side, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// Normal end (or a failed step): release the pages and answer once, with the
    /// engine's reason for an error `status` where it has one.
    pub(super) fn finish(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(req) = self.requests.remove(&room) else {
            return;
        };
        // Release only the pages this room still owns: after a tag mismatch some page
        // may belong to someone else now, and only the owner frees (S8).
        let owned: Vec<PageTag> = req
            .phase
            .pages()
            .iter()
            .copied()
            .filter(|t| self.pool.owns(room, *t))
            .collect();
        self.release(room, &owned, ReleaseKind::Owner, env);
        if self.cfg.bugs.has(Bug::DoubleFreeOnFinish) {
            if self.finished_pages.len() >= self.cfg.max_queue as usize {
                self.finished_pages.pop_front();
            }
            self.finished_pages
                .push_back((room, req.phase.into_pages()));
        }
        self.answer(room, status, why, env);
    }

    pub(super) fn release(
        &mut self,
        room: RoomKey,
        pages: &[PageTag],
        how: ReleaseKind,
        env: &mut Outbox<G::Kv>,
    ) {
        match how {
            ReleaseKind::Unchecked => self.pool.free_unchecked(room, pages),
            ReleaseKind::Owner => {
                if let Err(e) = self.pool.release(room, pages) {
                    self.fault(NodeFault::record_refused(room, "release", &e), env);
                    return;
                }
            }
        }
        self.flush(env, None);
        self.after_free(pages, env);
    }

    pub(super) fn after_free(&mut self, pages: &[PageTag], env: &mut Outbox<G::Kv>) {
        if self.cfg.defenses.zero_on_free {
            let pool = &self.pool;
            let is_free = |p| pool.page(p).is_some_and(|r| r.state == PageState::Free);
            let node = (self.id, &mut self.counters);
            zero_on_free(&mut self.gpu, env, node, pages, is_free);
        }
        self.try_prealloc(env);
    }

    /// The request failed (transfer failure, verification, timeout, abort, the device):
    /// answer with the engine's reason where it has one, and hand its pages to
    /// quarantine if a write may still land in them.
    pub(super) fn fail(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(req) = self.requests.remove(&room) else {
            return;
        };
        env.cancel_timer(Timer::WaitingForKv(room));
        match req.phase {
            Phase::Prealloc => self.prealloc.retain(|r| *r != room),
            Phase::Running { pages, .. } => {
                let owned: Vec<PageTag> = pages
                    .iter()
                    .copied()
                    .filter(|t| self.pool.owns(room, *t))
                    .collect();
                self.release(room, &owned, ReleaseKind::Owner, env);
            }
            Phase::Transferring { pages, .. } => {
                let deferred = self.cfg.defenses.deferred_release
                    && !self.cfg.bugs.has(Bug::DecodeReleaseImmediate);
                if req.remote.is_some() {
                    // A pull: its own READ may still land; its completion releases.
                    self.quarantine_read(room, req.prefill, pages, env);
                } else if deferred {
                    if let Err(e) = self.pool.quarantine(room, &pages) {
                        self.fault(NodeFault::record_refused(room, "quarantine", &e), env);
                    } else {
                        self.flush(env, None);
                        self.quarantine.insert(
                            room,
                            Quarantine {
                                pages,
                                prefill: req.prefill,
                                retries: 0,
                                read: false,
                            },
                        );
                        env.send(req.prefill, Msg::DrainRequest { room });
                        env.set_timer(Timer::DrainRetry(room, 0), self.cfg.timeouts.drain_retry_ns);
                    }
                } else {
                    // Free now, while prefill may still be writing (pre-#35049).
                    env.send(req.prefill, Msg::DrainRequest { room });
                    self.release(room, &pages, ReleaseKind::Owner, env);
                }
            }
        }
        self.answer(room, status, why, env);
    }

    pub(super) fn on_abort(&mut self, room: RoomKey, status: Status, env: &mut Outbox<G::Kv>) {
        if self.requests.contains_key(&room) {
            env.trace(TraceEvent::AbortNoted {
                node: self.id,
                room,
                side: Side::Decode,
            });
            self.fail(room, status, None, env);
            return;
        }
        if self.cfg.bugs.has(Bug::DoubleFreeOnFinish) {
            // The second release path: the abort handler frees the finished request's
            // pages again through the allocator's unchecked free.
            if let Some(i) = self.finished_pages.iter().position(|(r, _)| *r == room) {
                if let Some((_, pages)) = self.finished_pages.remove(i) {
                    self.release(room, &pages, ReleaseKind::Unchecked, env);
                }
            }
        }
        // Unknown or already answered: answer again (the router ignores duplicates) so
        // that a lost answer or a start message still in flight cannot wedge the room.
        self.answer(room, status, None, env);
    }

    pub(super) fn on_drain_ack(&mut self, ack: RoomKey, env: &mut Outbox<G::Kv>) {
        let matching: Vec<RoomKey> = if self.cfg.bugs.has(Bug::AckIgnoresGeneration) {
            self.quarantine
                .keys()
                .filter(|k| k.room == ack.room)
                .copied()
                .collect()
        } else {
            self.quarantine
                .contains_key(&ack)
                .then_some(ack)
                .into_iter()
                .collect()
        };
        for room in matching {
            let Some(q) = self.quarantine.remove(&room) else {
                continue;
            };
            env.cancel_timer(Timer::DrainRetry(room, q.retries));
            if let Err(e) = self.pool.release_quarantined(room, &q.pages) {
                self.fault(
                    NodeFault::record_refused(room, "quarantine release", &e),
                    env,
                );
                continue;
            }
            self.flush(env, Some(ack));
            self.after_free(&q.pages, env);
        }
    }

    /// A drain-retry timer of `room`'s quarantine fired, set when the quarantine had
    /// made `arming` retries. Only the arming decode set last counts: an earlier one
    /// delivered again (a stale entry of a timer wheel, a cancelled timer) is ignored,
    /// so that it cannot use up the retry budget and stop the node early.
    pub(super) fn on_drain_retry(&mut self, room: RoomKey, arming: u32, env: &mut Outbox<G::Kv>) {
        let max = self.cfg.timeouts.drain_retries;
        let retry_ns = self.cfg.timeouts.drain_retry_ns;
        let Some(q) = self.quarantine.get_mut(&room) else {
            return;
        };
        if arming != q.retries {
            return;
        }
        // Saturate, so a node that keeps asking has finitely many states.
        q.retries = q.retries.saturating_add(1).min(max.saturating_add(1));
        let (retries, prefill) = (q.retries, q.prefill);
        if retries > max && self.fatal.is_none() {
            // Never release on a timeout: a write may still land. Stop loudly: the
            // node takes no new request from here on.
            let fault = NodeFault::DrainAckMissing { room, retries: max };
            self.fatal = Some(fault.to_string());
            self.fault(fault, env);
        }
        // Keep asking, stopped or not: the writer may come back (a partition heals,
        // a node restarts), and its ack is the only thing that may release these
        // pages. Giving up here would leave them quarantined forever after every
        // outage longer than the retry budget (liveness, L3/L4), with nothing gained
        // for safety.
        env.send(prefill, Msg::DrainRequest { room });
        env.set_timer(Timer::DrainRetry(room, retries), retry_ns);
    }
}
