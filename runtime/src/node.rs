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
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
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

/// A worker-mode half: where its answers go, its tokens so far, the engine's reason
/// for its failure (from its node's own events).
struct Half {
    sink: ReplySink,
    tokens: Vec<Token>,
    reason: Option<String>,
}

/// Most early prefill-done words a decode worker keeps.
const EARLY_DONE: usize = 4096;

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reply {
    pub req: u64,
    pub status: u16,
    pub tokens: Vec<u32>,
    /// The engine's reason for a status that is not 200, where it gave one: through
    /// the engine's router, the typed reason the refusing node sent with its status
    /// (`msg::Why`, carried by the router's `Response`); in worker mode, where the node
    /// that refused is the one answering, the text of its own refusal or failure event
    /// (the same words for a refusal at intake, more detail for a failed transfer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a client's request hears from the router's loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyEv {
    /// A token decode produced (index `index` of the reply), as it was produced.
    Token { index: u32, token: u32 },
    /// The request's one terminal answer.
    Done(Reply),
}

/// Where a request's answers go: called with each [`ReplyEv`]; it returns `false` once
/// its client is gone.
pub struct ReplySink(Box<dyn FnMut(ReplyEv) -> bool + Send>);

impl ReplySink {
    pub fn new(f: impl FnMut(ReplyEv) -> bool + Send + 'static) -> Self {
        ReplySink(Box::new(f))
    }

    /// Answers go to a std channel (its receiver gets each [`ReplyEv`]).
    pub fn channel(tx: Sender<ReplyEv>) -> Self {
        ReplySink::new(move |ev| tx.send(ev).is_ok())
    }

    pub fn send(&mut self, ev: ReplyEv) -> bool {
        (self.0)(ev)
    }
}

