//! The model state and actions: the engine's nodes (a router, one or more prefill and
//! decode nodes) plus the environment around them.
//!
//! The nodes are the engine's own `Router`, `PrefillNode` and `DecodeNode` with
//! `SymbolicGpu`; everything else here is the environment (clients, the network,
//! pending timers, fault budgets) and the oracle's model of the run
//! (`kvsim_oracle::OracleState`, the same one the simulator and `kvsim audit` use).
//! It holds no timestamps and no event counters, so two runs that reach the same
//! configuration reach the same state. The environment's book ([`Book`]: the clients,
//! their notes, the faults used, the invariants found broken) is a child module,
//! re-exported here.
//!
//! Invariant: `net` and `timers` are sorted and free of duplicates, the book's `notes`
//! are sorted by room, so equal configurations are equal values.

use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::Timer;
use kvsim_engine::gpu::SymbolicGpu;
use kvsim_engine::gpu::SymbolicPage;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::PagePool;
use kvsim_engine::msg::{Carried, Msg};
use kvsim_engine::node::Node;
use kvsim_engine::router::Router;
use kvsim_engine::world::{self, Altered, DataFault, KvTransport, Timers};
use kvsim_oracle::oracle_state::WriteFacts;
use kvsim_oracle::shared::Shared;
use kvsim_oracle::OracleState;
use smallvec::SmallVec;
use std::fmt;
use std::hash::{Hash, Hasher};

mod book;
use book::timer_words;
pub use book::{note, Book, Client, FaultsUsed};

/// The router, as in the simulator's topology.
pub const ROUTER: NodeId = NodeId(0);
/// The first prefill node (the only one in a model with one of each).
pub const PREFILL: NodeId = NodeId(1);
/// The decode node of a model with one of each (`n2`; in general the decode nodes
/// follow the prefill nodes: [`State::decode_ids`]).
pub const DECODE: NodeId = NodeId(2);

/// The prefill nodes of a state, in id order.
/// A prefill node is a [`Node`]: SGLang's or vLLM's, by the router's protocol.
pub type Prefills = SmallVec<[Shared<Node<SymbolicGpu>>; 2]>;
/// The decode nodes of a state, in id order.
pub type Decodes = SmallVec<[Shared<DecodeNode<SymbolicGpu>>; 2]>;

/// A prefill or decode node of a state, by its place in the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvNode {
    Prefill(usize),
    Decode(usize),
}

/// A message in flight between two nodes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Envelope {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Carried<SymbolicPage>,
}

impl Envelope {
    /// KV writes, RDMA READ requests and their completions ride an RDMA reliable
    /// connection: they may be late or fail, never be lost or duplicated. Everything
    /// else is control traffic.
    pub fn is_rdma(&self) -> bool {
        self.msg.is_rdma() || matches!(self.msg, Carried::Msg(Msg::WriteDone { .. }))
    }

    /// Does this message wait in the queues of `frozen` (the world's rule,
    /// [`KvTransport::arrival_waits_for_receiver`])?
    pub fn held_by(&self, frozen: Option<NodeId>, transport: KvTransport) -> bool {
        frozen == Some(self.to) && transport.arrival_waits_for_receiver(&self.msg)
    }

    /// The FIFO channel the message travels on: one per direction and per transport
    /// (RDMA or control), as a queue pair or a TCP connection would be.
    pub fn channel(&self) -> (NodeId, NodeId, bool) {
        (self.from, self.to, self.is_rdma())
    }
}

impl fmt::Display for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} | {}", self.from, self.to, self.msg.summary())
    }
}

/// A copy of a KV write that landed, kept by the network to land again later as a
/// stale duplicate ([`DataFault::StaleDuplicate`]): a retransmission the writer's NIC
/// does not know about. `facts`: the oracle's facts of the write as it was in flight
/// (the simulator's oracle keeps those of recent landings for the same purpose), put
/// back in flight when the copy lands ([`OracleState::duplicate_lands`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct StaleCopy {
    pub env: Envelope,
    pub facts: Option<WriteFacts>,
}

impl fmt::Display for StaleCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.env.fmt(f)
    }
}

