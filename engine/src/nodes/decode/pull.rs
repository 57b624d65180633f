//! vLLM's pull (its NIXL connector, `pull_worker.py` and `base_scheduler.py` as of
//! vllm-project/vllm 0050936b): decode reads prefill's pages itself with one-sided
//! RDMA READ (`Msg::KvRead`, served by the world at prefill's NIC), renews prefill's
//! lease with heartbeats until it has read, and runs the request when its READ
//! completes. There is no conclusion from prefill and no verification: vLLM has none;
//! the READ's completion is the whole transfer. A pull aborted or failed while its
//! READ may still land keeps its pages quarantined until that READ's completion.

use super::handles::{handle_count, slice, Count, Handles};
use super::state::{DecodeNode, Phase, Quarantine, TransferFacts};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};
use crate::kv::PageRecords;
use crate::msg::{Msg, Status, Why};
use crate::trace::{NodeFault, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// Post one READ of prefill's `src` into the room's `dst` per rank (each its slice,
    /// its id's chunk the rank), to `prefill`'s NIC, and record them as pending.
    pub(super) fn post_read(
        &mut self,
        room: RoomKey,
        prefill: NodeId,
        mut src: Vec<PageTag>,
        dst: Vec<PageTag>,
        env: &mut Outbox<G::Kv>,
    ) {
        // vLLM reads as many blocks as both sides list (its block ids are aligned).
        src.truncate(dst.len());
        let dst = &dst[..src.len()];
        let n = handle_count(src.len(), self.cfg.ranks);
        for rank in 0..n {
            let id = WriteId {
                writer: self.id,
                epoch: self.pool.epoch(),
                room,
                chunk: rank,
            };
            let at: Vec<usize> = slice(src.len(), n, rank).collect();
            let read = Msg::KvRead {
                id,
                src: at.iter().map(|&i| src[i]).collect(),
                dst: at.iter().map(|&i| dst[i]).collect(),
            };
            env.send(prefill, read);
        }
        self.handles.insert(room, Handles::new(n));
    }

    /// A pulled room heartbeats its prefill every sixth of the lease while it has not
    /// read (vLLM's `_heartbeat_interval`).
    pub(super) fn start_heartbeat(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if self.requests.get(&room).is_some_and(|r| r.remote.is_some()) {
            env.set_timer(Timer::Heartbeat(room), self.heartbeat_ns());
        }
    }

    fn heartbeat_ns(&self) -> u64 {
        (self.cfg.timeouts.lease_ns / 6).max(1)
    }

    /// The heartbeat timer: renew the lease while the room waits for pages or for its
    /// READ; a room that read (or is gone) stops.
    pub(super) fn on_heartbeat(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(r) = self.requests.get(&room) else {
            return;
        };
        if r.remote.is_none() || matches!(r.phase, Phase::Running { .. }) {
            return;
        }
        env.send(r.prefill, Msg::Heartbeat { room });
        env.set_timer(Timer::Heartbeat(room), self.heartbeat_ns());
    }

    /// A pull's pages go to quarantine until its READ completes.
    pub(super) fn quarantine_read(
        &mut self,
        room: RoomKey,
        prefill: NodeId,
        pages: Vec<PageTag>,
        env: &mut Outbox<G::Kv>,
    ) {
        if let Err(e) = self.pool.quarantine(room, &pages) {
            self.fault(NodeFault::record_refused(room, "quarantine", &e), env);
            return;
        }
        self.flush(env, None);
        let q = Quarantine {
            pages,
            prefill,
            retries: 0,
            read: true,
        };
        self.quarantine.insert(room, q);
    }

    /// The completion of this node's READ handle `id` (its own NIC's report), counted
    /// ([`Handles::count`]): once the room's count ends, a quarantined pull is
    /// released, a transferring one runs (`ok`) or fails.
    pub(super) fn on_read_done(&mut self, id: WriteId, ok: bool, env: &mut Outbox<G::Kv>) {
        let room = id.room;
        if id.epoch != self.pool.epoch() {
            return;
        }
        if !ok && self.cfg.bugs.has(Bug::ReadErrorLeavesPending) {
            // vLLM #55181: the transfer exception escapes before any terminal state.
            return;
        }
        let bugs = self.cfg.bugs;
        let count = self.handles.get_mut(&room);
        let Some(Count::Ended { ok }) = count.map(|h| h.count(id.chunk, ok, bugs)) else {
            return;
        };
        self.handles.remove(&room);
        if self.quarantine.get(&room).is_some_and(|q| q.read) {
            return self.on_drain_ack(room, env);
        }
        let Some(r) = self.requests.get(&room) else {
            return;
        };
        let Phase::Transferring { dst_pages, .. } = &r.phase else {
            return;
        };
        let facts = TransferFacts {
            from: r.prefill,
            prompt_len: r.prompt_len,
            reserved_pages: *dst_pages as u32,
            fully_written: ok,
        };
        let sent_pages = r.remote.as_ref().map_or(0, |s| s.len() as u32);
        // vLLM #52234: a failed READ taken for done; the request runs on whatever its
        // pages hold.
        if ok || self.cfg.bugs.has(Bug::FailOpenOnRecvError) {
            return self.accept_transfer(room, facts, r.prompt_len, sent_pages, env);
        }
        let node = self.id;
        let reason = "the READ failed".to_string();
        env.trace(TraceEvent::TransferFailed { node, room, reason });
        env.cancel_timer(Timer::Heartbeat(room));
        let pages = self
            .requests
            .remove(&room)
            .map(|r| r.phase.into_pages())
            .unwrap_or_default();
        self.release(room, &pages, crate::trace::ReleaseKind::Owner, env);
        self.answer(room, Status::INTERNAL, Some(Why::TransferFailed), env);
    }
}
