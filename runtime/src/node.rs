//! One node's event loop.
//!
//! The loop owns the node (an unchanged engine state machine, the engine's own
//! [`Node`]), its timers and the loop's own rules. It takes one [`NodeEvent`] at a
//! time from its runtime (a message read off a connection, a fired timer, a landing
//! reported by the node's landing, a send that failed, a client's request) and feeds
//! the node one input, then carries out the node's effects in the order issued through
//! [`kvsim_engine::world::apply`]. Channels, the clock, the links to peers and the
//! trace file are behind [`NodeRuntime`] ([`crate::seam`]), so the loop also runs in
//! process.
//! What a failed send means (a KV write fails back with one failed completion, any
//! other message is lost) is [`kvsim_engine::world::arrival`]'s rule, as in every
//! driver.
//!
//! A decode node's KV writes do not pass through its loop: they land off its
//! connections ([`crate::landing`]) by the engine's landing rule, gated by the node's
//! one ownership record (the `SharedPool` its loop decides with), concurrently with
//! the loop, and each landing is reported to the loop, where the node traces it and
//! completes the write.

use crate::clock::{wall_ns, TimerHeap};
use crate::device::DeviceThread;
use crate::gpu::SharedGpu;
pub use crate::landing::{transfer_thread, LandingRecord, WireLanding};
use crate::seam::{Next, NodeRuntime};
use kvsim_engine::compute::{Done, Job};
use kvsim_engine::env::{Effect, Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use kvsim_engine::kv::{PageRecords, Refusal, SharedRecord};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::{
    self, Arrival, Arriving, CrashWalk, Driver, WriteFailure, WritesInFlight,
};
use kvsim_oracle::schema::{CancelHow, EndOutcome, FaultEvent, MsgView, Record};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;

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
    /// Set when the node stopped itself, was restarted in process, or broke one of
    /// its own invariants.
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
pub enum NodeEvent<K> {
    /// A message read off a connection.
    Msg {
        from: NodeId,
        msg: Msg<K>,
    },
    /// A KV write of `from` landed or was refused ([`crate::landing`]); one of a dead
    /// incarnation fails back instead ([`NodeLoop::handle`]).
    Landed {
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
    },
    /// The node's landing failed a KV write on arrival (the world's rule).
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
        /// A decode half: the incarnation of the prefill node whose bootstrap took the
        /// room's registration (`None`: it did not say).
        prefill_epoch: Option<u32>,
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

/// The node a loop runs: the engine's own [`Node`], its state machines unchanged. Its
/// memory is shared with the decode node's transfer thread, and the decode node decides
/// with the shared record that thread gates landings with.
pub type RuntimeNode<G> = Node<SharedGpu<G>, SharedRecord>;

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
    writes: WritesInFlight,
    clients: BTreeMap<RequestId, ReplySink>,
    /// Worker mode: the router's id, whose messages go to the worker front's halves.
    pub worker_router: Option<NodeId>,
    /// Worker mode: a failed prefill half ends its decode half with prefill's status
    /// (the router's cancel-both, defense 6: `router_cancels_both`).
    pub worker_cancels_both: bool,
    /// Worker mode: each started half's answers, and (decode) its tokens so far.
    halves: BTreeMap<RoomKey, Half>,
    /// Worker mode, decode: which halves of each room are terminal (1: decode's, 2:
    /// prefill's; both: the room is cleared), and the prefill node and incarnation
    /// that took the room's registration, where it said.
    clearing: BTreeMap<RoomKey, (u8, Option<(NodeId, u32)>)>,
    /// Worker mode, decode: the latest incarnation each prefill node's bootstrap has
    /// answered with.
    prefill_epochs: BTreeMap<NodeId, u32>,
    /// Worker mode, decode: prefill's word that a room's half is done, come before
    /// decode's half started (at most [`EARLY_DONE`], the oldest dropped).
    early_done: std::collections::VecDeque<(RoomKey, Status, Option<String>)>,
    fault: Option<String>,
    /// The node asked to be restarted (a fault whose action is a restart).
    restart_asked: bool,
    counts: NodeCounts,
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
            worker_router: None,
            worker_cancels_both: false,
            halves: BTreeMap::new(),
            clearing: BTreeMap::new(),
            prefill_epochs: BTreeMap::new(),
            early_done: std::collections::VecDeque::new(),
            fault: None,
            restart_asked: false,
            counts: NodeCounts::default(),
        }
    }

    fn trace(&mut self, rec: impl FnOnce() -> Record) {
        if self.rt.tracing() {
            self.rt.trace(rec());
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
        if self.writes.fail(to, id) {
            self.failed_back(to, id, reason, completion);
        }
    }

    /// Trace the failure of a write taken out of flight, and deliver its one failed
    /// completion to this node.
    fn failed_back(&mut self, to: NodeId, id: WriteId, reason: WriteFailure, completion: Msg<K>) {
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
    fn failed_here(&mut self, from: NodeId, id: WriteId, reason: WriteFailure, completion: Msg<K>) {
        let me = self.id;
        self.trace(|| Record::WriteFailed {
            from,
            to: me,
            write: id,
            reason,
        });
        let _ = self.rt.send(from, completion);
    }

    /// The connection to `peer` broke: every write posted on it fails back.
    fn peer_lost(&mut self, peer: NodeId) {
        for id in self.writes.peer_lost(peer) {
            let done = Msg::WriteDone { id, ok: false };
            self.failed_back(peer, id, WriteFailure::ReceiverGone, done);
        }
    }
}

impl<K: Clone, R: NodeRuntime<Kv = K>> Io<R> {
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
        let Some((done, _)) = self.clearing.get_mut(&room) else {
            return;
        };
        *done |= bit;
        if *done == 3 {
            self.clearing.remove(&room);
            self.trace(|| Record::Engine(TraceEvent::RoomCleared { node, room }));
        }
    }

    /// Worker mode, decode: prefill node `prefill`'s bootstrap answered as incarnation
    /// `epoch`. A later incarnation means the process of every earlier one was killed
    /// (a restart in process keeps the process's worker front and its first epoch),
    /// and its halves died with it: the restarted node's trace begins with the `crash`
    /// that forgets them, and no word of their end can come (the dead process would
    /// have sent it). So the prefill half of every room registered at an earlier
    /// incarnation is terminal; a room whose decode half is terminal too is cleared.
    fn prefill_incarnation(&mut self, prefill: NodeId, epoch: u32) {
        let known = self.prefill_epochs.entry(prefill).or_insert(epoch);
        if epoch <= *known {
            return;
        }
        *known = epoch;
        let dead: Vec<RoomKey> = self
            .clearing
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|(p, e)| p == prefill && e < epoch))
            .map(|(room, _)| *room)
            .collect();
        for room in dead {
            self.half_done(room, 2);
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

impl<K: Clone, R: NodeRuntime<Kv = K>> Driver<Msg<K>> for Io<R> {
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
        self.writes.post(to, &msg);
        // Write-ahead: the node's events reach the file (the kernel's, which a killed
        // process does not lose) before a message they caused leaves the node, so no
        // other node's trace can show an effect whose cause this trace lost.
        self.rt.flush_trace();
        if let Err(msg) = self.rt.send(to, msg) {
            self.undeliverable(to, msg);
        }
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        let now = self.rt.now_ns();
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
}

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
    intake_open: bool,
    /// The last turn fired a timer ([`NodeLoop::turn`]).
    timer_turn: bool,
}

