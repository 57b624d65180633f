//! Everything of a node's loop but the node ([`Io`]): what carries out the node's
//! effects (its sends, timers and events, as [`Driver`]) over the loop's runtime, the
//! KV writes in flight, the clients waiting for answers, and the world's rule for a
//! message that cannot be delivered. Not the loop's turns (`NodeLoop`) and not worker
//! mode's halves (their methods are in `halves`), though `Io` holds their front.

use crate::clock::TimerHeap;
use crate::node::event::NodeEvent;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::node::status::NodeCounts;
use crate::seam::NodeRuntime;
use kvsim_engine::env::TimerOp;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, Token, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::worker::WorkerFront;
use kvsim_engine::world::{
    self, Arrival, Arriving, Driver, KvTransport, WriteFailure, WritesInFlight,
};
use kvsim_oracle::schema::{MsgView, Record};
use std::collections::BTreeMap;

/// Everything of a loop but the node: what carries out the node's effects, over the
/// loop's runtime `R`.
pub struct Io<R: NodeRuntime> {
    pub id: NodeId,
    pub epoch: u32,
    pub client: NodeId,
    /// The loop's inputs and outputs (its clock, its links, its trace).
    pub rt: R,
    pub timers: TimerHeap,
    /// KV writes posted to each peer and not completed yet.
    pub(super) writes: WritesInFlight,
    pub(super) clients: BTreeMap<RequestId, ReplySink>,
    /// Worker mode: SGLang's worker front before the node (the engine's
    /// [`WorkerFront`]), whose router's messages are its halves' answers.
    pub front: Option<WorkerFront>,
    /// Worker mode: where each started half's answers go.
    pub(super) sinks: BTreeMap<RoomKey, ReplySink>,
    /// Worker mode: the worker API's carrier of the front's messages to the other
    /// half's front (`NodeEvent::FrontLink`).
    pub(super) front_out: Option<crate::sync::mpsc::Sender<(NodeId, Msg)>>,
    pub(super) fault: Option<String>,
    /// The node asked to be restarted (a fault whose action is a restart).
    pub(super) restart_asked: bool,
    pub(super) counts: NodeCounts,
}

impl<K: Clone, R: NodeRuntime<Kv = K>> Io<R> {
    pub fn new(id: NodeId, epoch: u32, client: NodeId, rt: R) -> Self {
        Io {
            id,
            epoch,
            client,
            rt,
            timers: TimerHeap::new(),
            writes: WritesInFlight::new(),
            clients: BTreeMap::new(),
            front: None,
            sinks: BTreeMap::new(),
            front_out: None,
            fault: None,
            restart_asked: false,
            counts: NodeCounts::default(),
        }
    }

    pub(super) fn trace(&mut self, rec: impl FnOnce() -> Record) {
        if self.rt.tracing() {
            self.rt.trace(rec());
        }
    }

    /// A message could not reach `to`: the world's rule for a receiver that is gone
    /// (a KV write fails back with its one failed completion; anything else is lost).
    pub(super) fn undeliverable(&mut self, to: NodeId, msg: Carried<K>) {
        let at = Arriving {
            sender_alive: true,
            receiver_alive: false,
            receiver_restarted: false,
            receiver_epoch: 0,
            partitioned: false,
            injected_failure: false,
            // The receiver is gone: no transport lands this, whatever its row.
            transport: KvTransport::default(),
        };
        match world::arrival(&msg, &at) {
            Arrival::Fail { reason, completion } => match msg.write_id() {
                // An RDMA READ request is no write of this node's in flight: its one
                // failed completion is its poster's own, at once.
                Some(id) if matches!(msg, Carried::Msg(Msg::KvRead { .. })) => {
                    self.failed_back(to, id, reason, completion)
                }
                Some(id) => self.fail_back(to, id, reason, completion),
                None => {}
            },
            Arrival::Drop(reason) => {
                let from = self.id;
                self.trace(|| Record::Drop {
                    from,
                    to,
                    msg: MsgView::of(&msg),
                    reason,
                });
            }
            Arrival::Deliver => {}
        }
    }

    /// A write this node posted to `to` failed: trace it and deliver its one failed
    /// completion to this node (once: a write no longer in flight is not failed twice).
    fn fail_back(&mut self, to: NodeId, id: WriteId, reason: WriteFailure, completion: Msg) {
        if self.writes.fail(to, id) {
            self.failed_back(to, id, reason, completion);
        }
    }

    /// Trace the failure of a write taken out of flight, and deliver its one failed
    /// completion to this node.
    fn failed_back(&mut self, to: NodeId, id: WriteId, reason: WriteFailure, completion: Msg) {
        debug_assert!(
            matches!(completion, Msg::WriteDone { id: c, ok: false } if c == id),
            "a failed write's completion is its own, failed"
        );
        let from = self.id;
        self.trace(|| Record::WriteFailed {
            from,
            to,
            write: id,
            reason,
        });
        self.rt.to_self(NodeEvent::FailedBack {
            from: to,
            msg: completion,
        });
    }

