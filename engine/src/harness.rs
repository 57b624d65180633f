//! `Harness`: a hand-stepped driver for tests, in the shape of quinn-proto's test
//! `Pair`. It builds a router, prefill and decode nodes on any [`Topology`] and lets a
//! test take one step at a time: deliver any message in flight (in any order, any
//! number of times), drop it, fail a KV write, fire any pending timer (timers carry no
//! time, as in the model checker), crash and restart a node; and read what happened:
//! every event with its node, every message sent, every client response, each node's
//! pending timers, pages and per-room phase.
//!
//! It is not a simulator (no clock, no seeded faults, no schedule of its own beyond
//! [`Harness::settle`]) and not a model checker (it explores nothing). It has no
//! rules of its own about the world: a node's effects are carried out only through
//! [`world::apply`] with the harness's [`Driver`], and what an arriving message or a
//! crash does is decided only by [`world::arrival`] and [`world::crash_fate`].
//!
//! A node's [`NodeFault`] is recorded ([`Harness::faults`]) and not acted on: the
//! test decides what follows (a restart is [`Harness::crash_restart`]).
//!
//! Invariant: every message a node sends to another node is in [`Harness::in_flight`]
//! until the test delivers, drops or fails it or a crash decides its fate; messages to
//! the client endpoint are answers, recorded in [`Harness::responses`] at once (the
//! client link is never faulted, [`world::Transport::Client`]).

use crate::config::{ConfigError, EngineConfig};
use crate::decode::{DecodeNode, DecodePhase};
use crate::env::{Input, Outbox, Timer, TimerOp};
use crate::gpu::{Gpu, SymbolicGpu};
use crate::ids::{NodeId, PageId, RequestId, RoomKey, TenantId, Token, WriteId};
use crate::invariant::Violation;
use crate::kv::PageRecord;
use crate::msg::{Msg, Status, Why};
use crate::node::{Node, Role};
use crate::prefill::{PrefillNode, PrefillPhase};
use crate::router::{Router, RouterRoomState};
use crate::shared_cfg::Cfg;
use crate::trace::{NodeFault, TraceEvent};
use crate::world::{
    self, Arrival, Arriving, CrashWalk, Driver, DropReason, Flying, Timers, Topology, Transport,
    WriteFailure, ROUTER,
};

/// A message on its way: who sent it, to whom, and the incarnations of both at the
/// time it was sent (what [`world::Arriving`] needs to know when it arrives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flight<K> {
    /// A number unique within the harness, in sending order.
    pub seq: u64,
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Msg<K>,
    /// The sender's incarnation (its pool epoch) when it sent the message.
    pub from_epoch: u32,
    /// The receiver's incarnation when the message was sent to it.
    pub to_epoch: u32,
}

/// One message a node sent, as the send log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent<K> {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Msg<K>,
}

/// One answer the client endpoint received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientResponse {
    pub req: RequestId,
    pub status: Status,
    pub tokens: Vec<Token>,
    /// The engine's reason for a status that is not 200, where it has one.
    pub why: Option<Why>,
}

/// What became of a message the test delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// The receiver handled it.
    Handled,
    /// The world dropped it ([`world::arrival`]'s verdict).
    Dropped(DropReason),
    /// A KV write failed: nothing applied, its failed completion is now in flight.
    Failed(WriteFailure),
}

/// A point in the harness's logs; see [`Harness::mark`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    events: usize,
    sends: usize,
    responses: usize,
    order: usize,
}

/// One effect of a node's input as the world carried it out, in order (see
/// [`Harness::happened_since`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Happened<'a, K> {
    /// A node emitted a trace event.
    Event(NodeId, &'a TraceEvent),
    /// A node sent a message (to a node or the client).
    Sent(&'a Sent<K>),
    /// The receiver's completion of a stale duplicate was dropped
    /// ([`Harness::land_duplicate`], [`world::duplicate_completion`]).
    DuplicateCompletionDropped(NodeId),
}

/// Who puts a message on its way: a node (its send is logged) or the test itself
/// (a forged or injected message, not a node's send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Node,
    Test,
}

/// How a message in flight meets the world: as sent, or with the injected KV write
/// failure ([`Harness::fail_write`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    AsSent,
    InjectedFailure,
}

/// The kinds of entries of the ordered log, which indexes the event and send logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logged {
    Event,
    Send,
    DroppedCompletion(NodeId),
}