/// The node as [`world::step`] drives it in the runtime: its compute runs on its device
/// thread where it has one, and the loop waits for it.
struct OnDevice<'a, G: Gpu> {
    node: &'a mut RuntimeNode<G>,
    device: Option<&'a DeviceThread>,
    /// The jobs this step ran.
    jobs: u32,
}

/// The least time between two scheduler passes when the first ran no device work
/// (it only polled transfers in flight): under `kvsim serve --compute device` a pass
/// is re-armed at once, and a poll that found nothing to run would otherwise spin a
/// core the node's own transfer and link threads need. A timer fires at or after its
/// deadline in every driver; the runtime lets this one fire a little later.
pub const IDLE_PASS_NS: u64 = 100_000;

/// A pass that ran no device work re-arms its next pass no sooner than
/// [`IDLE_PASS_NS`].
fn pace_idle_pass<M>(effects: &mut [Effect<M>]) {
    for e in effects.iter_mut() {
        if let Effect::Timer(TimerOp::Set {
            timer: Timer::Compute,
            after_ns,
        }) = e
        {
            *after_ns = (*after_ns).max(IDLE_PASS_NS);
            debug_assert!(*after_ns >= IDLE_PASS_NS);
        }
    }
}

impl<G: Gpu> world::Stepper<G::Kv> for OnDevice<'_, G> {
    fn handle(&mut self, input: Input<G::Kv>, out: &mut Outbox<G::Kv>) {
        self.node.handle(input, out);
    }
    fn compute(&mut self, job: Job) -> Done {
        self.jobs += 1;
        match self.device {
            Some(d) => d.run(job),
            None => world::Stepper::compute(self.node, job),
        }
    }
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

    fn dispatch(&mut self, input: Input<G::Kv>) {
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
        let walk = CrashWalk::<(), G::Kv>::new(node, dead).flush_posted(&mut self.io.writes);
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
            self.dispatch(Input::Timer(timer));
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

    /// A token decode produced, to its client's stream as it is made: only a token the
    /// router took (from the room's own decode node, for a room not yet answered, now
    /// held at its index) is passed on, read from the router's state after it handled
    /// the message; the terminal answer still comes from the router alone.
    fn stream_token(&mut self, from: NodeId, room: RoomKey, index: u32, token: Token) {
        let Node::Router(r) = &self.node else {
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
            if !self.io.writes.complete(from, *id) {
                return;
            }
        }
        let token = match (&self.node, &msg) {
            (Node::Router(_), Msg::TokenOut { room, index, token }) => {
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

    /// Worker mode: start a half the worker front was given (`NodeEvent::StartHalf`).
    fn start_half(
        &mut self,
        room: RoomKey,
        msg: Msg<G::Kv>,
        max_new_tokens: u32,
        mut reply: ReplySink,
        prefill_epoch: Option<u32>,
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
            let at = prefill_epoch.map(|e| (prefill, e));
            self.io.clearing.insert(room, (0, at));
            if let Some(e) = prefill_epoch {
                self.io.prefill_incarnation(prefill, e);
                // Registered at an incarnation already known dead: its half is over.
                if self.io.prefill_epochs.get(&prefill).is_some_and(|k| *k > e) {
                    self.io.half_done(room, 2);
                }
            }
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

    /// Worker mode: the worker front's client of `room` went away (`NodeEvent::AbortHalf`).
    fn abort_half(&mut self, room: RoomKey) {
        let Some(router) = self.io.worker_router else {
            return;
        };
        if !self.io.halves.contains_key(&room) {
            return;
        }
        // A prefill half keeps its answer's sink until the half is terminal (its finish
        // still tells decode); a decode half's client is answered now.
        if matches!(self.node, Node::Decode(_)) {
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
                prefill_epoch,
            } => self.start_half(room, msg, max_new_tokens, reply, prefill_epoch),
            NodeEvent::AbortHalf { room } => self.abort_half(room),
            NodeEvent::PeerHalfDone {
                room,
                status,
                reason,
            } => self.peer_half_done(room, status, reason),
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

/// Wall-clock time, re-exported for the server's reports.
pub fn now_wall_ns() -> u64 {
    wall_ns()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::Threads;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::router::Router;
    use kvsim_engine::shared_cfg::Cfg;
    use std::sync::mpsc::channel;

    /// A scheduler pass that ran no device work re-arms its next pass no sooner than
    /// the floor; every other timer, and a pass armed later than the floor, is as the
    /// node asked.
    #[test]
    fn an_idle_pass_re_arms_no_sooner_than_the_floor() {
        let room = kvsim_engine::ids::RoomKey::new(1, 1);
        let set = |timer, after_ns| Effect::<()>::Timer(TimerOp::Set { timer, after_ns });
        let mut effects = vec![set(Timer::Compute, 0), set(Timer::WaitingForKv(room), 0)];
        pace_idle_pass(&mut effects);
        let delays: Vec<u64> = effects
            .iter()
            .map(|e| match e {
                Effect::Timer(TimerOp::Set { after_ns, .. }) => *after_ns,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(delays, [IDLE_PASS_NS, 0]);
        let mut later = vec![set(Timer::Compute, 5 * IDLE_PASS_NS)];
        pace_idle_pass(&mut later);
        assert!(matches!(
            later[0],
            Effect::Timer(TimerOp::Set { after_ns, .. }) if after_ns == 5 * IDLE_PASS_NS
        ));
    }

    /// The router's loop passes each token it took to the client's stream as it
    /// arrives, and nothing it refused (a token from a node that is not the room's
    /// decode node).
    #[test]
    fn tokens_reach_the_client_as_decode_makes_them() {
        let (router, p, d, client) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let cfg = Cfg::new(EngineConfig::default());
        let node = RuntimeNode::<SymbolicGpu>::Router(Router::new(router, cfg, vec![p], vec![d]));
        let (me, rx) = channel();
        let (ptx, _prx) = channel();
        let (dtx, drx) = channel();
        let peers = BTreeMap::from([(p, ptx), (d, dtx)]);
        let rt = Threads::new(None, peers, me, rx);
        let mut lp = NodeLoop::new(node, Io::new(router, 0, client, rt));
        let (tx, answers) = channel();
        lp.handle(NodeEvent::Submit {
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
        lp.handle(NodeEvent::Msg {
            from: p,
            msg: out(0, 99),
        });
        assert!(
            answers.try_recv().is_err(),
            "a token from prefill is not decode's"
        );
        lp.handle(NodeEvent::Msg {
            from: d,
            msg: out(0, 5),
        });
        assert_eq!(
            answers.try_recv().ok(),
            Some(ReplyEv::Token { index: 0, token: 5 })
        );
        lp.handle(NodeEvent::Msg {
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