    /// The transfer thread failed a KV write of `from` on arrival: traced, and its one
    /// failed completion goes back on the writer's link (lost with the link).
    pub(super) fn failed_here(
        &mut self,
        from: NodeId,
        id: WriteId,
        reason: WriteFailure,
        completion: Msg,
    ) {
        let me = self.id;
        self.trace(|| Record::WriteFailed {
            from,
            to: me,
            write: id,
            reason,
        });
        let _ = self.rt.send(from, Carried::Msg(completion));
    }

    /// `msg` leaves the node on the link to `to`. Write-ahead: the node's events reach
    /// the file (the kernel's, which a killed process does not lose) before a message
    /// they caused leaves the node, so no other node's trace can show an effect whose
    /// cause this trace lost.
    fn leave(&mut self, to: NodeId, msg: Carried<K>) {
        self.rt.flush_trace();
        if let Err(msg) = self.rt.send(to, msg) {
            self.undeliverable(to, msg);
        }
    }

    /// A write this node posted landed in `to`'s registered memory with no code of
    /// `to` running (`--transport nixl`): the world's record of it, as
    /// `world::receive` states a one-sided landing, written when the library reports
    /// the transfer done (the first moment anyone knows the bytes are placed; `to`
    /// learns of it later, from the write's notification, or not at all). Recorded
    /// even for a write already failed back: its bytes landed all the same.
    pub(super) fn landed_at(&mut self, to: NodeId, id: WriteId, dst: Vec<PageTag>) {
        self.trace(|| {
            Record::Engine(TraceEvent::KvLanded {
                node: to,
                write: id,
                dst,
            })
        });
    }

    /// The transfer of a write this node posted to `to` ended in an error: its one
    /// failed completion, unless it already had one.
    pub(super) fn transfer_failed(&mut self, to: NodeId, id: WriteId) {
        let done = Msg::WriteDone { id, ok: false };
        self.fail_back(to, id, WriteFailure::ReceiverGone, done);
    }

    /// The connection to `peer` broke: every write posted on it fails back.
    pub(super) fn peer_lost(&mut self, peer: NodeId) {
        for id in self.writes.peer_lost(peer) {
            let done = Msg::WriteDone { id, ok: false };
            self.failed_back(peer, id, WriteFailure::ReceiverGone, done);
        }
    }
}

impl<K: Clone, R: NodeRuntime<Kv = K>> Driver<Msg, TraceEvent, KvWrite<K>> for Io<R> {
    /// A KV write leaves on the link to `to`, in flight until its one completion.
    fn write(&mut self, _from: NodeId, to: NodeId, write: KvWrite<K>) {
        // An RDMA READ's response, served here for its reader, is the reader's to
        // complete (`world::serve_read`): not a write of this node's in flight.
        if !world::is_read_response(to, write.id) {
            self.writes.post(to, &write);
        }
        self.leave(to, Carried::Write(write));
    }

    fn send(&mut self, _from: NodeId, to: NodeId, msg: Msg) {
        if self.front.as_ref().is_some_and(|f| f.router() == to) {
            self.for_half(msg);
            return;
        }
        if to == self.id {
            // The node's own NIC reporting to it (an RDMA READ's completion at its
            // reader, `world::receive`): back into its own loop.
            self.rt.to_self(NodeEvent::Msg { from: to, msg });
            return;
        }
        if to == self.client {
            if let Msg::Response {
                req,
                status,
                tokens,
                why,
            } = msg
            {
                self.trace(|| Record::Response {
                    req,
                    status,
                    tokens: tokens.clone(),
                });
                if let Some(mut c) = self.clients.remove(&req) {
                    c.send(ReplyEv::Done(Reply {
                        req: req.0,
                        status: status.0,
                        tokens,
                        reason: why.map(|w| w.to_string()),
                        why,
                    }));
                }
            }
            return;
        }
        self.leave(to, Carried::Msg(msg));
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        let now = self.rt.now_ns();
        self.timers.apply(node, op, now);
    }

    fn event(&mut self, node: NodeId, ev: TraceEvent) {
        match &ev {
            TraceEvent::TagMismatch { .. } => self.counts.tag_mismatches += 1,
            TraceEvent::KvRefused { .. } => self.counts.kv_refused += 1,
            TraceEvent::WriteCompleted { ok: false, .. } => self.counts.transfers_failed += 1,
            _ => {}
        }
        if let TraceEvent::Fault { fault, .. } = &ev {
            let what = match fault.action() {
                FaultAction::Stop => "STOPPED ITSELF",
                FaultAction::Restart => "RESTARTS in process with a new epoch",
                FaultAction::Report => "reports",
            };
            eprintln!("kvsim serve: node {node} {what}: {fault}");
            if fault.action() != FaultAction::Report {
                self.fault = Some(fault.to_string());
            }
            self.restart_asked |= fault.action() == FaultAction::Restart;
        }
        self.trace(|| Record::Engine(ev));
    }

    /// The router streams a token it took: to the client's reply, as it is made
    /// (nothing for a client already answered: the router emits none then).
    fn stream(&mut self, _node: NodeId, _to: NodeId, req: RequestId, index: u32, token: Token) {
        if let Some(c) = self.clients.get_mut(&req) {
            c.send(ReplyEv::Token { index, token });
        }
    }
}