/// What a crash did ([`Harness::crash_report`]): the incarnation that died, the one
/// that replaced it, the dead incarnation's flushed KV writes, and the KV writes to it
/// that failed back to their writers (writer, crashed node, write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashReport {
    pub dead: u32,
    pub epoch: u32,
    pub flushed: Vec<WriteId>,
    pub failed: Vec<(NodeId, NodeId, WriteId)>,
}

/// A request of the test the harness cannot carry out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("no message in flight at index {index} ({len} in flight)")]
    NoSuchFlight { index: usize, len: usize },
    #[error("no message in flight matches {0}")]
    NoMatch(String),
    #[error("{node} has no pending {timer:?} timer")]
    NoSuchTimer { node: NodeId, timer: Timer },
    #[error("{0} is not a node of this topology")]
    NoSuchNode(NodeId),
    #[error("{0} cannot crash (only prefill and decode nodes restart)")]
    CannotCrash(NodeId),
    #[error("not settled after {0} steps")]
    NotSettled(usize),
}

/// The harness's [`Driver`]: the network (messages in flight), the timers and the
/// logs. Kept apart from the nodes so that a node can be handed its input while the
/// driver takes its effects.
#[derive(Debug)]
struct World<K> {
    client: NodeId,
    /// Each node's current incarnation, indexed by node id (the client's is 0).
    epochs: Vec<u32>,
    flights: Vec<Flight<K>>,
    next_seq: u64,
    timers: Timers<u64>,
    events: Vec<(NodeId, TraceEvent)>,
    sends: Vec<Sent<K>>,
    responses: Vec<ClientResponse>,
    /// Pairs of nodes cut from each other, each as (lower id, higher id).
    cut: Vec<(NodeId, NodeId)>,
    /// The events, sends and dropped completions in the order they happened.
    order: Vec<Logged>,
    /// The write whose stale duplicate is being delivered: its receiver's completion
    /// of it is dropped ([`world::duplicate_completion`]).
    replaying: Option<WriteId>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl<K: Clone> World<K> {
    fn epoch(&self, node: NodeId) -> u32 {
        self.epochs.get(node.0 as usize).copied().unwrap_or(0)
    }

    /// Put a message on its way; a node's send is logged as one.
    fn post(&mut self, from: NodeId, to: NodeId, msg: Msg<K>, sender: Sender) {
        if sender == Sender::Node {
            self.order.push(Logged::Send);
            self.sends.push(Sent {
                from,
                to,
                msg: msg.clone(),
            });
        }
        if to == self.client {
            if let Msg::Response {
                req,
                status,
                tokens,
                why,
            } = msg
            {
                self.responses.push(ClientResponse {
                    req,
                    status,
                    tokens,
                    why,
                });
            }
            return;
        }
        let flight = Flight {
            seq: self.next_seq,
            from,
            to,
            msg,
            from_epoch: self.epoch(from),
            to_epoch: self.epoch(to),
        };
        self.next_seq += 1;
        self.flights.push(flight);
    }
}

impl<K: Clone> Driver<Msg<K>> for World<K> {
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<K>) {
        if let Some(dup) = self.replaying {
            if world::duplicate_completion(dup, &msg) {
                self.order.push(Logged::DroppedCompletion(from));
                return;
            }
        }
        self.post(from, to, msg, Sender::Node);
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        let after = match op {
            TimerOp::Set { after_ns, .. } => after_ns,
            TimerOp::Cancel { .. } => 0,
        };
        self.timers.apply(node, op, after);
    }

    fn event(&mut self, node: NodeId, event: TraceEvent) {
        self.order.push(Logged::Event);
        self.events.push((node, event));
    }
}

/// The hand-stepped driver. See the module documentation.
pub struct Harness<G: Gpu> {
    topo: Topology,
    nodes: Vec<Node<G>>,
    world: World<G::Kv>,
    out: Outbox<G::Kv>,
}

impl Harness<SymbolicGpu> {
    /// One prefill and one decode node, each with a pool that just holds the
    /// configured context, on symbolic KV memory.
    pub fn new(cfg: EngineConfig) -> Result<Self, HarnessError> {
        let pages = pool_for_context(&cfg);
        Self::with_topology(
            cfg,
            Topology {
                prefill_pools: vec![pages],
                decode_pools: vec![pages],
            },
        )
    }