impl std::fmt::Debug for ReplySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySink")
    }
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
        /// The prompt's token ids, as the front made them.
        prompt: Vec<Token>,
        max_new_tokens: u32,
        reply: ReplySink,
    },
    /// The client of `req` went away.
    Cancel {
        req: RequestId,
    },
    /// A worker front starts a half (`msg` is its `PrefillStart` or `DecodeStart`,
    /// delivered as from the router, whose part the worker front plays): the half's
    /// answers (its tokens, its finish) go to `reply`.
    StartHalf {
        room: RoomKey,
        msg: Msg<K>,
        /// The reply length the request asked for (for the trace's `routed` record).
        max_new_tokens: u32,
        reply: ReplySink,
    },
    /// The worker front's client of `room` went away: the half is aborted, as the
    /// router aborts it.
    AbortHalf {
        room: RoomKey,
    },
    /// Worker mode, decode: the prefill half of `room` is terminal (prefill's worker
    /// said so). Once decode's half is too, the room is cleared (traced as the engine
    /// router traces it, for the audit).
    PeerHalfDone {
        room: RoomKey,
        status: Status,
        /// Prefill's reason, when its half failed.
        reason: Option<String>,
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
    clients: BTreeMap<RequestId, ReplySink>,
    /// Worker mode: the router's id, whose messages go to the worker front's halves.
    pub worker_router: Option<NodeId>,
    /// Worker mode: a failed prefill half ends its decode half with prefill's status
    /// (the router's cancel-both, defense 6: `router_cancels_both`).
    pub worker_cancels_both: bool,
    /// Worker mode: each started half's answers, and (decode) its tokens so far.
    halves: BTreeMap<RoomKey, Half>,
    /// Worker mode, decode: which halves of each room are terminal (1: decode's, 2:
    /// prefill's); both: the room is cleared.
    clearing: BTreeMap<RoomKey, u8>,
    /// Worker mode, decode: prefill's word that a room's half is done, come before
    /// decode's half started (at most [`EARLY_DONE`], the oldest dropped).
    early_done: std::collections::VecDeque<(RoomKey, Status, Option<String>)>,
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
            worker_router: None,
            worker_cancels_both: false,
            halves: BTreeMap::new(),
            clearing: BTreeMap::new(),
            early_done: std::collections::VecDeque::new(),
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

impl<K: Clone> Io<K> {
    /// A half's message to the router, in worker mode: to the worker front's half. A
    /// decode half's finish is the client's answer (SGLang's router returns decode's):
    /// traced as the engine router traces its response, so the audit closes the room.
    fn for_half(&mut self, msg: Msg<K>) {
        match msg {
            Msg::TokenOut { room, index, token } => {
                if let Some(h) = self.halves.get_mut(&room) {
                    if index as usize == h.tokens.len() {
                        h.tokens.push(token);
                    }
                    h.sink.send(ReplyEv::Token { index, token });
                }
            }
            Msg::PrefillFinished { room, status, .. } => {
                if let Some(mut h) = self.halves.remove(&room) {
                    h.sink.send(ReplyEv::Done(Reply {
                        req: room.gen.0,
                        status: status.0,
                        tokens: Vec::new(),
                        reason: h.reason,
                    }));
                }
            }
            Msg::DecodeFinished { room, status, .. } => {
                self.half_done(room, 1);
                if let Some(mut h) = self.halves.remove(&room) {
                    self.answered(room, status, h.tokens.clone());
                    h.sink.send(ReplyEv::Done(Reply {
                        req: room.gen.0,
                        status: status.0,
                        tokens: h.tokens,
                        reason: h.reason,
                    }));
                }
            }
            _ => {}
        }
    }

    /// A half of a worker-mode decode room is terminal (`bit` 1: decode's, 2:
    /// prefill's): with both, the room is cleared.
    fn half_done(&mut self, room: RoomKey, bit: u8) {
        let Some(node) = self.worker_router else {
            return;
        };
        let Some(done) = self.clearing.get_mut(&room) else {
            return;
        };
        *done |= bit;
        if *done == 3 {
            self.clearing.remove(&room);
            self.trace(|| Record::Engine(TraceEvent::RoomCleared { node, room }));
        }
    }

    /// Trace the answer a worker-mode decode half gave its client.
    fn answered(&mut self, room: RoomKey, status: Status, tokens: Vec<Token>) {
        let Some(node) = self.worker_router else {
            return;
        };
        self.trace(|| {
            Record::Engine(TraceEvent::RouterResponse {
                node,
                req: RequestId(room.gen.0),
                room: Some(room),
                status,
                tokens,
            })
        });
    }
}

impl<K: Clone> Driver<Msg<K>> for Io<K> {
    fn send(&mut self, _from: NodeId, to: NodeId, msg: Msg<K>) {
        if self.worker_router == Some(to) {
            self.for_half(msg);
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
                    }));
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
        let why = match &ev {
            TraceEvent::Rejected { room, reason, .. }
            | TraceEvent::TransferRefused { room, reason, .. }
            | TraceEvent::TransferFailed { room, reason, .. } => Some((*room, reason)),
            _ => None,
        };
        if let Some(h) = why.and_then(|(room, _)| self.halves.get_mut(&room)) {
            h.reason = why.map(|(_, r)| r.clone());
        }
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

    /// A token decode produced, to its client's stream as it is made: only a token the
    /// router took (from the room's own decode node, for a room not yet answered, now
    /// held at its index) is passed on, read from the router's state after it handled
    /// the message; the terminal answer still comes from the router alone.
    fn stream_token(&mut self, from: NodeId, room: RoomKey, index: u32, token: Token) {
        let RtNode::Router(r) = &self.node else {
            return;
        };
        let Some(st) = r.room_state(room) else {
            return;
        };
        let held = st.tokens.get(index as usize).copied().flatten() == Some(token);
        if st.decode != from || st.answered || !held {
            return;
        }
        if let Some(c) = self.io.clients.get_mut(&st.req) {
            c.send(ReplyEv::Token { index, token });
        }
    }

    /// Worker mode, decode: prefill's half of `room` is terminal with `status`. The room
    /// clears once decode's half is too; a failed prefill half ends decode's half with
    /// prefill's status (the client hears prefill's error, as the router's first-error
    /// answer, and decode's half is aborted, as the router aborts it) where the
    /// router's cancel-both defense is on.
    fn prefill_done(&mut self, room: RoomKey, status: Status, reason: Option<String>) {
        self.io.half_done(room, 2);
        let Some(router) = self.io.worker_router else {
            return;
        };
        if !self.io.worker_cancels_both || status.is_ok() {
            return;
        }
        let Some(mut h) = self.io.halves.remove(&room) else {
            return;
        };
        self.io.answered(room, status, Vec::new());
        h.sink.send(ReplyEv::Done(Reply {
            req: room.gen.0,
            status: status.0,
            tokens: Vec::new(),
            reason: reason.map(|r| format!("prefill: {r}")),
        }));
        self.dispatch(Input::Message {
            from: router,
            msg: Msg::Abort { room },
        });
    }

    /// A message read off a connection.
    fn on_msg(&mut self, from: NodeId, msg: Msg<G::Kv>) {
        if let Msg::WriteDone { id, .. } = &msg {
            // Exactly one completion per write: one already failed back (its connection
            // broke) is not completed again.
            let posted = self
                .io
                .inflight
                .get_mut(&from)
                .is_some_and(|s| s.remove(id));
            if !posted {
                return;
            }
        }
        let token = match (&self.node, &msg) {
            (RtNode::Router(_), Msg::TokenOut { room, index, token }) => {
                Some((*room, *index, *token))
            }
            _ => None,
        };
        self.dispatch(Input::Message { from, msg });
        if let Some((room, index, token)) = token {
            self.stream_token(from, room, index, token);
        }
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

    /// Worker mode, decode: prefill's word that its half of `room` is done (kept for a
    /// moment when decode's half has not started yet).
    fn peer_half_done(&mut self, room: RoomKey, status: Status, reason: Option<String>) {
        if !self.io.clearing.contains_key(&room) {
            if self.io.early_done.len() >= EARLY_DONE {
                self.io.early_done.pop_front();
            }
            self.io.early_done.push_back((room, status, reason));
            return;
        }
        self.prefill_done(room, status, reason);
    }

    /// Worker mode: start a half the worker front was given (`Ev::StartHalf`).
    fn start_half(
        &mut self,
        room: RoomKey,
        msg: Msg<G::Kv>,
        max_new_tokens: u32,
        mut reply: ReplySink,
    ) {
        let Some(router) = self.io.worker_router.filter(|_| self.intake_open) else {
            reply.send(ReplyEv::Done(Reply {
                req: room.gen.0,
                status: Status::UNAVAILABLE.0,
                tokens: Vec::new(),
                reason: None,
            }));
            return;
        };
        // The pairing the router made, as the engine router traces it, so the audit
        // knows each room's halves without a router trace. Decode's node traces it (the
        // client's answer is decode's): a room whose decode half never started is no
        // room to the audit.
        if let Msg::DecodeStart {
            req,
            prompt,
            prefill,
            ..
        } = &msg
        {
            let (req, len, prefill, decode) = (*req, prompt.len(), *prefill, self.io.id);
            self.io.trace(|| {
                Record::Engine(TraceEvent::Routed {
                    node: router,
                    req,
                    tenant: TenantId(0),
                    room,
                    prefill,
                    decode,
                    prompt_len: len as u64,
                    max_new_tokens,
                })
            });
            self.io.clearing.insert(room, 0);
        }
        let half = Half {
            sink: reply,
            tokens: Vec::new(),
            reason: None,
        };
        self.io.halves.insert(room, half);
        self.dispatch(Input::Message { from: router, msg });
        let early = self.io.early_done.iter().position(|(r, _, _)| *r == room);
        if let Some((_, st, why)) = early.and_then(|i| self.io.early_done.remove(i)) {
            self.prefill_done(room, st, why);
        }
    }

    /// Worker mode: the worker front's client of `room` went away (`Ev::AbortHalf`).
    fn abort_half(&mut self, room: RoomKey) {
        let Some(router) = self.io.worker_router else {
            return;
        };
        if !self.io.halves.contains_key(&room) {
            return;
        }
        // A prefill half keeps its answer's sink until the half is terminal (its finish
        // still tells decode); a decode half's client is answered now.
        if matches!(self.node, RtNode::Decode(_)) {
            self.io.halves.remove(&room);
            // The client's answer is decode's: it went away.
            let req = RequestId(room.gen.0);
            self.io.trace(|| Record::ClientCancel {
                req,
                how: CancelHow::Disconnect,
                plan: "the router closed its connection to this worker".into(),
            });
            self.io.answered(room, Status::CLIENT_CLOSED, Vec::new());
        }
        self.dispatch(Input::Message {
            from: router,
            msg: Msg::Abort { room },
        });
    }

    /// Handle one event; `false` to stop.
    fn handle(&mut self, ev: Ev<G::Kv>) -> bool {
        match ev {
            Ev::Msg { from, msg } => self.on_msg(from, msg),
            Ev::FailedBack { from, msg } => self.dispatch(Input::Message { from, msg }),
            Ev::Landed {
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
                prompt,
                max_new_tokens,
                reply,
            } => self.submit(req, tenant, prompt, max_new_tokens, reply),
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
            Ev::StartHalf {
                room,
                msg,
                max_new_tokens,
                reply,
            } => self.start_half(room, msg, max_new_tokens, reply),
            Ev::AbortHalf { room } => self.abort_half(room),
            Ev::PeerHalfDone {
                room,
                status,
                reason,
            } => self.peer_half_done(room, status, reason),
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::shared_cfg::Cfg;
    use std::sync::mpsc::channel;

    /// The router's loop passes each token it took to the client's stream as it
    /// arrives, and nothing it refused (a token from a node that is not the room's
    /// decode node).
    #[test]
    fn tokens_reach_the_client_as_decode_makes_them() {
        let (router, p, d, client) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let cfg = Cfg::new(EngineConfig::default());
        let node = RtNode::<SymbolicGpu>::Router(Router::new(router, cfg, vec![p], vec![d]));
        let (me, rx) = channel();
        let (ptx, _prx) = channel();
        let (dtx, drx) = channel();
        let peers = BTreeMap::from([(p, ptx), (d, dtx)]);
        let mut lp = NodeLoop::new(node, Io::new(router, 0, client, None, peers, me), rx);
        let (tx, answers) = channel();
        lp.handle(Ev::Submit {
            req: RequestId(7),
            tenant: TenantId(0),
            prompt: vec![1, 2, 3, 4],
            max_new_tokens: 2,
            reply: ReplySink::channel(tx),
        });
        let room = match drx.try_recv() {
            Ok(Msg::DecodeStart { room, .. }) => room,
            other => panic!("decode was not started: {other:?}"),
        };
        let out = |index, token| Msg::TokenOut { room, index, token };
        lp.handle(Ev::Msg {
            from: p,
            msg: out(0, 99),
        });
        assert!(
            answers.try_recv().is_err(),
            "a token from prefill is not decode's"
        );
        lp.handle(Ev::Msg {
            from: d,
            msg: out(0, 5),
        });
        assert_eq!(
            answers.try_recv().ok(),
            Some(ReplyEv::Token { index: 0, token: 5 })
        );
        lp.handle(Ev::Msg {
            from: d,
            msg: out(1, 6),
        });
        assert_eq!(
            answers.try_recv().ok(),
            Some(ReplyEv::Token { index: 1, token: 6 })
        );
        assert!(
            answers.try_recv().is_err(),
            "no answer before decode finished"
        );
    }
}
