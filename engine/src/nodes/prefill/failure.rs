//! Failure, abort and drain: decode's drain requests (M8) acked only once every write
//! for that exact room use completed (defense 3), aborts, failed sends and the failure
//! owed to decode. It does not start writes.

use super::state::{epoch_of, tell_failed, KvDoneOwed, Outstanding, Phase, PrefillNode};
use crate::bugs::Bug;
use crate::env::Outbox;
use crate::gpu::{device_fault, DeviceError, Gpu};
use crate::ids::{NodeId, PageTag, RoomKey};
use crate::msg::{Msg, Status, TransferOutcome};
use crate::trace::{Side, TraceEvent};

impl<G: Gpu> PrefillNode<G> {
    /// Has every write of this room use completed?
    pub(super) fn drained(&self, room: RoomKey) -> bool {
        match self.outstanding.get(&room) {
            None => true,
            Some(o) => {
                o.chunks.is_empty()
                    || (o.any_failed && self.cfg.bugs.has(Bug::FailedSendReportsDrained))
            }
        }
    }

    pub(super) fn maybe_ack_drain(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let drained = self.drained(room);
        let Some(out) = self.outstanding.get_mut(&room) else {
            return;
        };
        if drained {
            if let Some(to) = out.drain_requested_by.take() {
                env.trace(TraceEvent::DrainAcked {
                    node: self.id,
                    room,
                });
                env.send(to, Msg::DrainAck { room });
            }
        }
        if out.chunks.is_empty()
            && out.drain_requested_by.is_none()
            && !self.requests.contains_key(&room)
        {
            self.outstanding.remove(&room);
        }
    }

    /// Decode aborted the room (M8): stop sending; ack once every write drained.
    pub(super) fn on_drain_request(
        &mut self,
        from: NodeId,
        room: RoomKey,
        env: &mut Outbox<G::Kv>,
    ) {
        if let Some(req) = self.requests.get_mut(&room) {
            match &req.phase {
                Phase::Sending { .. } => {
                    req.finished_reason.get_or_insert(Status::INTERNAL);
                    // Decode asked: it needs no KvDone.
                    self.fail_send(room, KvDoneOwed::No, env);
                }
                Phase::Bootstrapping | Phase::Waiting { .. } | Phase::Forward { .. } => {
                    self.on_abort(room, Status::INTERNAL, env);
                }
                Phase::Inflight { .. } => {}
            }
        }
        let unknown = !self.requests.contains_key(&room)
            && !self.outstanding.contains_key(&room)
            && !self.is_stale(room);
        if unknown {
            // Kept, not believed: the start names the room's decode node. Acked now
            // (there is no write of this node for the room), unless the bound is
            // reached; then decode asks again later.
            if self.early_drain.len() >= self.cfg.max_queue as usize {
                return;
            }
            self.early_drain.insert((room, from));
        } else if !self.requests.contains_key(&room) {
            self.tombstone(room);
        }
        self.outstanding
            .entry(room)
            .or_insert_with(|| Outstanding {
                to: from,
                ..Outstanding::default()
            })
            .drain_requested_by = Some(from);
        self.maybe_ack_drain(room, env);
    }