    /// Any topology, on symbolic KV memory.
    pub fn with_topology(cfg: EngineConfig, topo: Topology) -> Result<Self, HarnessError> {
        Self::with_gpu(cfg, topo, SymbolicGpu::new)
    }
}

/// The smallest pool (in pages) that holds `cfg.context_len` tokens.
pub fn pool_for_context(cfg: &EngineConfig) -> u32 {
    u32::try_from(cfg.pages_for(cfg.context_len)).unwrap_or(u32::MAX)
}

impl<G: Gpu> Harness<G> {
    /// Any topology and KV memory: `make_gpu(pages, page_size)` as in
    /// [`Topology::build`]. The config is validated and pre-flighted first.
    pub fn with_gpu(
        cfg: EngineConfig,
        topo: Topology,
        make_gpu: impl Fn(u32, u32) -> G,
    ) -> Result<Self, HarnessError> {
        cfg.validate()?;
        topo.preflight(&cfg)?;
        let nodes = topo.build(&Cfg::new(cfg), make_gpu);
        let client = topo.client();
        Ok(Harness {
            world: World {
                client,
                epochs: vec![0; client.0 as usize + 1],
                flights: Vec::new(),
                next_seq: 0,
                timers: Timers::new(),
                events: Vec::new(),
                sends: Vec::new(),
                responses: Vec::new(),
                cut: Vec::new(),
                order: Vec::new(),
                replaying: None,
            },
            topo,
            nodes,
            out: Outbox::new(0),
        })
    }

    // ---- the topology -------------------------------------------------------------

    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    pub fn client(&self) -> NodeId {
        self.topo.client()
    }
    pub fn prefills(&self) -> Vec<NodeId> {
        self.topo.prefill_ids()
    }
    pub fn decodes(&self) -> Vec<NodeId> {
        self.topo.decode_ids()
    }

    // ---- stepping -------------------------------------------------------------------

    /// Hand `node` one input and carry out its effects, in order, through
    /// [`world::apply`].
    fn step(&mut self, node: NodeId, input: Input<G::Kv>) -> Result<(), HarnessError> {
        let n = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(HarnessError::NoSuchNode(node))?;
        self.out.reset(0);
        world::step(n, input, &mut self.out);
        let effects = std::mem::take(&mut self.out.effects);
        world::apply(node, effects, &mut self.world);
        Ok(())
    }

    /// Put a message in flight from `from` to `to`, as if `from` had sent it (a test
    /// forging a message from a wrong peer uses this). Returns its index. It is not
    /// logged as a send ([`Harness::sends`] lists what nodes sent).
    pub fn post(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) -> usize {
        self.world.post(from, to, msg, Sender::Test);
        self.world.flights.len() - 1
    }

    /// Post a message and deliver it at once.
    pub fn inject(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: Msg<G::Kv>,
    ) -> Result<Delivered, HarnessError> {
        if to == self.client() {
            self.world.post(from, to, msg, Sender::Test);
            return Ok(Delivered::Handled);
        }
        let i = self.post(from, to, msg);
        self.deliver(i)
    }

    /// A client submit, delivered to the router at once (tenant 0).
    pub fn submit(
        &mut self,
        req: u64,
        prompt: Vec<Token>,
        max_new_tokens: u32,
    ) -> Result<Delivered, HarnessError> {
        let msg = Msg::Submit {
            req: RequestId(req),
            tenant: TenantId(0),
            prompt,
            max_new_tokens,
        };
        self.inject(self.client(), ROUTER, msg)
    }

    /// A client cancel, delivered to the router at once.
    pub fn cancel(&mut self, req: u64) -> Result<Delivered, HarnessError> {
        let msg = Msg::Cancel {
            req: RequestId(req),
        };
        self.inject(self.client(), ROUTER, msg)
    }

    fn arriving(&self, f: &Flight<G::Kv>, delivery: Delivery) -> Arriving {
        Arriving {
            sender_alive: self.world.epoch(f.from) == f.from_epoch,
            receiver_alive: self.world.epoch(f.to) == f.to_epoch,
            receiver_restarted: self.world.epoch(f.to) > f.to_epoch,
            receiver_epoch: self
                .nodes
                .get(f.to.0 as usize)
                .and_then(|n| n.pool())
                .map_or(0, |p| p.epoch()),
            partitioned: self.world.cut.contains(&pair(f.from, f.to)),
            injected_failure: delivery == Delivery::InjectedFailure,
        }
    }

