//! A node's loop ([`NodeLoop`]): the node and its [`Io`], one event or due timer a
//! turn, each fed to the node as one input whose effects are carried out in the order
//! issued; the node's restart in process and the check of its own invariants. Not
//! worker mode's halves (`halves`) nor the stream decision (`stream`).

use crate::device::DeviceThread;
use crate::landing::LandingRecord;
use crate::node::event::NodeEvent;
use crate::node::io::Io;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::node::status::NodeStatus;
use crate::node::step::{pace_idle_pass, OnDevice, RuntimeNode};
use crate::seam::{Next, NodeRuntime};
use crate::sync::Arc;
use kvsim_engine::env::{Input, Outbox, Timer};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, TenantId, Token, WriteId};
use kvsim_engine::kv::PageRecords;
use kvsim_engine::msg::{KvWrite, Msg, Status};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::world::{self, CrashWalk, WriteFailure};
use kvsim_oracle::schema::{CancelHow, FaultEvent, Record};

/// A node's loop: the node and its [`Io`], over the runtime `R`.
pub struct NodeLoop<G: Gpu, R: NodeRuntime<Kv = G::Kv>> {
    pub node: RuntimeNode<G>,
    pub io: Io<R>,
    /// Check the node's own invariants ([`Node::invariants`]) after every input (on
    /// unless `kvsim serve --no-invariants`); off after the first violation.
    pub check_invariants: bool,
    /// The record a decode node's KV writes land on, replaced when the node restarts.
    pub landing: Option<Arc<LandingRecord>>,
    /// The node's device thread, which runs its compute ([`NodeLoop::on_device_thread`]);
    /// without one the loop runs it in place, on the same memory.
    device: Option<DeviceThread>,
    outbox: Outbox<G::Kv>,
    pub(super) intake_open: bool,
    /// The last turn fired a timer ([`NodeLoop::turn`]).
    timer_turn: bool,
}

impl<G: Gpu, R: NodeRuntime<Kv = G::Kv>> NodeLoop<G, R> {
    pub fn new(node: RuntimeNode<G>, io: Io<R>) -> Self {
        NodeLoop {
            node,
            io,
            check_invariants: true,
            landing: None,
            device: None,
            outbox: Outbox::new(0),
            intake_open: true,
            timer_turn: false,
        }
    }

    /// Run the node's compute on a device thread of its own (a prefill or decode
    /// node; the router computes nothing), as `kvsim serve` does.
    pub fn on_device_thread(mut self) -> std::io::Result<Self>
    where
        G: Send + 'static,
    {
        if let Some(gpu) = self.node.gpu() {
            let name = format!("kvsim-device-{}", self.io.id);
            self.device = Some(DeviceThread::spawn(name, gpu.clone())?);
        }
        Ok(self)
    }

    /// A KV write no landing took arrives at the node: the world lands it
    /// ([`world::receive`]) and its effects are carried out as the node's.
    fn receive(&mut self, from: NodeId, write: KvWrite<G::Kv>) {
        self.outbox.reset(self.io.rt.now_ns());
        world::receive(&mut self.node, from, write, &mut self.outbox);
        let mut effects = std::mem::take(&mut self.outbox.effects);
        world::apply(self.io.id, effects.drain(..), &mut self.io);
        self.outbox.effects = effects;
        self.check_node();
    }

    pub(super) fn dispatch(&mut self, input: Input) {
        self.outbox.reset(self.io.rt.now_ns());
        let pass = matches!(input, Input::Timer(Timer::Compute));
        let mut node = OnDevice {
            node: &mut self.node,
            device: self.device.as_ref(),
            jobs: 0,
        };
        world::step(&mut node, input, &mut self.outbox);
        let idle_pass = pass && node.jobs == 0;
        let mut effects = std::mem::take(&mut self.outbox.effects);
        if idle_pass {
            pace_idle_pass(&mut effects);
        }
        world::apply(self.io.id, effects.drain(..), &mut self.io);
        self.outbox.effects = effects;
        if std::mem::take(&mut self.io.restart_asked) {
            self.restart();
        }
        self.check_node();
    }

