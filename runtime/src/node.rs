//! One node's event loop, and the decode node's transfer thread.
//!
//! The loop owns the node (an unchanged engine state machine), its timers, its trace
//! and its links to peers. It takes one [`Ev`] at a time from its channel (a message
//! read off a connection, a fired timer, a landing reported by the transfer thread, a
//! send that failed, a client's request) and feeds the node one input, then carries
//! out the node's effects in the order issued through [`kvsim_engine::world::apply`].
//! What a failed send means (a KV write fails back with one failed completion, any
//! other message is lost) is [`kvsim_engine::world::arrival`]'s rule, as in every
//! driver.
//!
//! A decode node's KV writes do not pass through its loop: the transfer thread lands
//! them with [`kvsim_engine::kv::land`], gated by the node's one ownership record
//! (the [`SharedPool`] its loop decides with), concurrently with the loop, and reports
//! each landing to the loop, where the node traces it and completes the write.

use crate::clock::{wall_ns, Clock, TimerHeap};
use crate::gpu::SharedGpu;
use crate::trace::Tracer;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Input, Outbox, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, TenantId, WriteId};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::{land, PageRecords, Refusal, SharedRecord};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::Role;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::{self, Arrival, Arriving, Driver, WriteFailure};
use kvsim_oracle::schema::{CancelHow, EndOutcome, MsgView, Record};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reply {
    pub req: u64,
    pub status: u16,
    pub tokens: Vec<u32>,
}

/// What one node reports about itself.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub node: NodeId,
    pub role: Role,
    pub epoch: u32,
    /// Free pages and pool size (prefill and decode nodes).
    pub free_pages: Option<usize>,
    pub pool_pages: Option<usize>,
    /// Live rooms (router), requests and quarantined rooms (prefill, decode).
    pub live: usize,
    pub quarantined: usize,
    /// Pages those quarantined rooms hold (decode).
    pub quarantined_pages: usize,
    /// Set when the node stopped itself or asked to be restarted.
    pub fault: Option<String>,
    /// Counts of this node's refusals and failures since it started.
    pub counts: NodeCounts,
}

/// What a node's own events counted (the HTTP front's `/metrics`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct NodeCounts {
    /// Decode reads refused because a page's tag did not match (defense 4).
    pub tag_mismatches: u64,
    /// KV writes the receiver refused.
    pub kv_refused: u64,
    /// KV writes whose completion said they failed (the writer's side).
    pub transfers_failed: u64,
}

impl NodeStatus {
    /// Nothing in flight and, for a pool, every page free.
    pub fn quiescent(&self) -> bool {
        self.live == 0 && self.quarantined == 0 && self.free_pages == self.pool_pages
    }
}

/// One thing for a node's loop to do.
#[derive(Debug)]
pub enum Ev<K> {
    /// A message read off a connection.
    Msg {
        from: NodeId,
        msg: Msg<K>,
    },
    /// The transfer thread landed (or refused) a KV write of `from`.
    Landed {
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
    },
    /// The transfer thread failed a KV write on arrival (the world's rule).
    WriteFailedHere {
        from: NodeId,
        id: WriteId,
        reason: WriteFailure,
        completion: Msg<K>,
    },
    /// The failed completion of a KV write this node posted (already taken out of
    /// the writes in flight): delivered to the node as from the write's receiver.
    FailedBack {
        from: NodeId,
        msg: Msg<K>,
    },
    /// A message to `to` could not be written (no connection).
    SendFailed {
        to: NodeId,
        msg: Msg<K>,
    },
    /// The connection to `peer` broke: KV writes posted on it fail back.
    PeerLost {
        peer: NodeId,
    },
    /// A client request (router only).
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: u64,
        max_new_tokens: u32,
        reply: Sender<Reply>,
    },
    /// The client of `req` went away.
    Cancel {
        req: RequestId,
    },
    Status(Sender<NodeStatus>),
    /// Stop taking client requests (router).
    CloseIntake,
    /// Write the trace's end and stop the loop.
    Stop {
        outcome: EndOutcome,
        detail: String,
    },
}