/// One state of a model.
///
/// Small on purpose (stateright moves and clones a state several times per
/// successor): the shared nodes (inline up to two prefill and two decode nodes), the
/// network, the timers and the shared [`Book`]. Node ids follow the simulator's
/// topology: the router `n0`, then the prefill nodes, then the decode nodes, then
/// the client endpoint. `Hash` is written by hand (below): it hashes exactly the
/// fields `Eq` compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub router: Shared<Router>,
    pub prefills: Prefills,
    pub decodes: Decodes,
    /// Messages in flight: FIFO channels (see [`Envelope::channel`]) laid end to end,
    /// sorted by channel, oldest first within one. Overtaking is the bounded fault
    /// `Overtake`. A retransmission identical to a message still queued on its channel
    /// merges with it; delivering a message twice is the explicit fault `Duplicate`.
    pub net: Vec<Shared<Envelope>>,
    /// Pending timers per node (the world's timer semantics).
    pub timers: Timers<()>,
    /// Copies of landed KV writes that will land again as stale duplicates, at any
    /// later point (no channel order): sorted by envelope. Empty unless the model's
    /// `data_faults` budget allows the fault.
    pub stale: Vec<Shared<StaleCopy>>,
    pub book: Shared<Book>,
    /// The oracle's model of the run so far.
    pub oracle: Shared<OracleState>,
}

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.router.digest());
        // One of each hashes as it always did (the node counts are the model's).
        for p in &self.prefills {
            h.write_u64(p.digest());
        }
        for d in &self.decodes {
            h.write_u64(d.digest());
        }
        h.write_u64(self.book.digest());
        h.write_u64(self.oracle.digest());
        // The lengths, so that no two different splits of the lists hash alike.
        h.write_u64(self.net.len() as u64 | (self.timers.len() as u64) << 32);
        for e in &self.net {
            h.write_u64(e.digest());
        }
        for (node, t) in self.timers.iter() {
            let (a, b) = timer_words(node, t);
            h.write_u64(a);
            h.write_u64(b);
        }
        h.write_u64(self.stale.len() as u64);
        for c in &self.stale {
            h.write_u64(c.digest());
        }
    }
}