    fn take_flight(&mut self, index: usize) -> Result<Flight<G::Kv>, HarnessError> {
        let len = self.world.flights.len();
        if index >= len {
            return Err(HarnessError::NoSuchFlight { index, len });
        }
        Ok(self.world.flights.remove(index))
    }

    fn arrive(&mut self, f: Flight<G::Kv>, delivery: Delivery) -> Result<Delivered, HarnessError> {
        match world::arrival(&f.msg, &self.arriving(&f, delivery)) {
            Arrival::Deliver => {
                self.step(
                    f.to,
                    Input::Message {
                        from: f.from,
                        msg: f.msg,
                    },
                )?;
                Ok(Delivered::Handled)
            }
            Arrival::Drop(why) => Ok(Delivered::Dropped(why)),
            Arrival::Fail { reason, completion } => {
                // The writer's NIC reports to the incarnation that posted the write.
                self.push_completion(f.to, f.from, f.from_epoch, completion);
                Ok(Delivered::Failed(reason))
            }
        }
    }

    /// A failed completion travelling back to `writer` (incarnation `epoch`), as the
    /// report about a write to `about`.
    fn push_completion(&mut self, about: NodeId, writer: NodeId, epoch: u32, msg: Msg<G::Kv>) {
        let seq = self.world.next_seq;
        self.world.next_seq += 1;
        self.world.flights.push(Flight {
            seq,
            from: about,
            to: writer,
            msg,
            from_epoch: self.world.epoch(about),
            to_epoch: epoch,
        });
    }

    /// Deliver the message in flight at `index` (any index: delivering a later one
    /// first is a reordering). The world decides what arrives ([`world::arrival`]).
    pub fn deliver(&mut self, index: usize) -> Result<Delivered, HarnessError> {
        let f = self.take_flight(index)?;
        self.arrive(f, Delivery::AsSent)
    }

    /// Deliver the message in flight at `index`, but hand its receiver `msg` instead
    /// if the world delivers it: a data fault the driver decided, applied to what
    /// lands ([`world::alter`]). What arrives is judged on the message as sent.
    pub fn deliver_as(&mut self, index: usize, msg: Msg<G::Kv>) -> Result<Delivered, HarnessError> {
        let mut f = self.take_flight(index)?;
        if let Arrival::Deliver = world::arrival(&f.msg, &self.arriving(&f, Delivery::AsSent)) {
            f.msg = msg;
        }
        self.arrive(f, Delivery::AsSent)
    }

    /// A stale duplicate `copy` of a KV write that already landed arrives again. The
    /// world's rule for an arriving write applies; one that would fail is simply gone
    /// (its writer knows nothing of it: no completion travels back), one that lands is
    /// handed to its node, whose completion of it is dropped.
    pub fn land_duplicate(&mut self, copy: Flight<G::Kv>) -> Result<Delivered, HarnessError> {
        match world::arrival(&copy.msg, &self.arriving(&copy, Delivery::AsSent)) {
            Arrival::Deliver => {}
            Arrival::Drop(why) => return Ok(Delivered::Dropped(why)),
            Arrival::Fail { reason, .. } => return Ok(Delivered::Failed(reason)),
        }
        self.world.replaying = copy.msg.write_id();
        let input = Input::Message {
            from: copy.from,
            msg: copy.msg,
        };
        let handled = self.step(copy.to, input);
        self.world.replaying = None;
        handled.map(|()| Delivered::Handled)
    }

    /// Deliver the first message in flight that matches.
    pub fn deliver_where(
        &mut self,
        what: &str,
        pred: impl Fn(&Flight<G::Kv>) -> bool,
    ) -> Result<Delivered, HarnessError> {
        let i = self.find(what, pred)?;
        self.deliver(i)
    }

    /// Deliver the first message in flight of this kind (see [`Msg::kind`]) to `to`
    /// about `room`.
    pub fn deliver_for(
        &mut self,
        kind: &str,
        to: NodeId,
        room: RoomKey,
    ) -> Result<Delivered, HarnessError> {
        let what = format!("{kind} to {to} for {room}");
        self.deliver_where(&what, |f| {
            f.msg.kind() == kind && f.to == to && f.msg.room() == Some(room)
        })
    }