    /// The node asked to be restarted: its incarnation dies as a crash does in every
    /// driver and it restarts as the next epoch, in process. Its timers die, the writes
    /// it posted are flushed with its NIC's queue (listed in the `crash` record; what
    /// comes for one later is not its completion), and the node is re-created by the
    /// engine's one restart ([`world::restart`]); a decode node's transfer thread lands
    /// every later write with the new incarnation's record (a landing the dead one
    /// finished fails back, [`NodeEvent::Landed`]). The router is never restarted.
    /// The loop does this when its node asks; a test may ask directly.
    pub fn restart(&mut self) {
        if self.node.role() == Role::Router {
            return;
        }
        let (node, dead) = (self.io.id, self.io.epoch);
        let epoch = dead + 1;
        self.io.timers.crash(node);
        // The world's one crash walk: the messages this loop holds are its posted writes.
        let walk = CrashWalk::<()>::new(node, dead).flush_posted(&mut self.io.writes);
        let flushed = walk.flushed;
        self.io.trace(|| {
            Record::Fault(FaultEvent::Crash {
                node,
                epoch: dead,
                flushed,
            })
        });
        world::restart(&mut self.node, epoch);
        if let (Node::Decode(d), Some(landing)) = (&self.node, &self.landing) {
            landing.replace(d.records().shared().clone());
        }
        self.io.epoch = epoch;
        // The dead incarnation's connections close with it, as a killed process's do: a
        // KV write it queued, listed flushed above, never reaches its receiver.
        self.io.rt.close_links(epoch);
        self.io
            .trace(|| Record::Fault(FaultEvent::Restart { node, epoch }));
        // Epochs name incarnations once: a later process of this node must start above.
        eprintln!(
            "kvsim serve: node {node} restarted in process as incarnation {epoch}; a later \
             process for it needs --epoch {} or higher",
            epoch + 1
        );
        debug_assert!(self.io.writes.is_empty() && self.io.timers.pending() == 0);
    }

    /// The node's own invariants, after an input. The first violation is reported
    /// loudly (stderr, a `violation` record in the node's trace, its status's fault)
    /// and checking stops: the node's state is wrong from here on.
    fn check_node(&mut self) {
        if !self.check_invariants {
            return;
        }
        let Err(violation) = self.node.invariants() else {
            return;
        };
        self.check_invariants = false;
        let what = format!(
            "invariant {} broken: {}",
            violation.invariant, violation.detail
        );
        eprintln!("kvsim serve: node {} {what}", self.io.id);
        self.io.fault = Some(what);
        self.io.trace(|| Record::Violation {
            violation,
            detected_by: Some("the node's own invariants, checked by kvsim serve".into()),
            room: None,
            related: Vec::new(),
            pages: Vec::new(),
        });
    }

    fn status(&self) -> NodeStatus {
        let (free, cap, live, quarantined, quarantined_pages) = match &self.node {
            Node::Router(r) => (None, None, r.live_rooms(), 0, 0),
            Node::Prefill(p) => (
                Some(p.pool().free_count()),
                Some(p.pool().capacity()),
                p.requests(),
                0,
                0,
            ),
            Node::VllmPrefill(p) => (
                Some(p.pool().free_count()),
                Some(p.pool().capacity()),
                p.requests(),
                0,
                0,
            ),
            Node::Decode(d) => (
                Some(d.records().shared().free_count()),
                Some(d.records().capacity()),
                d.requests(),
                d.quarantined_rooms(),
                d.quarantined_pages(),
            ),
        };
        NodeStatus {
            node: self.io.id,
            role: self.node.role(),
            epoch: self.io.epoch,
            free_pages: free,
            pool_pages: cap,
            live,
            quarantined,
            quarantined_pages,
            fault: self.io.fault.clone(),
            counts: self.io.counts,
        }
    }

    /// Run until [`NodeEvent::Stop`] (or nothing can come any more).
    pub fn run(mut self) {
        while self.turn() {}
        self.io.rt.flush_trace();
    }

    /// One turn of the loop: the next due timer fires, or the next event (waiting for
    /// one at most until the next deadline) is handled. `false`: the loop ends.
    ///
    /// A due timer right after a timer's turn yields to an event already queued, so a
    /// scheduler pass that re-arms at once (`kvsim serve`'s compute timer costs no
    /// modelled time: the device's own time is its cost) cannot starve the node's
    /// inputs, as SGLang's scheduler takes the requests that arrived before each pass.
    pub fn turn(&mut self) -> bool {
        let id = self.io.id;
        let now = self.io.rt.now_ns();
        let timer_turn = std::mem::take(&mut self.timer_turn);
        if timer_turn {
            if let Some(ev) = self.io.rt.ready_event() {
                return self.handle(ev);
            }
        }
        if let Some(timer) = self.io.timers.due(id, now) {
            self.timer_turn = true;
            match timer {
                Timer::Pairing(room) => self.pairing_over(room),
                timer => self.dispatch(Input::Timer(timer)),
            }
            return true;
        }
        let wait = self.io.timers.wait(id, now);
        match self.io.rt.next_event(wait) {
            Next::Event(ev) => self.handle(ev),
            Next::Idle => true,
            Next::Closed => false,
        }
    }

    /// The KV writes this node posted and has not seen complete, by receiver.
    pub fn writes_in_flight(&self) -> Vec<(NodeId, WriteId)> {
        self.io.writes.iter().collect()
    }