/// Ask the processor to fetch the line at `p` (a hint: no load, no fault).
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl State {
    /// Fetch what expanding this state reads first: its shared parts and the lists
    /// of messages in flight (the breadth-first checker's hint,
    /// [`Model::prefetch`](stateright::Model::prefetch); a state taken off a long
    /// queue is otherwise all cache misses).
    pub fn prefetch(&self, near: bool) {
        if near {
            // The list was fetched on the far call: its envelopes now.
            self.net.iter().for_each(|e| prefetch_line(e.as_ptr()));
            return;
        }
        for p in [
            self.router.as_ptr(),
            self.book.as_ptr(),
            self.oracle.as_ptr(),
            self.net.as_ptr().cast(),
            self.timers.as_ptr(),
        ] {
            prefetch_line(p);
        }
        self.prefills.iter().for_each(|n| prefetch_line(n.as_ptr()));
        self.decodes.iter().for_each(|n| prefetch_line(n.as_ptr()));
    }

    /// Which prefill or decode node `node` is (`None`: the router, the client).
    pub fn kv_node(&self, node: NodeId) -> Option<KvNode> {
        let (i, p) = (usize::from(node.0), self.prefills.len());
        match i {
            0 => None,
            i if i <= p => Some(KvNode::Prefill(i - 1)),
            i if i <= p + self.decodes.len() => Some(KvNode::Decode(i - 1 - p)),
            _ => None,
        }
    }

    /// The prefill nodes' ids, in order.
    pub fn prefill_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (1..=self.prefills.len()).map(|i| NodeId(i as u16))
    }

    /// The decode nodes' ids, in order.
    pub fn decode_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        let p = self.prefills.len();
        (p + 1..=p + self.decodes.len()).map(|i| NodeId(i as u16))
    }

    /// Every prefill and decode node's id, in order.
    pub fn kv_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (1..=self.prefills.len() + self.decodes.len()).map(|i| NodeId(i as u16))
    }

    /// The client endpoint every client shares (requests tell them apart).
    pub fn client_id(&self) -> NodeId {
        NodeId((1 + self.prefills.len() + self.decodes.len()) as u16)
    }

    /// Is `node` a decode node?
    pub fn is_decode(&self, node: NodeId) -> bool {
        matches!(self.kv_node(node), Some(KvNode::Decode(_)))
    }

    /// The decode node `node`, if it is one.
    pub fn decode(&self, node: NodeId) -> Option<&DecodeNode<SymbolicGpu>> {
        match self.kv_node(node)? {
            KvNode::Decode(i) => Some(self.decodes[i].get()),
            KvNode::Prefill(_) => None,
        }
    }

    /// The page pool of a prefill or decode node.
    pub fn pool(&self, node: NodeId) -> Option<&PagePool> {
        match self.kv_node(node)? {
            KvNode::Prefill(i) => self.prefills[i].get().pool(),
            KvNode::Decode(i) => Some(self.decodes[i].get().pool()),
        }
    }

    /// The incarnation of a prefill or decode node (0 for any other id).
    pub fn epoch(&self, node: NodeId) -> u32 {
        self.pool(node).map_or(0, PagePool::epoch)
    }

    pub fn clients(&self) -> &[Client] {
        &self.book.get().clients
    }

    pub fn faults(&self) -> FaultsUsed {
        self.book.get().faults
    }

    /// Change the bookkeeping (copies it if a parent state still shares it).
    pub fn book(&mut self, f: impl FnOnce(&mut Book)) {
        self.book.update(f)
    }

    pub fn violated(&self, inv: Invariant) -> bool {
        self.book.get().violations & (1 << inv as u16) != 0
    }

    pub fn violate(&mut self, inv: Invariant) {
        if !self.violated(inv) {
            self.book(|b| b.violations |= 1 << inv as u16);
        }
    }

    /// A defense stopped the hazard of `inv` (see `ModelSpec::detections_hold`).
    pub fn detect(&mut self, inv: Invariant) {
        if self.book.get().detected & (1 << inv as u16) == 0 {
            self.book(|b| b.detected |= 1 << inv as u16);
        }
    }

    /// The request a room use serves (as the oracle learnt it from the router).
    pub fn req_of(&self, room: RoomKey) -> Option<RequestId> {
        self.oracle.get().room(room).map(|f| f.req)
    }

    /// The client that submitted `req`.
    pub fn client_of(&self, req: RequestId) -> Option<&Client> {
        self.clients().iter().find(|c| c.req == Some(req))
    }

    pub fn noted(&self, room: RoomKey, flag: u8) -> bool {
        let notes = &self.book.get().notes;
        notes
            .binary_search_by_key(&room, |(k, _)| *k)
            .is_ok_and(|i| notes[i].1 & flag != 0)
    }

    pub fn note(&mut self, room: RoomKey, flag: u8) {
        if self.noted(room, flag) {
            return;
        }
        self.book(|b| match b.notes.binary_search_by_key(&room, |(k, _)| *k) {
            Ok(i) => b.notes[i].1 |= flag,
            Err(i) => b.notes.insert(i, (room, flag)),
        });
    }

    pub fn unnote(&mut self, room: RoomKey, flag: u8) {
        if !self.noted(room, flag) {
            return;
        }
        self.book(|b| {
            if let Ok(i) = b.notes.binary_search_by_key(&room, |(k, _)| *k) {
                b.notes[i].1 &= !flag;
                if b.notes[i].1 == 0 {
                    b.notes.remove(i);
                }
            }
        });
    }

    /// Remember that a timer fired or was cancelled (it may be delivered again).
    pub fn spend(&mut self, node: NodeId, timer: Timer) {
        let key = (node, timer);
        if let Err(i) = self.book.get().spent.binary_search(&key) {
            self.book(|b| b.spent.insert(i, key));
        }
    }

    /// Forget the spent timers of `node` that `keep` rejects (no-op when none).
    pub fn forget_spent(&mut self, mut keep: impl FnMut(NodeId, Timer) -> bool) {
        if self.book.get().spent.iter().any(|&(n, t)| !keep(n, t)) {
            self.book(|b| b.spent.retain(|&mut (n, t)| keep(n, t)));
        }
    }

    /// The range of `net` that holds one channel's queue.
    fn segment(&self, key: (NodeId, NodeId, bool)) -> std::ops::Range<usize> {
        let start = self.net.partition_point(|e| e.get().channel() < key);
        let end = self.net.partition_point(|e| e.get().channel() <= key);
        start..end
    }

    /// Put a message at the end of its channel (no effect if an identical one is
    /// still queued there).
    pub fn send(&mut self, env: Envelope) {
        self.send_shared(Shared::new(env));
    }

    /// [`State::send`] for a message already built (shared with a memoized effect).
    pub fn send_shared(&mut self, env: Shared<Envelope>) {
        let seg = self.segment(env.get().channel());
        if self.net[seg.clone()].iter().any(|e| e == &env) {
            return;
        }
        self.net.insert(seg.end, env);
    }

    /// Keep a copy of a landed KV write to land again later (merged with an identical
    /// copy already kept).
    pub fn keep_stale(&mut self, copy: StaleCopy) {
        if let Err(i) = self.stale.binary_search_by(|c| c.get().env.cmp(&copy.env)) {
            self.stale.insert(i, Shared::new(copy));
        }
    }

    /// Take a kept copy out; `false` if it was not kept.
    pub fn take_stale(&mut self, copy: &Shared<StaleCopy>) -> bool {
        match self.stale.iter().position(|c| c == copy) {
            Some(i) => {
                self.stale.remove(i);
                true
            }
            None => false,
        }
    }

    /// Where a message is queued: its index in `net`, and whether it is the head of
    /// its channel (the next one the channel delivers in order).
    pub fn position(&self, env: &Shared<Envelope>) -> Option<(usize, bool)> {
        // Actions carry the very envelope they were generated from: find it by
        // identity first (a successor shares its parent's envelopes).
        if let Some(i) = self.net.iter().position(|e| e.same(env)) {
            return Some((i, self.is_head(i)));
        }
        let seg = self.segment(env.get().channel());
        let start = seg.start;
        self.net[seg]
            .iter()
            .position(|e| e == env)
            .map(|i| (start + i, i == 0))
    }

    /// Is this entry of `net` the head of its channel?
    pub fn is_head(&self, i: usize) -> bool {
        i == 0 || self.net[i - 1].get().channel() != self.net[i].get().channel()
    }

    /// Take a message out of flight; `false` if it was not in flight.
    pub fn take(&mut self, env: &Shared<Envelope>) -> bool {
        match self.position(env) {
            Some((i, _)) => {
                self.net.remove(i);
                true
            }
            None => false,
        }
    }

    /// Would a timeout firing now be premature: is other progress still possible (a
    /// message in flight, or a scheduler tick pending)? Work that waits for a frozen
    /// node is not progress that can happen: the other nodes' clocks run on while it
    /// is frozen (`transport` says which arrivals wait for it).
    pub fn timeout_is_early(&self, transport: KvTransport) -> bool {
        let frozen = self.faults().frozen_node();
        self.net.iter().any(|e| !e.get().held_by(frozen, transport))
            || self
                .timers
                .iter()
                .any(|(n, t)| t == Timer::Compute && Some(n) != frozen)
    }
}