/// The node a loop runs: the engine's state machines, unchanged; the decode node
/// decides with the shared record its transfer thread gates writes with.
pub enum RtNode<G: Gpu> {
    Router(Router),
    Prefill(PrefillNode<G>),
    Decode(DecodeNode<SharedGpu<G>, SharedRecord>),
}

impl<G: Gpu> RtNode<G> {
    fn handle(&mut self, input: Input<G::Kv>, env: &mut Outbox<G::Kv>) {
        match self {
            RtNode::Router(n) => n.handle(input, env),
            RtNode::Prefill(n) => n.handle(input, env),
            RtNode::Decode(n) => n.handle(input, env),
        }
    }

    fn role(&self) -> Role {
        match self {
            RtNode::Router(_) => Role::Router,
            RtNode::Prefill(_) => Role::Prefill,
            RtNode::Decode(_) => Role::Decode,
        }
    }
}

/// Everything of a loop but the node: what carries out the node's effects.
pub struct Io<K> {
    pub id: NodeId,
    pub epoch: u32,
    pub client: NodeId,
    pub clock: Clock,
    pub timers: TimerHeap,
    pub tracer: Option<Tracer>,
    /// The queue of the connection to each peer.
    pub peers: BTreeMap<NodeId, Sender<Msg<K>>>,
    /// This loop's own channel (completions that fail back are delivered through it).
    pub me: Sender<Ev<K>>,
    /// KV writes posted to each peer and not completed yet.
    inflight: BTreeMap<NodeId, BTreeSet<WriteId>>,
    clients: BTreeMap<RequestId, Sender<Reply>>,
    fault: Option<String>,
    counts: NodeCounts,
}

impl<K: Clone> Io<K> {
    pub fn new(
        id: NodeId,
        epoch: u32,
        client: NodeId,
        tracer: Option<Tracer>,
        peers: BTreeMap<NodeId, Sender<Msg<K>>>,
        me: Sender<Ev<K>>,
    ) -> Self {
        Io {
            id,
            epoch,
            client,
            clock: Clock::default(),
            timers: TimerHeap::new(),
            tracer,
            peers,
            me,
            inflight: BTreeMap::new(),
            clients: BTreeMap::new(),
            fault: None,
            counts: NodeCounts::default(),
        }
    }

    fn trace(&mut self, rec: impl FnOnce() -> Record) {
        if let Some(t) = &mut self.tracer {
            t.write(rec());
        }
    }

    /// A message could not reach `to`: the world's rule for a receiver that is gone
    /// (a KV write fails back with its one failed completion; anything else is lost).
    fn undeliverable(&mut self, to: NodeId, msg: Msg<K>) {
        let at = Arriving {
            sender_alive: true,
            receiver_alive: false,
            receiver_restarted: false,
            receiver_epoch: 0,
            partitioned: false,
            injected_failure: false,
        };
        match world::arrival(&msg, &at) {
            Arrival::Fail { reason, completion } => {
                if let Some(id) = msg.write_id() {
                    self.fail_back(to, id, reason, completion);
                }
            }
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
    fn fail_back(&mut self, to: NodeId, id: WriteId, reason: WriteFailure, completion: Msg<K>) {
        if !self.inflight.get_mut(&to).is_some_and(|s| s.remove(&id)) {
            return;
        }
        let from = self.id;
        self.trace(|| Record::WriteFailed {
            from,
            to,
            write: id,
            reason,
        });
        let _ = self.me.send(Ev::FailedBack {
            from: to,
            msg: completion,
        });
    }

    fn peer_lost(&mut self, peer: NodeId) {
        let ids: Vec<WriteId> = self
            .inflight
            .get(&peer)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in ids {
            let done = Msg::WriteDone { id, ok: false };
            self.fail_back(peer, id, WriteFailure::ReceiverGone, done);
        }
    }
}

impl<K: Clone> Driver<Msg<K>> for Io<K> {
    fn send(&mut self, _from: NodeId, to: NodeId, msg: Msg<K>) {
        if to == self.client {
            if let Msg::Response {
                req,
                status,
                tokens,
            } = msg
            {
                self.trace(|| Record::Response {
                    req,
                    status,
                    tokens: tokens.clone(),
                });
                if let Some(c) = self.clients.remove(&req) {
                    let _ = c.send(Reply {
                        req: req.0,
                        status: status.0,
                        tokens,
                    });
                }
            }
            return;
        }
        if let Msg::KvWrite { id, .. } = &msg {
            self.inflight.entry(to).or_default().insert(*id);
        }
        // Write-ahead: the node's events reach the file (the kernel's, which a killed
        // process does not lose) before a message they caused leaves the node, so no
        // other node's trace can show an effect whose cause this trace lost.
        if let Some(t) = &mut self.tracer {
            t.flush();
        }
        let undelivered = match self.peers.get(&to) {
            Some(link) => link.send(msg).err().map(|e| e.0),
            None => Some(msg),
        };
        if let Some(msg) = undelivered {
            self.undeliverable(to, msg);
        }
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        let now = self.clock.now_ns();
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
                FaultAction::Restart => "ASKS TO BE RESTARTED with a new epoch",
                FaultAction::Report => "reports",
            };
            eprintln!("kvsim serve: node {node} {what}: {fault}");
            if fault.action() != FaultAction::Report {
                self.fault = Some(fault.to_string());
            }
        }
        self.trace(|| Record::Engine(ev));
    }
}