    /// Deliver the first message in flight of this kind (see [`Msg::kind`]) to `to`.
    pub fn deliver_kind(&mut self, kind: &str, to: NodeId) -> Result<Delivered, HarnessError> {
        let what = format!("{kind} to {to}");
        self.deliver_where(&what, |f| f.msg.kind() == kind && f.to == to)
    }

    /// Fail the KV write in flight at `index` (the injected write failure): nothing of
    /// it lands and its failed completion goes into flight. A message that is not a
    /// KV write is unaffected by the injection and is delivered as usual.
    pub fn fail_write(&mut self, index: usize) -> Result<Delivered, HarnessError> {
        let f = self.take_flight(index)?;
        self.arrive(f, Delivery::InjectedFailure)
    }

    /// Lose the message at `index` (the network lost it). For a KV write this is
    /// outside the fault model (RDMA never loses a write silently): use
    /// [`Harness::fail_write`] for a write that does not land.
    pub fn drop_flight(&mut self, index: usize) -> Result<Flight<G::Kv>, HarnessError> {
        self.take_flight(index)
    }

    /// Put a copy of the message at `index` in flight (a duplicate delivery); returns
    /// the copy's index.
    pub fn duplicate(&mut self, index: usize) -> Result<usize, HarnessError> {
        let len = self.world.flights.len();
        let mut copy = self
            .world
            .flights
            .get(index)
            .cloned()
            .ok_or(HarnessError::NoSuchFlight { index, len })?;
        copy.seq = self.world.next_seq;
        self.world.next_seq += 1;
        self.world.flights.push(copy);
        Ok(len)
    }

    /// Fire a pending timer of `node` (any of them, in any order).
    pub fn fire(&mut self, node: NodeId, timer: Timer) -> Result<(), HarnessError> {
        if self.world.timers.take(node, timer).is_none() {
            return Err(HarnessError::NoSuchTimer { node, timer });
        }
        self.step(node, Input::Timer(timer))
    }

    /// Deliver `timer` to `node` again, whether or not it is pending (a timer wheel
    /// handing out a stale entry: a timer that already fired or was cancelled). A
    /// pending timer of that value stays pending.
    pub fn refire(&mut self, node: NodeId, timer: Timer) -> Result<(), HarnessError> {
        self.step(node, Input::Timer(timer))
    }

