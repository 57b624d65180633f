//! The prefill node's entry: [`PrefillNode::handle`] routes each input to its
//! handler after the peer check, and the node's faults, timer arming and flush.
//! It does not hold the node's state (`state`) nor decide any transition itself.

use super::state::PrefillNode;
use crate::bugs::Bug;
use crate::compute::Done;
use crate::env::{Input, Outbox, Timer};
use crate::gpu::Gpu;
use crate::ids::{NodeId, RoomKey};
use crate::msg::{in_use, only_router, Msg, Status};
use crate::nodes::worker::handle_behind;
use crate::trace::NodeFault;

impl<G: Gpu> PrefillNode<G> {
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
                    Msg::PrefillStart {
                        room,
                        req,
                        prompt,
                        decode,
                    } => self.on_start(room, req, prompt, decode, env),
                    Msg::KvMeta { room, dst, .. } => self.on_meta(from, room, dst, env),
                    Msg::WriteDone { id, ok } => self.on_write_done(id, ok, env),
                    Msg::Abort { room } => self.on_abort(room, Status::CLIENT_CLOSED, env),
                    Msg::DrainRequest { room } => self.on_drain_request(from, room, env),
                    _ => {}
                }
            }
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env)
            }
            Input::Timer(Timer::Bootstrap(room)) => self.on_bootstrap_timeout(room, env),
            Input::Timer(_) => {}
            // Only a decode node's receiver lands writes.
            Input::Landed { .. } => {}
            Input::Computed(Done::Forward { job, written }) => {
                self.forwarded(job, written, env);
                self.next_forward(env);
            }
            // A decode step is a decode node's.
            Input::Computed(Done::DecodeStep { .. }) => {}
        }
    }

    /// Peer identity: a message about a room is believed only from that room's peer. The
    /// router starts and aborts rooms; the room's decode node sends its page list and
    /// drain requests; a write's completion comes from the node the write went to, for
    /// a write this incarnation issued. A room this node does not know has no recorded
    /// peer, and what it may do for such a room moves no page (it answers, or keeps a
    /// page list for a start message still on its way).
    pub(super) fn check_peer(&self, from: NodeId, msg: &Msg) -> Result<(), String> {
        let decode_of = |room: &RoomKey| {
            self.requests
                .get(room)
                .map(|r| r.decode)
                .or_else(|| self.outstanding.get(room).map(|o| o.to))
                .or_else(|| self.owes_failure_to(*room))
        };
        match msg {
            Msg::PrefillStart { .. } | Msg::Abort { .. } if from != self.router => {
                Err(only_router(self.router, from))
            }
            Msg::PrefillStart { room, req, .. } => match self.requests.get(room) {
                Some(held)
                    if held.req != *req && !self.cfg.bugs.has(Bug::DuplicateRoomJoinsLive) =>
                {
                    Err(in_use(*room, held.req))
                }
                _ => Ok(()),
            },
            Msg::KvMeta { room, .. } | Msg::DrainRequest { room } => match decode_of(room) {
                Some(d) if d != from => Err(format!("{room}'s decode node is {d}")),
                _ => Ok(()),
            },
            Msg::WriteDone { id, .. } => {
                if id.writer != self.id || id.epoch != self.pool.epoch() {
                    return Err(format!("{id} is not a write of this incarnation"));
                }
                match self.outstanding.get(&id.room).map(|o| o.to) {
                    Some(to) if to != from => Err(format!("{id} went to {to}")),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Trace the page changes the pool journaled since the last call, in order.
    pub(super) fn flush(&mut self, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        for c in self.pool.take_changes() {
            env.trace(c.into_event(id, None));
        }
    }

    /// Report a fault of this node (drivers act on it).
    pub(super) fn fault(&mut self, fault: NodeFault, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        self.counters.fault(env, id, fault);
    }

    /// Ask for the scheduler loop's next pass (`Timer::Compute`), unless one is armed.
    pub(super) fn arm_compute(&mut self, env: &mut Outbox<G::Kv>) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.prefill_forward_ns);
        }
    }
}

impl<G: Gpu> crate::step::Stepper<G::Kv> for PrefillNode<G> {
    fn handle(&mut self, input: Input, out: &mut crate::env::Outbox<G::Kv>) {
        PrefillNode::handle(self, input, out);
    }
    fn compute(&mut self, job: crate::compute::Job) -> crate::compute::Done {
        job.run(&mut self.gpu)
    }
}