/// A node's loop: the node and its [`Io`].
pub struct NodeLoop<G: Gpu> {
    pub node: RtNode<G>,
    pub io: Io<G::Kv>,
    pub rx: Receiver<Ev<G::Kv>>,
    outbox: Outbox<G::Kv>,
    intake_open: bool,
}

impl<G: Gpu> NodeLoop<G> {
    pub fn new(node: RtNode<G>, io: Io<G::Kv>, rx: Receiver<Ev<G::Kv>>) -> Self {
        NodeLoop {
            node,
            io,
            rx,
            outbox: Outbox::new(0),
            intake_open: true,
        }
    }

    fn dispatch(&mut self, input: Input<G::Kv>) {
        self.outbox.reset(self.io.clock.now_ns());
        self.node.handle(input, &mut self.outbox);
        let mut effects = std::mem::take(&mut self.outbox.effects);
        world::apply(self.io.id, effects.drain(..), &mut self.io);
        self.outbox.effects = effects;
    }

    fn status(&self) -> NodeStatus {
        let (free, cap, live, quarantined, quarantined_pages) = match &self.node {
            RtNode::Router(r) => (None, None, r.live_rooms(), 0, 0),
            RtNode::Prefill(p) => (
                Some(p.pool().free_count()),
                Some(p.pool().capacity()),
                p.requests(),
                0,
                0,
            ),
            RtNode::Decode(d) => (
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

    /// Run until [`Ev::Stop`] (or every sender is gone).
    pub fn run(mut self) {
        let id = self.io.id;
        loop {
            let now = self.io.clock.now_ns();
            if let Some(timer) = self.io.timers.due(id, now) {
                self.dispatch(Input::Timer(timer));
                continue;
            }
            let wait = self
                .io
                .timers
                .wait(id, now)
                .unwrap_or(Duration::from_millis(200));
            let ev = match self.rx.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    // Idle: the trace reaches the file before the loop waits, so a
                    // node killed while idle leaves a complete trace.
                    if let Some(t) = &mut self.io.tracer {
                        t.flush();
                    }
                    match self.rx.recv_timeout(wait) {
                        Ok(ev) => ev,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            if !self.handle(ev) {
                break;
            }
        }
        if let Some(t) = &mut self.io.tracer {
            t.flush();
        }
    }

    /// Handle one event; `false` to stop.
    fn handle(&mut self, ev: Ev<G::Kv>) -> bool {
        match ev {
            Ev::Msg { from, msg } => {
                if let Msg::WriteDone { id, .. } = &msg {
                    // Exactly one completion per write: one already failed back (its
                    // connection broke) is not completed again.
                    let posted = self
                        .io
                        .inflight
                        .get_mut(&from)
                        .is_some_and(|s| s.remove(id));
                    if !posted {
                        return true;
                    }
                }
                self.dispatch(Input::Message { from, msg });
            }
            Ev::FailedBack { from, msg } => self.dispatch(Input::Message { from, msg }),
            Ev::Landed {
                from,
                id,
                dst,
                landing,
            } => {
                if let RtNode::Decode(d) = &mut self.node {
                    self.outbox.reset(self.io.clock.now_ns());
                    d.landed(from, id, dst, landing, &mut self.outbox);
                    let mut effects = std::mem::take(&mut self.outbox.effects);
                    world::apply(self.io.id, effects.drain(..), &mut self.io);
                    self.outbox.effects = effects;
                }
            }
            Ev::WriteFailedHere {
                from,
                id,
                reason,
                completion,
            } => {
                let me = self.io.id;
                self.io.trace(|| Record::WriteFailed {
                    from,
                    to: me,
                    write: id,
                    reason,
                });
                if let Some(link) = self.io.peers.get(&from) {
                    let _ = link.send(completion);
                }
            }
            Ev::SendFailed { to, msg } => self.io.undeliverable(to, msg),
            Ev::PeerLost { peer } => self.io.peer_lost(peer),
            Ev::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
                reply,
            } => {
                if !self.intake_open {
                    let _ = reply.send(Reply {
                        req: req.0,
                        status: Status::UNAVAILABLE.0,
                        tokens: Vec::new(),
                    });
                    return true;
                }
                self.io.trace(|| Record::Submit {
                    req,
                    tenant,
                    prompt_len,
                    max_new_tokens,
                });
                self.io.clients.insert(req, reply);
                let client = self.io.client;
                let prompt = kvsim_oracle::canary::prompt(req, prompt_len);
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
            Ev::Cancel { req } => {
                if self.io.clients.remove(&req).is_some() {
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
            }
            Ev::Status(tx) => {
                let _ = tx.send(self.status());
            }
            Ev::CloseIntake => self.intake_open = false,
            Ev::Stop { outcome, detail } => {
                self.io.trace(|| Record::End { outcome, detail });
                return false;
            }
        }
        true
    }
}

/// The decode node's transfer thread: every KV write that arrives for this node is
/// judged by the world's arrival rule (a tag of an earlier incarnation fails; a write
/// whose connection closed before it was taken is flushed), then
/// landed by the engine's [`land`] on the node's shared record and memory, and reported
/// to the node's loop. A write whose id names another writer than its sender goes to
/// the loop as a message, where the node refuses it by peer identity.
#[allow(clippy::too_many_arguments)]
pub fn transfer_thread<G: Gpu>(
    epoch: u32,
    rx: Receiver<crate::net::Incoming<G::Kv>>,
    pool: Arc<SharedPool>,
    mut gpu: SharedGpu<G>,
    page_tags: bool,
    to_loop: Sender<Ev<G::Kv>>,
) {
    for (from, msg, conn_alive) in rx {
        let writer_ok = matches!(&msg, Msg::KvWrite { id, .. } if id.writer == from);
        if !writer_ok {
            let _ = to_loop.send(Ev::Msg { from, msg });
            continue;
        }
        let at = Arriving {
            // A write still queued when its connection closed is the dead sender's NIC
            // queue (or one its live sender fails back itself): never applied.
            sender_alive: conn_alive.load(std::sync::atomic::Ordering::Acquire),
            receiver_alive: true,
            receiver_restarted: false,
            receiver_epoch: epoch,
            partitioned: false,
            injected_failure: false,
        };
        let ev = match world::arrival(&msg, &at) {
            Arrival::Fail { reason, completion } => match msg.write_id() {
                Some(id) => Ev::WriteFailedHere {
                    from,
                    id,
                    reason,
                    completion,
                },
                None => continue,
            },
            Arrival::Drop(_) => continue,
            Arrival::Deliver => match msg {
                Msg::KvWrite { id, dst, kv, .. } => {
                    let landing = land(&*pool, &mut gpu, page_tags, id.room, &dst, &kv);
                    Ev::Landed {
                        from,
                        id,
                        dst,
                        landing,
                    }
                }
                _ => continue,
            },
        };
        if to_loop.send(ev).is_err() {
            return;
        }
    }
}

/// Wall-clock time, re-exported for the server's reports.
pub fn now_wall_ns() -> u64 {
    wall_ns()
}