    /// A message read off a connection.
    fn on_msg(&mut self, from: NodeId, msg: Msg) {
        if let Msg::WriteDone { id, .. } = &msg {
            // Exactly one completion per write: one already failed back (its connection
            // broke) is not completed again. A READ's completion is the node's own
            // NIC's (`from` is the node): no write of its own in flight.
            if from != self.io.id && !self.io.writes.complete(from, *id) {
                return;
            }
        }
        self.dispatch(Input::Message { from, msg });
    }

    /// A client's request (router): traced, and submitted to the router as from the
    /// client.
    fn submit(
        &mut self,
        req: RequestId,
        tenant: TenantId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
        mut reply: ReplySink,
    ) {
        if !self.intake_open {
            reply.send(ReplyEv::Done(Reply {
                req: req.0,
                status: Status::UNAVAILABLE.0,
                tokens: Vec::new(),
                reason: None,
                why: None,
            }));
            return;
        }
        let prompt_len = prompt.len() as u64;
        self.io.trace(|| Record::Submit {
            req,
            tenant,
            prompt_len,
            max_new_tokens,
        });
        self.io.clients.insert(req, reply);
        let client = self.io.client;
        self.dispatch(Input::Message {
            from: client,
            msg: Msg::Submit {
                req,
                tenant,
                prompt,
                max_new_tokens,
            },
        });
    }

    /// The client of `req` went away (router): traced, and cancelled at the router as
    /// from the client.
    fn cancel(&mut self, req: RequestId) {
        if self.io.clients.remove(&req).is_none() {
            return;
        }
        self.io.trace(|| Record::ClientCancel {
            req,
            how: CancelHow::Disconnect,
            plan: "the client closed its connection".into(),
        });
        let client = self.io.client;
        self.dispatch(Input::Message {
            from: client,
            msg: Msg::Cancel { req },
        });
    }

    /// A landing the transfer thread finished on a dead incarnation's record (its
    /// pages' tags are of an earlier epoch, which the arrival rule admits only for that
    /// incarnation) is a write to the dead incarnation: it fails back to its writer, as
    /// a write in flight to a crashed node does in every driver
    /// ([`world::crash_fate`]).
    fn of_this_incarnation(&self, ev: NodeEvent<G::Kv>) -> NodeEvent<G::Kv> {
        let epoch = self.io.epoch;
        match ev {
            NodeEvent::Landed { from, id, dst, .. }
                if dst.iter().any(|t| t.gen.epoch() != epoch) =>
            {
                NodeEvent::WriteFailedHere {
                    from,
                    id,
                    reason: WriteFailure::ReceiverGone,
                    completion: Msg::WriteDone { id, ok: false },
                }
            }
            ev => ev,
        }
    }

    /// Handle one event; `false` to stop.
    pub fn handle(&mut self, ev: NodeEvent<G::Kv>) -> bool {
        let ev = self.of_this_incarnation(ev);
        match ev {
            NodeEvent::Msg { from, msg } => self.on_msg(from, msg),
            NodeEvent::FailedBack { from, msg } => self.dispatch(Input::Message { from, msg }),
            NodeEvent::Write { from, write } => self.receive(from, write),
            NodeEvent::Landed {
                from,
                id,
                dst,
                landing,
            } => self.dispatch(Input::Landed {
                from,
                id,
                dst,
                landing,
            }),
            NodeEvent::WriteFailedHere {
                from,
                id,
                reason,
                completion,
            } => self.io.failed_here(from, id, reason, completion),
            NodeEvent::TransferDone { to, id, dst } => {
                self.io.landed_at(to, id, dst);
                self.on_msg(to, Msg::WriteDone { id, ok: true });
            }
            NodeEvent::TransferFailed { to, id } => self.io.transfer_failed(to, id),
            NodeEvent::SendFailed { to, msg } => self.io.undeliverable(to, msg),
            NodeEvent::PeerLost { peer } => self.io.peer_lost(peer),
            NodeEvent::Submit {
                req,
                tenant,
                prompt,
                max_new_tokens,
                reply,
            } => self.submit(req, tenant, prompt, max_new_tokens, reply),
            NodeEvent::Cancel { req } => self.cancel(req),
            NodeEvent::StartHalf {
                room,
                msg,
                max_new_tokens,
                reply,
                refused,
                prefill_epoch,
            } => self.start_half(room, msg, max_new_tokens, reply, (refused, prefill_epoch)),
            NodeEvent::AbortHalf { room } => self.abort_half(room),
            NodeEvent::FrontPeer { from, msg } => self.front_peer(from, msg),
            NodeEvent::FrontLink(tx) => self.io.front_out = Some(tx),
            NodeEvent::Status(tx) => {
                let _ = tx.send(self.status());
            }
            NodeEvent::CloseIntake => self.intake_open = false,
            NodeEvent::Stop { outcome, detail } => {
                self.io.trace(|| Record::End { outcome, detail });
                return false;
            }
        }
        true
    }
}