    /// An abort from the router (client gone, decode failed) or from decode.
    pub(super) fn on_abort(&mut self, room: RoomKey, status: Status, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get_mut(&room) else {
            // Unknown: the start message is late or lost, or we already answered. Either
            // way answer (again, with the first answer's status); the router ignores
            // duplicates, and the tombstone makes a late start message harmless.
            self.tombstone(room);
            self.answer(room, status, None, env);
            return;
        };
        env.trace(TraceEvent::AbortNoted {
            node: self.id,
            room,
            side: Side::Prefill,
        });
        match &req.phase {
            // An abort is the router's to tell decode (defense 6); prefill tells it
            // only what it knows to be owed, a page list it will never serve.
            Phase::Bootstrapping | Phase::Waiting { .. } => {
                let knows_decode = req.phase.meta().is_some();
                if knows_decode {
                    self.notify_decode_failed(room, env);
                }
                self.retire(room, status, None, env);
            }
            // Abort method 3: the running batch sees it at the next result.
            Phase::Forward { .. } => {
                req.to_finish.get_or_insert(status);
            }
            Phase::Sending { .. } => {
                req.finished_reason.get_or_insert(status);
                self.fail_send(room, KvDoneOwed::Yes, env);
            }
            // The transfer already concluded; the abort is recorded as the finish
            // reason and the poll decides what the router hears.
            Phase::Inflight { .. } => {
                req.finished_reason.get_or_insert(status);
            }
        }
    }

    /// Conclude a sending room's transfer as failed: no further chunk goes out, decode
    /// hears `KvDone { Failed }` unless it asked for the stop itself, and the next
    /// scheduler tick polls the room (which releases the source pages once their writes
    /// drained). The three ways a send fails (a write failed, an abort, decode's drain
    /// request) all end here.
    pub(super) fn fail_send(&mut self, room: RoomKey, owed: KvDoneOwed, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get_mut(&room) else {
            return;
        };
        if !matches!(req.phase, Phase::Sending { .. }) {
            return;
        }
        req.advance(|now| match now {
            Phase::Sending { meta, pages, .. } => Phase::Inflight {
                meta,
                pages,
                outcome: TransferOutcome::Failed,
            },
            other => other,
        });
        assert!(matches!(req.phase, Phase::Inflight { .. }));
        if owed == KvDoneOwed::Yes {
            self.notify_decode_failed(room, env);
        }
        self.arm_compute(env);
    }

    /// The device failed reading the source or its digest: state it and fail the send
    /// as a failed write does (decode told, the writes in flight still complete, the
    /// source released when they drained).
    pub(super) fn send_failed_on_device(
        &mut self,
        room: RoomKey,
        e: &DeviceError,
        env: &mut Outbox<G::Kv>,
    ) {
        self.fault(device_fault(Some(room), e), env);
        self.fail_send(room, KvDoneOwed::Yes, env);
    }

    pub(super) fn notify_decode_failed(&self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if let Some(req) = self.requests.get(&room) {
            tell_failed(env, room, req.decode, req.phase.decode_epoch());
        }
    }

    /// `room` failed before `decode`'s page list was used: tell `decode` at once if its
    /// list is here already (kept early), or record that it is owed the news
    /// ([`Self::on_failed_meta`]).
    pub(super) fn owe_failure(&mut self, room: RoomKey, decode: NodeId, env: &mut Outbox<G::Kv>) {
        if self.cfg.bugs.has(Bug::PrefillDropsFailedPageList) {
            // The old silence: the retirement drops a list kept early, and a later
            // one finds nothing owed.
            return;
        }
        if let Some(dst) = self.early_meta.remove(&(room, decode)) {
            tell_failed(env, room, decode, epoch_of(&dst));
            return;
        }
        let e = self
            .owed_failure
            .entry(room.room, || (room.gen, decode), &|_| false);
        *e = (room.gen, decode);
    }

    /// A page list for a room use this node already retired. If the use failed here
    /// before its page list came, the decode its start named is told the transfer
    /// failed, once (peer identity, [`Self::check_peer`], refused a list from any other
    /// node), and then releases its pages instead of waiting for its own timeout. A
    /// late copy of a list already used changes nothing.
    pub(super) fn on_failed_meta(
        &mut self,
        from: NodeId,
        room: RoomKey,
        dst: &[PageTag],
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(decode) = self.owes_failure_to(room) else {
            return;
        };
        assert_eq!(decode, from, "peer identity admits only the room's decode");
        self.owed_failure.remove(room.room);
        tell_failed(env, room, decode, epoch_of(dst));
    }
}