/// What the environment does next. Every enabled action is one branch of the model.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// Client `slot` submits its request to the router.
    Submit(u8),
    /// Client `slot` disconnects.
    Cancel(u8),
    /// Deliver the oldest message of a channel (and take it out of flight).
    Deliver(Shared<Envelope>),
    /// Deliver a message ahead of older ones on its channel (reordering).
    Overtake(Shared<Envelope>),
    /// Deliver a copy of a control message and keep it in flight.
    Duplicate(Shared<Envelope>),
    /// Lose a control message.
    Lose(Shared<Envelope>),
    /// A KV write fails on the wire: it is not applied, and the writer's NIC reports
    /// its completion with an error.
    FailWrite(Shared<Envelope>),
    /// A node's pending timer fires.
    Fire(NodeId, Timer),
    /// A timer that already fired or was cancelled is delivered again.
    Refire(NodeId, Timer),
    /// Deliver the oldest KV write of a channel altered by a data fault.
    Alter(Shared<Envelope>, DataFault),
    /// Deliver the oldest KV write of a channel, and keep a copy of it in the network
    /// to land again later as a stale duplicate (a data fault: [`Action::LandStale`]).
    KeepStale(Shared<Envelope>),
    /// A kept copy of a KV write lands again, over whatever its pages hold now.
    LandStale(Shared<StaleCopy>),
    /// The prefill or decode node crashes and restarts into a new incarnation.
    Crash(NodeId),
    /// The prefill or decode node freezes (a stall): its timers and the arrivals that
    /// need its process wait until it wakes, while the others' clocks run on.
    Pause(NodeId),
    /// The frozen node runs again; its timers are overdue.
    Wake(NodeId),
    /// Another party's start pair for a live room use goes in flight.
    Collide(Collision),
}

