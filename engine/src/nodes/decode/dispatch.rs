//! The decode node's entry: [`DecodeNode::handle`] routes each input to its handler
//! after the peer and writer checks; faults, reincarnation, timer arming, answers and
//! the flush. It does not hold the node's state (`state`) nor judge a transfer.

use super::state::{DecodeNode, Phase};
use crate::bugs::Bug;
use crate::compute::{Done, Job};
use crate::env::{Input, Outbox, Timer};
use crate::gpu::Gpu;
use crate::ids::{NodeId, RoomKey, WriteId};
use crate::kv::landing::writer_rule;
use crate::kv::PageRecords;
use crate::msg::{in_use, only_router, Msg, Status, Why};
use crate::nodes::worker::handle_behind;
use crate::trace::{NodeFault, Side, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// Trace the page changes the pool journaled since the last call, in order; a
    /// quarantine release names the drain ack that caused it (`acked`).
    pub(super) fn flush(&mut self, env: &mut Outbox<G::Kv>, acked: Option<RoomKey>) {
        let id = self.id;
        self.pool
            .drain_changes(|c| env.trace(c.into_event(id, acked)));
    }

    /// Report a fault of this node (drivers act on it).
    pub(super) fn fault(&mut self, fault: NodeFault, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        self.counters.fault(env, id, fault);
    }

    /// Peer identity: the router starts and aborts rooms; a transfer's conclusion and
    /// a drain ack about a room this node knows are believed only from that room's
    /// prefill node (a KV write copied by the receiver's software: [`Self::check_writer`]).
    /// For a room this node does not know there is no recorded peer: an ack for it
    /// releases nothing.
    pub(super) fn check_peer(&self, from: NodeId, msg: &Msg) -> Result<(), String> {
        let prefill_of = |room: &RoomKey| {
            self.requests
                .get(room)
                .map(|r| r.prefill)
                .or_else(|| self.quarantine.get(room).map(|q| q.prefill))
        };
        match msg {
            Msg::DecodeStart { .. } | Msg::PullStart { .. } | Msg::Abort { .. }
                if from != self.router =>
            {
                Err(only_router(self.router, from))
            }
            Msg::DecodeStart { room, prefill, .. } | Msg::PullStart { room, prefill, .. }
                if !self.prefills.contains(prefill) =>
            {
                Err(format!(
                    "{room}'s start names {prefill}, which is not a prefill node"
                ))
            }
            Msg::DecodeStart { room, req, .. } => match self.requests.get(room) {
                Some(held)
                    if held.req != *req && !self.cfg.bugs.has(Bug::DuplicateRoomJoinsLive) =>
                {
                    Err(in_use(*room, held.req))
                }
                _ => Ok(()),
            },
            // A READ's completion is the reader NIC's own report (from its own NIC when
            // the READ completed, from the wire's side when it failed there): it names
            // one of this node's own READs.
            Msg::WriteDone { id, .. } if id.writer != self.id => {
                Err(format!("the completion of {id} is not of this node's READ"))
            }
            Msg::KvDone { room, .. } => match prefill_of(room) {
                Some(p) if p != from => Err(format!("{room}'s prefill node is {p}")),
                _ => Ok(()),
            },
            Msg::DrainAck { room } => {
                let asked: Vec<NodeId> = if self.cfg.bugs.has(Bug::AckIgnoresGeneration) {
                    self.quarantine
                        .iter()
                        .filter(|(k, _)| k.room == room.room)
                        .map(|(_, q)| q.prefill)
                        .collect()
                } else {
                    self.quarantine
                        .get(room)
                        .map(|q| q.prefill)
                        .into_iter()
                        .collect()
                };
                // Believed from a node that was asked. Under the generation-blind bug a
                // room number may wait on several prefill nodes at once (one per use);
                // the ack of any one of them is believed, as that system would.
                if !asked.is_empty() && !asked.contains(&from) {
                    Err(format!("{from} was not asked to drain {room}"))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// The prefill node this node knows for `room` (a live request's, or a
    /// quarantined room's), the peer its writes must come from.
    pub(crate) fn room_prefill(&self, room: RoomKey) -> Option<NodeId> {
        self.requests
            .get(&room)
            .map(|r| r.prefill)
            .or_else(|| self.quarantine.get(&room).map(|q| q.prefill))
    }

    /// The peer rule of a KV write the receiver's software copies (a two-sided
    /// transport): [`writer_rule`] with the room's prefill as this node
    /// knows it, asked before the copy (`world::copy_in`) and by `handle`
    /// again at the landing. On a one-sided transport nothing at the receiver asks.
    pub(crate) fn check_writer(&self, from: NodeId, id: WriteId) -> Result<(), String> {
        writer_rule(from, id, self.room_prefill(id.room))
    }

    /// Become the next incarnation, `epoch` (a driver asks for it through
    /// [`world::restart`](crate::world::restart), after the crash walk): requests,
    /// queues, quarantine, the fatal flag and tombstones are gone; the pool starts over,
    /// full, in the new epoch, so a write addressed with a tag handed out before the
    /// crash can never match a page allocated after it. KV memory is kept as it was
    /// (never zeroed). The driver must also forget the node's pending timers and
    /// undelivered messages. `epoch` must exceed every earlier one.
    pub(crate) fn reincarnate(&mut self, epoch: u32) {
        assert!(
            epoch > self.pool.epoch(),
            "a restart needs a new, higher epoch"
        );
        // Destructure so that a field added later cannot be forgotten here.
        let DecodeNode {
            id: _,
            cfg: _,
            router: _,
            prefills: _,
            pool,
            gpu: _,
            requests,
            prealloc,
            quarantine,
            handles,
            retired,
            finished_pages,
            compute_armed,
            batch,
            fatal,
            counters: _,
            front,
        } = self;
        *front = front.as_ref().map(|f| f.fresh(epoch));
        *pool = pool.restarted(epoch);
        requests.clear();
        prealloc.clear();
        quarantine.clear();
        handles.clear();
        retired.clear();
        finished_pages.clear();
        *compute_armed = false;
        batch.clear();
        *fatal = None;
    }

    pub(super) fn is_stale(&self, room: RoomKey) -> bool {
        self.retired.is_stale(room)
    }

    /// Ask for the scheduler loop's next pass (`Timer::Compute`), unless one is armed.
    pub(super) fn arm_compute(&mut self, env: &mut Outbox<G::Kv>) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.decode_step_ns);
        }
    }

    /// Feed one input; the effects leave through `env`, in the order issued. A node
    /// behind its worker front is reached through it (`nodes/worker/behind.rs`).
    pub fn handle(&mut self, input: Input, env: &mut Outbox<G::Kv>) {
        match self.front.take() {
            Some(mut f) => {
                handle_behind(&mut f, input, env, &mut |i, e| self.handle_own(i, e));
                self.front = Some(f);
            }
            None => self.handle_own(input, env),
        }
    }

    fn handle_own(&mut self, input: Input, env: &mut Outbox<G::Kv>) {
        match input {
            Input::Message { from, msg } => {
                let verdict = self.check_peer(from, &msg);
                if !self
                    .counters
                    .admit_peer(env, (self.id, from), &msg, verdict)
                {
                    return;
                }
                match msg {
                    Msg::DecodeStart {
                        room,
                        req,
                        prompt,
                        max_new_tokens,
                        prefill,
                    } => {
                        let peers = (prefill, None);
                        self.on_start(room, req, prompt.len() as u64, max_new_tokens, peers, env)
                    }
                    Msg::PullStart {
                        room,
                        req,
                        prompt,
                        max_new_tokens,
                        prefill,
                        src,
                    } => {
                        let peers = (prefill, Some(src));
                        self.on_start(room, req, prompt.len() as u64, max_new_tokens, peers, env)
                    }
                    Msg::WriteDone { id, ok } => self.on_read_done(id, ok, env),
                    // A conclusion about a dead incarnation's page list: not ours.
                    Msg::KvDone { epoch, .. } if epoch != self.pool.epoch() => {}
                    Msg::KvDone { room, outcome, .. } => self.on_kv_done(from, room, outcome, env),
                    Msg::Abort { room } => self.on_abort(room, Status::CLIENT_CLOSED, env),
                    Msg::DrainAck { room } => self.on_drain_ack(room, env),
                    _ => {}
                }
            }
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env)
            }
            Input::Timer(Timer::WaitingForKv(room)) => self.on_waiting_timeout(room, env),
            Input::Timer(Timer::DrainRetry(room, arming)) => self.on_drain_retry(room, arming, env),
            Input::Timer(Timer::Heartbeat(room)) => self.on_heartbeat(room, env),
            Input::Timer(_) => {}
            Input::Landed {
                from,
                id,
                dst,
                landing,
            } => self.on_landed(from, id, dst, landing, env),
            Input::Computed(Done::DecodeStep { job, outcome }) => {
                self.stepped(job, outcome, env);
                self.next_step(env);
            }
            // A forward is a prefill node's.
            Input::Computed(Done::Forward { .. }) => {}
        }
    }

    /// The room's KV never completed in time: a transferring room fails.
    fn on_waiting_timeout(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if matches!(
            self.requests.get(&room).map(|r| &r.phase),
            Some(Phase::Transferring { .. })
        ) {
            env.trace(TraceEvent::TransferFailed {
                node: self.id,
                room,
                reason: "waiting timeout".into(),
            });
            self.fail(room, Status::INTERNAL, Some(Why::TransferFailed), env);
        }
    }

    /// Answer the router for `room`, once, with the engine's reason for an error
    /// `status` where it has one: a repeated answer (an abort seen again, for a use
    /// already answered) repeats the first status and reason.
    pub(super) fn answer(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        let from = (self.id, self.router, Side::Decode);
        self.retired
            .answer_once(env, from, room, (status, why), &self.quarantine);
    }
}

impl<G: Gpu, P: PageRecords> crate::step::Stepper<G::Kv> for DecodeNode<G, P> {
    fn handle(&mut self, input: Input, out: &mut crate::env::Outbox<G::Kv>) {
        DecodeNode::handle(self, input, out);
    }
    /// The node's own memory runs the job (every driver but the hardware runtime, whose
    /// device thread runs it on the same memory).
    fn compute(&mut self, job: Job) -> Done {
        job.run(&mut self.gpu)
    }
}