    /// Cut `a` and `b` from each other: from now on a message between them arrives
    /// as [`world::arrival`] says a partitioned one does (control messages dropped,
    /// KV writes failed back, completions through).
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        if !self.world.cut.contains(&pair(a, b)) {
            self.world.cut.push(pair(a, b));
        }
    }

    /// Heal a partition made by [`Harness::partition`].
    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        self.world.cut.retain(|p| *p != pair(a, b));
    }

    /// Crash `node` and restart it as its next incarnation: every message in flight
    /// meets the world's crash walk ([`CrashWalk`], with [`world::crash_fate`]), the node's timers die, and the node restarts
    /// with the next epoch. Returns the new epoch. (A node that stays down is not
    /// modelled here: the restart is immediate.)
    pub fn crash_restart(&mut self, node: NodeId) -> Result<u32, HarnessError> {
        self.crash_report(node).map(|r| r.epoch)
    }

    /// [`Harness::crash_restart`], saying what the crash did to the messages in
    /// flight.
    pub fn crash_report(&mut self, node: NodeId) -> Result<CrashReport, HarnessError> {
        let dead = match self.nodes.get(node.0 as usize) {
            Some(n) if n.role() != Role::Router => n.pool().map_or(0, |p| p.epoch()),
            Some(_) => return Err(HarnessError::CannotCrash(node)),
            None => return Err(HarnessError::NoSuchNode(node)),
        };
        let flights = std::mem::take(&mut self.world.flights);
        let walk = CrashWalk::new(node, dead).walk(flights, |f| {
            Some(Flying {
                from: f.from,
                to: f.to,
                msg: &f.msg,
                epochs: Some((f.from_epoch, f.to_epoch)),
                duplicate: false,
            })
        });
        let mut report = CrashReport {
            dead,
            epoch: walk.epoch(),
            flushed: walk.flushed,
            failed: Vec::new(),
        };
        self.world.flights = walk.kept.into_iter().map(|(f, _)| f).collect();
        for (f, done) in walk.failed {
            if let Some(write) = done.write_id() {
                report.failed.push((f.from, node, write));
            }
            self.push_completion(node, f.from, f.from_epoch, done);
        }
        self.world.timers.crash(node);
        if let Some(n) = self.nodes.get_mut(node.0 as usize) {
            world::restart(n, report.epoch);
        }
        if let Some(e) = self.world.epochs.get_mut(node.0 as usize) {
            *e = report.epoch;
        }
        Ok(report)
    }

    /// Deliver every message in flight, oldest first, and fire `Compute` timers when
    /// nothing is in flight, until neither is left. Timeouts (bootstrap, waiting,
    /// drain retry, request) are never fired here: a test fires those itself. Returns
    /// the steps taken.
    pub fn settle(&mut self, max_steps: usize) -> Result<usize, HarnessError> {
        for steps in 0..max_steps {
            if !self.world.flights.is_empty() {
                self.deliver(0)?;
                continue;
            }
            let compute = self.world.timers.iter().find(|(_, t)| *t == Timer::Compute);
            match compute {
                Some((node, timer)) => self.fire(node, timer)?,
                None => return Ok(steps),
            }
        }
        Err(HarnessError::NotSettled(max_steps))
    }

    // ---- looking ------------------------------------------------------------------

    /// Messages in flight, in sending order unless the test reordered them.
    pub fn in_flight(&self) -> &[Flight<G::Kv>] {
        &self.world.flights
    }

    /// The index of the first message in flight that matches.
    pub fn find(
        &self,
        what: &str,
        pred: impl Fn(&Flight<G::Kv>) -> bool,
    ) -> Result<usize, HarnessError> {
        self.world
            .flights
            .iter()
            .position(pred)
            .ok_or_else(|| HarnessError::NoMatch(what.to_string()))
    }

    /// The index of the first message in flight of `kind` to `to`.
    pub fn find_kind(&self, kind: &str, to: NodeId) -> Result<usize, HarnessError> {
        self.find(&format!("{kind} to {to}"), |f| {
            f.msg.kind() == kind && f.to == to
        })
    }

    /// How many messages in flight are of `kind`.
    pub fn count_kind(&self, kind: &str) -> usize {
        self.world
            .flights
            .iter()
            .filter(|f| f.msg.kind() == kind)
            .count()
    }

    pub fn node(&self, id: NodeId) -> Option<&Node<G>> {
        self.nodes.get(id.0 as usize)
    }

    pub fn router(&self) -> Option<&Router> {
        match self.nodes.first() {
            Some(Node::Router(r)) => Some(r),
            _ => None,
        }
    }

    pub fn prefill(&self, id: NodeId) -> Option<&PrefillNode<G>> {
        self.node(id)?.as_prefill()
    }

    pub fn decode(&self, id: NodeId) -> Option<&DecodeNode<G>> {
        self.node(id)?.as_decode()
    }

    pub fn prefill_phase(&self, id: NodeId, room: RoomKey) -> Option<PrefillPhase> {
        self.prefill(id)?.room_phase(room)
    }

    pub fn decode_phase(&self, id: NodeId, room: RoomKey) -> Option<DecodePhase> {
        self.decode(id)?.room_phase(room)
    }

    pub fn router_room(&self, room: RoomKey) -> Option<RouterRoomState> {
        self.router()?.room_state(room)
    }

    /// The live room use serving client request `req`.
    pub fn room_of(&self, req: u64) -> Option<RoomKey> {
        self.router()?.room_of(RequestId(req))
    }

    /// `node`'s pending timers, sorted.
    pub fn timers_of(&self, node: NodeId) -> Vec<Timer> {
        self.world.timers.of(node).collect()
    }

    /// Is any timer pending, on any node?
    pub fn any_timer_pending(&self) -> bool {
        !self.world.timers.is_empty()
    }

    pub fn timer_pending(&self, node: NodeId, timer: Timer) -> bool {
        self.world.timers.get(node, timer).is_some()
    }

    /// Every page record of a node's pool (empty for the router).
    pub fn pages(&self, node: NodeId) -> Vec<(PageId, PageRecord)> {
        self.node(node)
            .and_then(|n| n.pool())
            .map(|p| p.records().map(|(id, r)| (id, r.clone())).collect())
            .unwrap_or_default()
    }

    /// Free pages of a node's pool (0 for the router).
    pub fn free_pages(&self, node: NodeId) -> usize {
        self.node(node)
            .and_then(|n| n.pool())
            .map_or(0, |p| p.free_count())
    }

    /// `peer_refused` as the node counts it.
    pub fn peer_refused(&self, node: NodeId) -> u64 {
        match self.node(node) {
            Some(Node::Router(r)) => r.counters().peer_refused,
            Some(Node::Prefill(p)) => p.counters().peer_refused,
            Some(Node::Decode(d)) => d.counters().peer_refused,
            None => 0,
        }
    }

    /// Every event so far, with the node that emitted it.
    pub fn events(&self) -> &[(NodeId, TraceEvent)] {
        &self.world.events
    }

    /// Every message a node sent so far (to nodes and the client), in order; messages
    /// the test posted or injected are not in it.
    pub fn sends(&self) -> &[Sent<G::Kv>] {
        &self.world.sends
    }

    /// Every answer the client received, in order.
    pub fn responses(&self) -> &[ClientResponse] {
        &self.world.responses
    }

    /// The one answer of a request, if any (the first, should there be more).
    pub fn response(&self, req: u64) -> Option<&ClientResponse> {
        self.world
            .responses
            .iter()
            .find(|r| r.req == RequestId(req))
    }

    /// The faults nodes reported, in order.
    pub fn faults(&self) -> Vec<(NodeId, NodeFault)> {
        self.world
            .events
            .iter()
            .filter_map(|(n, e)| match e {
                TraceEvent::Fault { fault, .. } => Some((*n, fault.clone())),
                _ => None,
            })
            .collect()
    }

    /// The current end of the logs, for [`Harness::events_since`] and friends.
    pub fn mark(&self) -> Mark {
        Mark {
            events: self.world.events.len(),
            sends: self.world.sends.len(),
            responses: self.world.responses.len(),
            order: self.world.order.len(),
        }
    }

    /// The events, sends and dropped duplicate completions since `mark`, in the order
    /// the world carried them out.
    pub fn happened_since(&self, mark: Mark) -> Vec<Happened<'_, G::Kv>> {
        let (mut event, mut send) = (mark.events, mark.sends);
        let mut out = Vec::new();
        for logged in self.world.order.get(mark.order..).unwrap_or(&[]) {
            match logged {
                Logged::Event => {
                    if let Some((node, ev)) = self.world.events.get(event) {
                        out.push(Happened::Event(*node, ev));
                    }
                    event += 1;
                }
                Logged::Send => {
                    if let Some(sent) = self.world.sends.get(send) {
                        out.push(Happened::Sent(sent));
                    }
                    send += 1;
                }
                Logged::DroppedCompletion(node) => {
                    out.push(Happened::DuplicateCompletionDropped(*node));
                }
            }
        }
        out
    }

    pub fn events_since(&self, mark: Mark) -> &[(NodeId, TraceEvent)] {
        self.world.events.get(mark.events..).unwrap_or(&[])
    }

    /// The names of the events since `mark` ([`TraceEvent::name`]), in order.
    pub fn event_names_since(&self, mark: Mark) -> Vec<&'static str> {
        self.events_since(mark)
            .iter()
            .map(|(_, e)| e.name())
            .collect()
    }

    pub fn sends_since(&self, mark: Mark) -> &[Sent<G::Kv>] {
        self.world.sends.get(mark.sends..).unwrap_or(&[])
    }

    /// The sends since `mark` as `(from, kind, to)`, in order.
    pub fn send_kinds_since(&self, mark: Mark) -> Vec<(NodeId, &'static str, NodeId)> {
        self.sends_since(mark)
            .iter()
            .map(|s| (s.from, s.msg.kind(), s.to))
            .collect()
    }

    pub fn responses_since(&self, mark: Mark) -> &[ClientResponse] {
        self.world.responses.get(mark.responses..).unwrap_or(&[])
    }

    /// Every node's local invariants.
    pub fn invariants(&self) -> Result<(), Violation> {
        self.nodes.iter().try_for_each(|n| n.invariants())
    }

    /// How a message between two nodes travels (for tests that reason about faults).
    pub fn transport(&self, f: &Flight<G::Kv>) -> Transport {
        world::transport(f.from, f.to, self.client(), &f.msg)
    }
}