/// A start pair for the live room use `room` from request `req` of another party
/// (prompt `prompt_len` tokens, `max_new_tokens`): [`Action::Collide`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Collision {
    pub room: RoomKey,
    pub req: RequestId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
}

/// The salt the model checker gives [`world::alter`]: the first page of a write, its
/// first slot, its lowest bit. One fixed choice keeps the fault one branch per kind;
/// the replayer uses the same one.
pub const DATA_FAULT_SALT: u64 = 0;

/// How many pages the pool of `node` has in a model's topology (0: not a KV node).
pub fn pool_pages(spec: &crate::spec::ModelSpec, node: NodeId) -> u32 {
    let (i, p, d) = (
        usize::from(node.0),
        usize::from(spec.nodes.prefill),
        usize::from(spec.nodes.decode),
    );
    match i {
        0 => 0,
        i if i <= p => spec.prefill_pages,
        i if i <= p + d => spec.decode_pages,
        _ => 0,
    }
}

/// `msg`, on its way to `to`, altered by `fault` as the world defines it
/// ([`world::alter`] with [`DATA_FAULT_SALT`]); `None` when the fault has nothing to
/// act on. The model and the replayer both alter a write through this.
pub fn altered(
    spec: &crate::spec::ModelSpec,
    to: NodeId,
    msg: &Carried<SymbolicPage>,
    fault: DataFault,
) -> Option<(Carried<SymbolicPage>, Altered)> {
    let mut w = msg.write()?.clone();
    let a = world::alter(&mut w, fault, pool_pages(spec, to), DATA_FAULT_SALT)?;
    Some((Carried::Write(w), a))
}

/// What a stale duplicate `msg` does as it lands at a node whose pool is `pool`
/// ([`world::stale_landing`] against the current tags of the pages it addresses).
/// The model and the replayer both describe the landing through this.
pub fn stale_landing(pool: &PagePool, msg: &Carried<SymbolicPage>) -> Option<Altered> {
    let w = msg.write()?;
    let dst = &w.dst;
    let now: Vec<_> = dst
        .iter()
        .filter_map(|t| {
            pool.record(t.page).map(|r| kvsim_engine::ids::PageTag {
                page: t.page,
                gen: r.gen,
            })
        })
        .collect();
    world::stale_landing(w, &now)
}

/// A timer as `Kind room` text (`Compute`, `Request room1.1`).
pub fn timer_text(timer: Timer) -> String {
    match timer {
        Timer::Compute => "Compute".into(),
        Timer::Bootstrap(r) => format!("Bootstrap {r}"),
        Timer::WaitingForKv(r) => format!("WaitingForKv {r}"),
        Timer::DrainRetry(r, n) => format!("DrainRetry {r} #{n}"),
        Timer::Request(r) => format!("Request {r}"),
        Timer::Lease(r) => format!("Lease {r}"),
        Timer::Heartbeat(r) => format!("Heartbeat {r}"),
        Timer::Pairing(r) => format!("Pairing {r}"),
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Submit(slot) => write!(f, "client {slot} submits"),
            Action::Cancel(slot) => write!(f, "client {slot} disconnects"),
            Action::Deliver(e) => write!(f, "deliver {}", e.get()),
            Action::Overtake(e) => write!(f, "overtake {}", e.get()),
            Action::Duplicate(e) => write!(f, "duplicate {}", e.get()),
            Action::Lose(e) => write!(f, "lose {}", e.get()),
            Action::FailWrite(e) => write!(f, "fail-write {}", e.get()),
            Action::Fire(node, t) => write!(f, "fire {node} {}", timer_text(*t)),
            Action::Refire(node, t) => write!(f, "refire {node} {}", timer_text(*t)),
            Action::Alter(e, fault) => write!(f, "deliver-{} {}", fault.name(), e.get()),
            Action::KeepStale(e) => write!(f, "deliver-keep-copy {}", e.get()),
            Action::LandStale(c) => write!(
                f,
                "deliver-{} {}",
                DataFault::StaleDuplicate.name(),
                c.get()
            ),
            Action::Crash(node) => write!(f, "crash {node}"),
            Action::Pause(node) => write!(f, "pause {node}"),
            Action::Wake(node) => write!(f, "wake {node}"),
            Action::Collide(c) => write!(
                f,
                "collide {} {} prompt={} max_new={}",
                c.room, c.req, c.prompt_len, c.max_new_tokens
            ),
        }
    }
}
