//! The world around the nodes, stated once: the topology, how a driver carries out a
//! node's effects, and what the network, the NICs, the timers and a crash do.
//!
//! Every driver goes through here: the simulator (virtual time, seeded faults), the
//! model checker (every interleaving, bounded faults), the counterexample replayer and
//! the hand-stepped test driver ([`crate::harness`]); the hardware runtime uses the
//! parts that are not real I/O (the topology, the fates of writes at a crash). Nothing
//! here reads a clock or draws a random number: a driver decides *when* and *whether*
//! (a delay, a loss, an injected failure), and these functions say *what follows*.
//!
//! The fault model is RDMA's for KV writes (a write lands once or fails with exactly
//! one failed completion to its writer, never silently lost or duplicated; a
//! completion is the writer NIC's own report and no partition loses it) and an
//! unreliable network for control messages (lost, duplicated, delayed, reordered).
//! A crashed node's incarnation dies with its timers, its memory registrations (KV
//! writes to it fail back; control messages and completions to it reach its restarted
//! incarnation late, which must ignore what belongs to the dead one) and its NIC's
//! queue (its own writes are flushed, never applied); a write addressed with page tags of an earlier incarnation of its
//! receiver fails, because the memory registration it names is gone.

use crate::config::EngineConfig;
use crate::decode::DecodeNode;
use crate::env::{Effect, Timer, TimerOp};
use crate::gpu::Gpu;
#[cfg(feature = "testing")]
use crate::gpu::KvPayload;
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};
use crate::kv::PageRecords;
use crate::msg::Msg;
use crate::node::{Node, Role};
use crate::prefill::PrefillNode;
use crate::router::Router;
use crate::shared_cfg::Cfg;
pub use crate::step::{step, Stepper};
use crate::trace::TraceEvent;
pub use crate::transport::KvTransport;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use strum::{EnumCount, VariantArray};
#[cfg(feature = "testing")]
use {crate::ids::PageId, std::collections::VecDeque};

/// The router, in every topology.
pub const ROUTER: NodeId = NodeId(0);

/// Which nodes exist and how big their pools are. Ids: the router is `n0`, then the
/// prefill nodes `n1..=nP`, then the decode nodes, then the client endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Pool size in pages of each prefill node.
    pub prefill_pools: Vec<u32>,
    /// Pool size in pages of each decode node.
    pub decode_pools: Vec<u32>,
}

impl Topology {
    pub fn prefill_ids(&self) -> Vec<NodeId> {
        (1..=self.prefill_pools.len())
            .map(|i| NodeId(i as u16))
            .collect()
    }

    pub fn decode_ids(&self) -> Vec<NodeId> {
        let p = self.prefill_pools.len();
        (p + 1..=p + self.decode_pools.len())
            .map(|i| NodeId(i as u16))
            .collect()
    }

    /// The client endpoint every client shares (requests tell them apart).
    pub fn client(&self) -> NodeId {
        NodeId((1 + self.prefill_pools.len() + self.decode_pools.len()) as u16)
    }

    /// The role of a node id, `None` for the client or an unknown id.
    pub fn role(&self, node: NodeId) -> Option<Role> {
        let (i, p, d) = (
            node.0 as usize,
            self.prefill_pools.len(),
            self.decode_pools.len(),
        );
        match i {
            0 => Some(Role::Router),
            i if i <= p => Some(Role::Prefill),
            i if i <= p + d => Some(Role::Decode),
            _ => None,
        }
    }

    /// The pool size of a prefill or decode node.
    pub fn pool(&self, node: NodeId) -> Option<u32> {
        let (i, p) = (node.0 as usize, self.prefill_pools.len());
        match self.role(node)? {
            Role::Router => None,
            Role::Prefill => self.prefill_pools.get(i - 1).copied(),
            Role::Decode => self.decode_pools.get(i - 1 - p).copied(),
        }
    }

    /// Every node with its role and pool (the router has none), in id order.
    pub fn nodes(&self) -> Vec<(NodeId, Role, Option<u32>)> {
        (0..self.client().0)
            .map(NodeId)
            .filter_map(|n| Some((n, self.role(n)?, self.pool(n))))
            .collect()
    }

    /// Build the nodes, in id order. `make_gpu(pages, page_size)` makes each node's KV
    /// memory. Run [`Topology::preflight`] first.
    pub fn build<G: Gpu>(&self, cfg: &Cfg, make_gpu: impl Fn(u32, u32) -> G) -> Vec<Node<G>> {
        let (prefills, decodes) = (self.prefill_ids(), self.decode_ids());
        let mut nodes = vec![Node::Router(Router::new(
            ROUTER,
            cfg.clone(),
            prefills.clone(),
            decodes.clone(),
        ))];
        for (id, &pages) in prefills.iter().zip(&self.prefill_pools) {
            nodes.push(Node::Prefill(PrefillNode::new(
                *id,
                cfg.clone(),
                ROUTER,
                make_gpu(pages, cfg.page_size),
            )));
        }
        for (id, &pages) in decodes.iter().zip(&self.decode_pools) {
            nodes.push(Node::Decode(DecodeNode::new(
                *id,
                cfg.clone(),
                ROUTER,
                prefills.clone(),
                make_gpu(pages, cfg.page_size),
            )));
        }
        nodes
    }

    /// The pre-flight rule on every node (a pool must hold the advertised context).
    pub fn preflight(&self, cfg: &EngineConfig) -> Result<(), crate::config::ConfigError> {
        for (node, role, pool) in self.nodes() {
            if let Some(pages) = pool {
                let name = match role {
                    Role::Prefill => format!("prefill node {node}"),
                    _ => format!("decode node {node}"),
                };
                cfg.preflight(&name, pages)?;
            }
        }
        Ok(())
    }
}

/// How a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// To or from the client endpoint: the test harness's own link, never faulted.
    Client,
    /// Control traffic between nodes: may be lost, duplicated, delayed, reordered.
    Control,
    /// A KV write: lands once or fails with one failed completion; may be slow or late.
    Write,
    /// A KV write's completion, the writer NIC's report: never lost to a partition.
    Completion,
}

/// How `msg` from `from` to `to` travels, given the client endpoint's id.
pub fn transport<K>(from: NodeId, to: NodeId, client: NodeId, msg: &Msg<K>) -> Transport {
    if from == client || to == client {
        Transport::Client
    } else {
        match msg {
            Msg::KvWrite { .. } => Transport::Write,
            Msg::WriteDone { .. } => Transport::Completion,
            _ => Transport::Control,
        }
    }
}

/// Why a message was not delivered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The network lost it.
    Lost,
    /// The two nodes were partitioned when it arrived.
    Partitioned,
    /// The receiver was down, or restarted since the message was sent (the
    /// connection it was sent on died with the old incarnation).
    ReceiverGone,
    /// A KV write of a sender that crashed: flushed from its NIC, never applied.
    SenderCrashed,
}

/// Why a KV write failed (not applied; its writer gets one failed completion).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteFailure {
    /// The injected write failure.
    Injected,
    /// Across a partition.
    Partitioned,
    /// The receiver was down or restarted since.
    ReceiverGone,
    /// The destination tags belong to an earlier incarnation of the receiver (the
    /// memory registration they name no longer exists).
    StaleRegistration,
}

/// What the driver knows about a message as it arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arriving {
    /// The sender's incarnation that sent it is still the current one.
    pub sender_alive: bool,
    /// The receiver is up and is the incarnation the message was sent to.
    pub receiver_alive: bool,
    /// The receiver is up in a later incarnation than the one the message was sent to
    /// (it crashed and restarted while the message was on its way).
    pub receiver_restarted: bool,
    /// The receiver's current incarnation (its pool's epoch).
    pub receiver_epoch: u32,
    /// The sender and the receiver are partitioned right now.
    pub partitioned: bool,
    /// The driver decided to fail this write (a fault it injects).
    pub injected_failure: bool,
}

/// The world's verdict on one arriving message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival<K> {
    /// The receiver handles it.
    Deliver,
    /// It is not delivered.
    Drop(DropReason),
    /// A KV write fails: nothing of it is applied, and `completion` (a failed
    /// `WriteDone`) travels back to its writer.
    Fail {
        reason: WriteFailure,
        completion: Msg<K>,
    },
}

/// What the wire or the receiving NIC gets wrong about a KV write that lands (a
/// data fault: the completion still says success, the counts still add up, only the
/// contents or the place are wrong). A driver decides *whether* (a rate, a bounded
/// budget) and then calls [`alter`] on a write [`arrival`] delivers; what each fault
/// does is stated here once.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "kebab-case")]
pub enum DataFault {
    /// One page's payload arrives with one slot's token changed
    /// ([`KvPayload::corrupt`]).
    Corrupt,
    /// One page of the write lands at another page of the same node (the next page
    /// id, wrapping within the pool), under the same generation; the page it was
    /// meant for keeps what it held.
    Misdirect,
    /// The write's last page lands its leading half of slots only
    /// ([`KvPayload::tear`]); the rest keep what they held.
    Torn,
    /// The write lands as it is, and a copy of an *earlier* KV write the same node
    /// took (a retransmission from an earlier use of the room or of the page,
    /// delivered late) lands again over the newer contents: with the original's write
    /// id, destination tags (the earlier generation) and payload, as it was sent.
    /// The earlier write already completed, so the writer gets no second completion
    /// ([`duplicate_completion`]). Which earlier write: [`WriteHistory::duplicate`];
    /// [`alter`] leaves the write it strikes unchanged.
    StaleDuplicate,
}

impl DataFault {
    pub const ALL: [DataFault; DataFault::COUNT] = crate::every(DataFault::VARIANTS);

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// What a data fault did to one write: the page of the write it hit (index into the
/// write's pages) and, for a misdirected page, where it went instead. For a stale
/// duplicate: the page of the duplicate that lands over newer contents, `meant` the
/// tag the newer write gave that page, `landed` the duplicate's own (earlier) tag.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
pub struct Altered {
    pub fault: DataFault,
    pub index: usize,
    pub meant: PageTag,
    pub landed: PageTag,
}

/// Apply `fault` to a KV write [`arrival`] delivers to a node whose pool has
/// `receiver_pages` pages; `salt` (a driver's draw, or a fixed value in the model
/// checker) picks the page and the slot. `None` when the fault has nothing to act on
/// (not a write, no pages, a one-page pool for a misdirect) or does not change the
/// write itself (a stale duplicate is a second write: [`WriteHistory::duplicate`]).
#[cfg(feature = "testing")]
pub fn alter<K: KvPayload>(
    msg: &mut Msg<K>,
    fault: DataFault,
    receiver_pages: u32,
    salt: u64,
) -> Option<Altered> {
    let Msg::KvWrite { dst, kv, .. } = msg else {
        return None;
    };
    if dst.is_empty() || dst.len() != kv.len() {
        return None;
    }
    let index = match fault {
        DataFault::StaleDuplicate => return None,
        DataFault::Torn => dst.len() - 1,
        _ => (salt % dst.len() as u64) as usize,
    };
    let meant = dst[index];
    match fault {
        DataFault::Corrupt => kv[index].corrupt(salt >> 8),
        DataFault::Torn => kv[index].tear(),
        DataFault::StaleDuplicate => return None,
        DataFault::Misdirect => {
            if receiver_pages < 2 || meant.page.0 == 0 || meant.page.0 > receiver_pages {
                return None;
            }
            dst[index].page = PageId(meant.page.0 % receiver_pages + 1);
        }
    }
    Some(Altered {
        fault,
        index,
        meant,
        landed: dst[index],
    })
}

/// How many earlier KV writes per receiving node [`WriteHistory`] keeps.
pub const DUPLICATE_WINDOW: usize = 16;

/// The KV writes each node took lately (newest last, at most [`DUPLICATE_WINDOW`]
/// per node), as their writers sent them, for a [`DataFault::StaleDuplicate`]. A
/// driver that draws stale duplicates remembers every write [`arrival`] delivers
/// (before any [`alter`]) and forgets a node's writes when it crashes (the
/// connections a retransmission would ride die with the incarnation). Keyed by node
/// in a `BTreeMap`, so what it returns depends only on what was remembered, in order.
#[derive(Clone, Debug, Default)]
#[cfg(feature = "testing")]
pub struct WriteHistory<K> {
    taken: BTreeMap<NodeId, VecDeque<(NodeId, Msg<K>)>>,
}

#[cfg(feature = "testing")]
impl<K: Clone> WriteHistory<K> {
    pub fn new() -> Self {
        WriteHistory {
            taken: BTreeMap::new(),
        }
    }

    /// `to` took the KV write `msg` of `from` (anything else is ignored).
    pub fn remember(&mut self, from: NodeId, to: NodeId, msg: &Msg<K>) {
        if !matches!(msg, Msg::KvWrite { .. }) {
            return;
        }
        let q = self.taken.entry(to).or_default();
        if q.len() == DUPLICATE_WINDOW {
            q.pop_front();
        }
        q.push_back((from, msg.clone()));
    }

    /// `node` crashed: no write to it or from it can be retransmitted any more.
    pub fn crash(&mut self, node: NodeId) {
        self.taken.remove(&node);
        for q in self.taken.values_mut() {
            q.retain(|(from, _)| *from != node);
        }
    }

    /// The stale duplicate that lands at `to` over the write `newer` (which `to`
    /// takes now, not yet remembered): an earlier write to `to` that addressed one of
    /// the pages `newer` writes (an earlier use of the page), or failing that any
    /// earlier write to `to`; `salt` picks among them. Returns the writer, the
    /// duplicate (as it was sent) and what it does. `None` when `to` took no other
    /// write yet.
    pub fn duplicate(
        &self,
        to: NodeId,
        newer: &Msg<K>,
        salt: u64,
    ) -> Option<(NodeId, Msg<K>, Altered)> {
        let Msg::KvWrite {
            id: new_id,
            dst: new_dst,
            ..
        } = newer
        else {
            return None;
        };
        let earlier: Vec<&(NodeId, Msg<K>)> = self
            .taken
            .get(&to)?
            .iter()
            .filter(|(_, m)| m.write_id() != Some(*new_id))
            .collect();
        let overlap = |m: &Msg<K>| match m {
            Msg::KvWrite { dst, .. } => dst
                .iter()
                .position(|t| new_dst.iter().any(|n| n.page == t.page)),
            _ => None,
        };
        let over: Vec<&(NodeId, Msg<K>)> = earlier
            .iter()
            .copied()
            .filter(|(_, m)| overlap(m).is_some())
            .collect();
        let pool = if over.is_empty() { earlier } else { over };
        let (from, dup) = pool.get((salt % pool.len().max(1) as u64) as usize)?;
        Some((*from, dup.clone(), stale_landing(dup, new_dst)?))
    }
}

/// What the stale duplicate `dup` (a KV write landing again, as it was sent) does
/// over the newer contents `newer` of its receiver (the tags a newer write gives those
/// pages, or the pages' current tags): the first of its pages that `newer` also holds
/// (else its first page) is the one it lands over, `landed` its own (earlier) tag and
/// `meant` the newer tag of that page (its own when `newer` has none). `None` for a
/// message that is not a KV write with pages. The one statement of the fault's record,
/// for [`WriteHistory::duplicate`] and for a driver that keeps a copy of a write
/// itself (the model checker).
#[cfg(feature = "testing")]
pub fn stale_landing<K>(dup: &Msg<K>, newer: &[PageTag]) -> Option<Altered> {
    let Msg::KvWrite { dst, .. } = dup else {
        return None;
    };
    let index = dst
        .iter()
        .position(|t| newer.iter().any(|n| n.page == t.page))
        .unwrap_or(0);
    let landed = *dst.get(index)?;
    let meant = newer
        .iter()
        .find(|n| n.page == landed.page)
        .copied()
        .unwrap_or(landed);
    Some(Altered {
        fault: DataFault::StaleDuplicate,
        index,
        meant,
        landed,
    })
}

/// Is `msg`, sent while a driver delivers the stale duplicate of write `dup`, the
/// receiver's completion of that duplicate? The driver drops it: the writer's NIC
/// completed the write once, when it first landed, and reports nothing for a
/// retransmission it does not know about.
#[cfg(feature = "testing")]
pub fn duplicate_completion<K>(dup: WriteId, msg: &Msg<K>) -> bool {
    matches!(msg, Msg::WriteDone { id, .. } if *id == dup)
}

/// What happens to `msg` as it arrives. One rule for every driver. A write it
/// delivers may then suffer a data fault the driver decided ([`alter`]).
pub fn arrival<K>(msg: &Msg<K>, at: &Arriving) -> Arrival<K> {
    match msg {
        Msg::KvWrite { dst, .. } => {
            if !at.sender_alive {
                return Arrival::Drop(DropReason::SenderCrashed);
            }
            let reason = if at.injected_failure {
                WriteFailure::Injected
            } else if !at.receiver_alive {
                WriteFailure::ReceiverGone
            } else if at.partitioned {
                WriteFailure::Partitioned
            } else if dst.iter().any(|t| t.gen.epoch() != at.receiver_epoch) {
                WriteFailure::StaleRegistration
            } else {
                return Arrival::Deliver;
            };
            match failed_completion(msg) {
                Some(completion) => Arrival::Fail { reason, completion },
                None => Arrival::Deliver,
            }
        }
        // A completion is the sender NIC's own report: a partition cannot lose it. The
        // incarnation that posted the write may be gone: a restarted one still gets
        // it (and must know it is not its own, by the write id's epoch).
        Msg::WriteDone { .. } if at.receiver_restarted => Arrival::Deliver,
        Msg::WriteDone { .. } if !at.receiver_alive => Arrival::Drop(DropReason::ReceiverGone),
        Msg::WriteDone { .. } => Arrival::Deliver,
        // A control message sent to an earlier incarnation reaches the restarted one
        // (a message queue that reconnects delivers what it held, as ZeroMQ, which
        // SGLang's disaggregation uses for its control messages, does): the receiver
        // must ignore what belongs to its earlier incarnation.
        _ if !at.receiver_alive && !at.receiver_restarted => {
            Arrival::Drop(DropReason::ReceiverGone)
        }
        _ if at.partitioned => Arrival::Drop(DropReason::Partitioned),
        _ => Arrival::Deliver,
    }
}

/// `WriteDone { ok: false }` for a KV write, `None` for any other message: the one
/// completion a failed write produces, which travels back to the writer.
pub fn failed_completion<K>(msg: &Msg<K>) -> Option<Msg<K>> {
    match msg {
        Msg::KvWrite { id, .. } => Some(Msg::WriteDone { id: *id, ok: false }),
        _ => None,
    }
}

/// What a crash of `crashed` does to one message in flight from `from` to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashFate<K> {
    /// Unaffected: it travels on.
    Keep,
    /// Lost with the dead incarnation's connections.
    Lose,
    /// A KV write to the dead incarnation: it fails, and this failed completion
    /// travels back to its writer instead.
    FailBack(Msg<K>),
    /// One of the dead incarnation's own KV writes: flushed from its NIC, never applied.
    Flush,
}

/// One rule for every driver: a KV write to the dead incarnation fails back (its
/// memory registration is gone); any other message to it stays on its way and reaches
/// the restarted incarnation late, if it is up by then ([`arrival`]), as a completion
/// of a write the dead one posted does; the dead incarnation's own KV writes are
/// flushed; its control messages travel on.
pub fn crash_fate<K>(crashed: NodeId, from: NodeId, to: NodeId, msg: &Msg<K>) -> CrashFate<K> {
    if to == crashed {
        match failed_completion(msg) {
            Some(done) if from != crashed => CrashFate::FailBack(done),
            Some(_) => CrashFate::Lose,
            None => CrashFate::Keep,
        }
    } else if from == crashed && matches!(msg, Msg::KvWrite { .. }) {
        CrashFate::Flush
    } else {
        CrashFate::Keep
    }
}

/// One message in flight as the crash walk sees it, borrowed from the driver's own
/// record of it.
#[derive(Clone, Copy, Debug)]
pub struct Flying<'a, K> {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: &'a Msg<K>,
    /// The incarnations of its sender and receiver when it was sent, where the driver
    /// records them (`None`: the driver keeps no incarnations with its messages, so
    /// every message to or from the crashed node is the dead incarnation's).
    pub epochs: Option<(u32, u32)>,
    /// A stale duplicate of a KV write that already landed, which the driver replays.
    pub duplicate: bool,
}

/// How a message that a crash left in flight travels on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Travel {
    /// Unaffected by the crash.
    OnItsWay,
    /// On its way to the dead incarnation: it reaches the restarted one, late.
    Late,
}

/// What the crash of `node`'s incarnation `dead` did to what was in flight: the one
/// crash walk of every driver (the simulator's queue, the model checker's network, the
/// harness's flights, the runtime's posted writes). Each message meets
/// [`crash_fate`]; what is taken out of flight is listed here, in the order walked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashWalk<T, K> {
    pub node: NodeId,
    /// The incarnation that died.
    pub dead: u32,
    /// What travels on, in the order walked.
    pub kept: Vec<(T, Travel)>,
    /// The dead incarnation's own KV writes, flushed with its NIC's queue, never
    /// applied: the crash record's `flushed` list.
    pub flushed: Vec<WriteId>,
    /// KV writes to the dead incarnation, each with the failed completion that
    /// travels back to its writer instead.
    pub failed: Vec<(T, Msg<K>)>,
    /// Lost with the dead incarnation's connections.
    pub lost: Vec<T>,
}

impl<T, K> CrashWalk<T, K> {
    /// The crash of `node`'s incarnation `dead`, before anything in flight is walked.
    pub fn new(node: NodeId, dead: u32) -> Self {
        CrashWalk {
            node,
            dead,
            kept: Vec::new(),
            flushed: Vec::new(),
            failed: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// The incarnation that replaces the dead one.
    pub fn epoch(&self) -> u32 {
        self.dead + 1
    }

    /// Walk what a driver holds in flight; `view` says what each entry is (`None`:
    /// not a message, such as a driver's own scheduled event; it stays as it is).
    pub fn walk(
        mut self,
        flights: impl IntoIterator<Item = T>,
        view: impl for<'a> Fn(&'a T) -> Option<Flying<'a, K>>,
    ) -> Self {
        for item in flights {
            self.judge(item, &view);
        }
        self
    }

    /// The writes the dead incarnation posted where they left the driver's hands (the
    /// runtime's [`WritesInFlight`]): each is a KV write from the crashed node, which
    /// [`crash_fate`] flushes. They leave flight, in (receiver, id) order.
    pub fn flush_posted(mut self, writes: &mut WritesInFlight) -> Self {
        self.flushed.extend(writes.crash());
        debug_assert!(writes.is_empty(), "a crash leaves no write in flight");
        self
    }

    /// One message in flight: a stale duplicate to or from the dead incarnation is lost
    /// with its connection (its writer expects no completion for it); a message sent to
    /// or by an earlier incarnation than the dead one is not touched; any other meets
    /// [`crash_fate`].
    fn judge(&mut self, item: T, view: &impl for<'a> Fn(&'a T) -> Option<Flying<'a, K>>) {
        let (node, dead) = (self.node, self.dead);
        let Some(f) = view(&item) else {
            self.kept.push((item, Travel::OnItsWay));
            return;
        };
        let (from, to) = (f.from, f.to);
        if f.duplicate && (to == node || from == node) {
            self.lost.push(item);
            return;
        }
        let of_dead = match f.epochs {
            None => true,
            Some((from_epoch, to_epoch)) => {
                (to == node && to_epoch == dead) || (from == node && from_epoch == dead)
            }
        };
        if !of_dead {
            self.kept.push((item, Travel::OnItsWay));
            return;
        }
        match crash_fate(node, from, to, f.msg) {
            CrashFate::Keep if to == node => self.kept.push((item, Travel::Late)),
            CrashFate::Keep => self.kept.push((item, Travel::OnItsWay)),
            CrashFate::Lose => self.lost.push(item),
            CrashFate::FailBack(done) => self.failed.push((item, done)),
            CrashFate::Flush => {
                let id = f.msg.write_id();
                debug_assert!(id.is_some(), "only a KV write is flushed");
                self.flushed.extend(id);
            }
        }
    }
}

/// A node a driver restarts: a prefill or decode node, or a [`Node`] (never the
/// router). Sealed: only the engine implements it, and only [`restart`] carries it out,
/// so no driver changes a node's state but through `handle` and this one restart.
pub trait Incarnation: sealed::Reincarnate {}

mod sealed {
    /// The engine's own half of [`super::Incarnation`]: out of reach of every driver.
    pub trait Reincarnate {
        fn reincarnate(&mut self, epoch: u32);
    }
}

impl<G: Gpu> sealed::Reincarnate for PrefillNode<G> {
    fn reincarnate(&mut self, epoch: u32) {
        PrefillNode::reincarnate(self, epoch);
    }
}
impl<G: Gpu, P: PageRecords> sealed::Reincarnate for DecodeNode<G, P> {
    fn reincarnate(&mut self, epoch: u32) {
        DecodeNode::reincarnate(self, epoch);
    }
}
impl<G: Gpu, P: PageRecords> sealed::Reincarnate for Node<G, P> {
    fn reincarnate(&mut self, epoch: u32) {
        Node::reincarnate(self, epoch);
    }
}
impl<G: Gpu> Incarnation for PrefillNode<G> {}
impl<G: Gpu, P: PageRecords> Incarnation for DecodeNode<G, P> {}
impl<G: Gpu, P: PageRecords> Incarnation for Node<G, P> {}

/// The restart every driver carries out after a crash ([`CrashWalk`]): `node` becomes
/// its next incarnation, `epoch`, a new process on the same KV memory (its volatile
/// state gone, its page record started over in the new epoch); nothing of the dead
/// incarnation's decisions survives. The driver has already forgotten the dead
/// incarnation's timers and walked its messages. `epoch` must exceed every earlier
/// one.
///
/// # Panics
/// On the router (no driver restarts it) and on an epoch that is not higher.
pub fn restart(node: &mut impl Incarnation, epoch: u32) {
    sealed::Reincarnate::reincarnate(node, epoch);
}

/// The KV writes one writer posted and has not seen complete, by receiver: the rule
/// "exactly one completion per write" for a driver whose writes leave its hands (the
/// hardware runtime's ride TCP, where a broken connection, not the network model, is
/// what fails them). A write enters at [`post`](Self::post) and leaves once: at its
/// completion ([`complete`](Self::complete)), when it fails
/// ([`fail`](Self::fail), [`peer_lost`](Self::peer_lost)) or when its writer crashes
/// ([`crash`](Self::crash)); whatever comes for it afterwards is not its completion.
/// (The simulator, the model checker and the hand-stepped driver hold the messages
/// themselves, so a write's fate there is the fate of its one message.)
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct WritesInFlight {
    posted: BTreeMap<NodeId, BTreeSet<WriteId>>,
}

impl WritesInFlight {
    pub fn new() -> Self {
        Self::default()
    }

    /// `msg` leaves for `to`: a KV write is in flight from now on (any other message
    /// is ignored).
    pub fn post<K>(&mut self, to: NodeId, msg: &Msg<K>) {
        let Msg::KvWrite { id, .. } = msg else {
            return;
        };
        self.post_id(to, *id);
    }

    /// The write `id` left for `to` (as [`post`](Self::post), by its id: a driver that
    /// replays a trace's `KvSent`).
    pub fn post_id(&mut self, to: NodeId, id: WriteId) {
        let fresh = self.posted.entry(to).or_default().insert(id);
        debug_assert!(fresh, "a write id is posted once ({id} to {to})");
    }

    /// A completion of `id` came from `from`: `true` the one time it is the write's
    /// completion (the write leaves flight); `false` when `id` is not in flight to
    /// `from` (completed or failed already, or never posted to it): not a completion.
    pub fn complete(&mut self, from: NodeId, id: WriteId) -> bool {
        self.take(from, id)
    }

    /// The write `id` to `to` failed: `true` the one time it fails (it leaves flight,
    /// and its writer gets one failed completion); `false` when it is not in flight.
    pub fn fail(&mut self, to: NodeId, id: WriteId) -> bool {
        self.take(to, id)
    }

    /// The link to `peer` broke: every write posted on it fails. Taken out of flight
    /// and returned in id order, each for its one failed completion.
    pub fn peer_lost(&mut self, peer: NodeId) -> Vec<WriteId> {
        let lost: Vec<WriteId> = self.posted.remove(&peer).into_iter().flatten().collect();
        debug_assert!(!self.posted.contains_key(&peer));
        lost
    }

    /// The writer crashed: its NIC's queue is flushed with it and its new incarnation
    /// awaits no completion of the dead one's writes. Every write in flight leaves,
    /// returned in (receiver, id) order: the crash record's `flushed` list.
    pub fn crash(&mut self) -> Vec<WriteId> {
        let flushed: Vec<WriteId> = std::mem::take(&mut self.posted)
            .into_values()
            .flatten()
            .collect();
        debug_assert!(self.is_empty());
        flushed
    }

    /// Every write in flight, as (receiver, write), in that order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, WriteId)> + '_ {
        let by_peer = self.posted.iter();
        by_peer.flat_map(|(to, ids)| ids.iter().map(move |id| (*to, *id)))
    }

    pub fn len(&self) -> usize {
        self.posted.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.posted.values().all(BTreeSet::is_empty)
    }

    fn take(&mut self, to: NodeId, id: WriteId) -> bool {
        let Some(ids) = self.posted.get_mut(&to) else {
            return false;
        };
        let taken = ids.remove(&id);
        if ids.is_empty() {
            self.posted.remove(&to);
        }
        taken
    }
}

/// Pending timers of every node, with a driver's token each (`()` when the driver
/// needs none). Setting a timer replaces a pending one of the same value; a crash
/// kills all of a node's timers. Sorted by (node, timer), so equal sets are equal
/// values. Each (node, timer) is kept as its [`TimerKey`], whose integer order is the
/// pair's order, so a lookup compares integers; `Debug` and `Hash` state the pairs,
/// as a list of `((node, timer), token)` would.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Timers<T> {
    pending: Vec<(TimerKey, T)>,
}

impl<T> Timers<T> {
    /// Where the pending timers live (for a cache prefetch hint; never dereferenced).
    pub fn as_ptr(&self) -> *const u8 {
        self.pending.as_ptr().cast()
    }
}

/// A (node, timer) pair as three integers ordered as the pair is (node, then the
/// timer's variant in declaration order, then its fields in order): one-to-one, so
/// equal keys are equal pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct TimerKey {
    /// Node (bits 40..56), variant (32..40), room (0..32).
    head: u64,
    /// The room's generation.
    gen: u64,
    /// A drain retry's arming.
    arming: u32,
}

impl TimerKey {
    fn of(node: NodeId, timer: Timer) -> Self {
        let (variant, room, arming) = timer.parts();
        TimerKey {
            head: u64::from(node.0) << 40 | u64::from(variant) << 32 | u64::from(room.room.0),
            gen: room.gen.0,
            arming,
        }
    }

    fn pair(self) -> (NodeId, Timer) {
        let node = NodeId((self.head >> 40) as u16);
        let room = RoomKey::new(self.head as u32, self.gen);
        let timer = match (self.head >> 32) as u8 {
            0 => Timer::Compute,
            1 => Timer::Bootstrap(room),
            2 => Timer::WaitingForKv(room),
            3 => Timer::DrainRetry(room, self.arming),
            _ => Timer::Request(room),
        };
        (node, timer)
    }
}

impl<T: Debug> Debug for Timers<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: Vec<_> = self.pending.iter().map(|(k, t)| (k.pair(), t)).collect();
        f.debug_struct("Timers").field("pending", &pairs).finish()
    }
}

impl<T: Hash> Hash for Timers<T> {
    /// As the derived hash of a `Vec<((NodeId, Timer), T)>`: its length, then each.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.pending.len());
        for (k, t) in &self.pending {
            (k.pair(), t).hash(state);
        }
    }
}

impl<T> Timers<T> {
    pub fn new() -> Self {
        Timers {
            pending: Vec::new(),
        }
    }

    fn find(&self, key: (NodeId, Timer)) -> Result<usize, usize> {
        let key = TimerKey::of(key.0, key.1);
        self.pending.binary_search_by(|(k, _)| k.cmp(&key))
    }

    /// Apply a node's timer operation; `token` identifies the timer set now.
    pub fn apply(&mut self, node: NodeId, op: TimerOp, token: T) {
        match op {
            TimerOp::Set { timer, .. } => match self.find((node, timer)) {
                Ok(i) => self.pending[i].1 = token,
                Err(i) => self.pending.insert(i, (TimerKey::of(node, timer), token)),
            },
            TimerOp::Cancel { timer } => {
                self.take(node, timer);
            }
        }
    }

    /// Take a pending timer out (it fires, or was cancelled); its token if it was set.
    pub fn take(&mut self, node: NodeId, timer: Timer) -> Option<T> {
        self.find((node, timer))
            .ok()
            .map(|i| self.pending.remove(i).1)
    }

    pub fn get(&self, node: NodeId, timer: Timer) -> Option<&T> {
        self.find((node, timer)).ok().map(|i| &self.pending[i].1)
    }

    /// A crash: every timer of `node` dies.
    pub fn crash(&mut self, node: NodeId) {
        self.pending.retain(|(k, _)| k.pair().0 != node);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Every pending timer, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, Timer)> + '_ {
        self.pending.iter().map(|(k, _)| k.pair())
    }

    /// The pending timers of one node.
    pub fn of(&self, node: NodeId) -> impl Iterator<Item = Timer> + '_ {
        self.iter().filter(move |(n, _)| *n == node).map(|(_, t)| t)
    }
}

/// What a driver provides to carry out one node's effects (`M`: the message form it
/// takes, `T`: the event form; owned `Msg<K>` and `TraceEvent` for most drivers).
pub trait Driver<M, T = TraceEvent> {
    /// `from` sent `msg` to `to`: the driver's network takes it (see [`transport`]).
    fn send(&mut self, from: NodeId, to: NodeId, msg: M);
    /// `node` set or cancelled a timer (see [`Timers::apply`]).
    fn timer(&mut self, node: NodeId, op: TimerOp);
    /// `node` emitted an event (a [`TraceEvent::Fault`] asks the driver to act, see
    /// [`crate::trace::NodeFault::action`]).
    fn event(&mut self, node: NodeId, event: T);
}

/// Carry out the effects of one handler call of `node`, in the order it issued them.
pub fn apply<M, T, D: Driver<M, T>>(
    node: NodeId,
    effects: impl IntoIterator<Item = Effect<M, T>>,
    d: &mut D,
) {
    for effect in effects {
        match effect {
            Effect::Send { to, msg } => d.send(node, to, msg),
            Effect::Timer(op) => d.timer(node, op),
            Effect::Trace(ev) => d.event(node, ev),
            Effect::Compute(job) => panic!(
                "{node} left {job:?} unrun: world::step carries out every compute before apply"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::SymbolicPage;
    use crate::ids::{Generation, RoomKey, WriteId};

    fn write(epoch: u32) -> Msg<()> {
        Msg::KvWrite {
            id: WriteId {
                writer: NodeId(1),
                epoch: 0,
                room: RoomKey::new(1, 1),
                chunk: 0,
            },
            src: vec![],
            dst: vec![PageTag {
                page: PageId(1),
                gen: Generation(Generation::first_of_epoch(epoch).0 + 1),
            }],
            kv: vec![()],
        }
    }

    #[test]
    fn topology_numbers_nodes_as_documented() {
        let t = Topology {
            prefill_pools: vec![4, 5],
            decode_pools: vec![6],
        };
        assert_eq!(t.prefill_ids(), vec![NodeId(1), NodeId(2)]);
        assert_eq!(t.decode_ids(), vec![NodeId(3)]);
        assert_eq!(t.client(), NodeId(4));
        assert_eq!(t.pool(NodeId(2)), Some(5));
        assert_eq!(t.pool(NodeId(3)), Some(6));
        assert_eq!(t.role(NodeId(4)), None);
        assert_eq!(t.nodes().len(), 4);
    }

    /// Both ends alive, nothing in the way.
    const ALIVE: Arriving = Arriving {
        sender_alive: true,
        receiver_alive: true,
        receiver_restarted: false,
        receiver_epoch: 0,
        partitioned: false,
        injected_failure: false,
    };

    #[test]
    fn a_write_fails_back_for_every_reason_and_lands_otherwise() {
        let alive = ALIVE;
        assert_eq!(arrival(&write(0), &alive), Arrival::Deliver);
        let fails = |at: Arriving, why| match arrival(&write(0), &at) {
            Arrival::Fail { reason, completion } => {
                assert_eq!(reason, why);
                assert!(matches!(completion, Msg::WriteDone { ok: false, .. }));
            }
            other => panic!("{other:?}"),
        };
        fails(
            Arriving {
                injected_failure: true,
                ..alive
            },
            WriteFailure::Injected,
        );
        fails(
            Arriving {
                receiver_alive: false,
                ..alive
            },
            WriteFailure::ReceiverGone,
        );
        fails(
            Arriving {
                partitioned: true,
                ..alive
            },
            WriteFailure::Partitioned,
        );
        fails(
            Arriving {
                receiver_epoch: 1,
                ..alive
            },
            WriteFailure::StaleRegistration,
        );
        assert_eq!(
            arrival(
                &write(0),
                &Arriving {
                    sender_alive: false,
                    ..alive
                }
            ),
            Arrival::Drop(DropReason::SenderCrashed)
        );
    }

    #[test]
    fn a_completion_crosses_a_partition_and_a_control_message_does_not() {
        let done: Msg<()> = failed_completion(&write(0)).unwrap();
        let cut = Arriving {
            partitioned: true,
            ..ALIVE
        };
        assert_eq!(arrival(&done, &cut), Arrival::Deliver);
        assert_eq!(
            arrival(
                &Msg::<()>::Abort {
                    room: RoomKey::new(1, 1)
                },
                &cut
            ),
            Arrival::Drop(DropReason::Partitioned)
        );
    }

    #[test]
    fn what_was_on_its_way_to_a_crashed_node_reaches_its_next_incarnation() {
        let (p, d) = (NodeId(1), NodeId(2));
        let room = RoomKey::new(1, 1);
        let abort = Msg::<()>::Abort { room };
        let done: Msg<()> = failed_completion(&write(0)).unwrap();
        // At the crash of d: a write to it fails back, anything else to it travels on.
        assert!(matches!(
            crash_fate(d, p, d, &write(0)),
            CrashFate::FailBack(_)
        ));
        assert_eq!(crash_fate(d, NodeId(0), d, &abort), CrashFate::Keep);
        assert_eq!(crash_fate(p, d, p, &done), CrashFate::Keep);
        assert_eq!(crash_fate(p, p, d, &write(0)), CrashFate::Flush);
        // Arriving at the restarted incarnation: delivered; at a node still down: lost.
        let restarted = Arriving {
            sender_alive: true,
            receiver_alive: false,
            receiver_restarted: true,
            receiver_epoch: 1,
            partitioned: false,
            injected_failure: false,
        };
        assert_eq!(arrival(&abort, &restarted), Arrival::Deliver);
        assert_eq!(arrival(&done, &restarted), Arrival::Deliver);
        assert!(matches!(
            arrival(&write(0), &restarted),
            Arrival::Fail { .. }
        ));
        let down = Arriving {
            receiver_restarted: false,
            ..restarted
        };
        assert_eq!(
            arrival(&abort, &down),
            Arrival::Drop(DropReason::ReceiverGone)
        );
        assert_eq!(
            arrival(&done, &down),
            Arrival::Drop(DropReason::ReceiverGone)
        );
    }

    /// [`write`], written by `writer` as its chunk `chunk`.
    fn write_of(writer: NodeId, chunk: u32) -> Msg<()> {
        match write(0) {
            Msg::KvWrite {
                mut id,
                src,
                dst,
                kv,
            } => {
                id.writer = writer;
                id.chunk = chunk;
                Msg::KvWrite { id, src, dst, kv }
            }
            m => m,
        }
    }

    #[test]
    fn the_crash_walk_judges_each_message_in_flight_once() {
        let (r, p, d) = (ROUTER, NodeId(1), NodeId(2));
        let abort = Msg::<()>::Abort {
            room: RoomKey::new(1, 1),
        };
        let own = |chunk| write_of(d, chunk);
        // (from, to, message, epochs at sending, a stale duplicate), walked at the crash
        // of d's incarnation 1.
        let flights = vec![
            (p, d, write(0), Some((0, 1)), false), // to the dead one: fails back
            (d, p, own(7), Some((1, 0)), false),   // its own write: flushed
            (r, d, abort.clone(), Some((0, 1)), false), // to the dead one: late
            (r, p, abort.clone(), Some((0, 0)), false), // elsewhere: on its way
            (r, d, abort.clone(), Some((0, 0)), false), // to an earlier one: untouched
            (p, d, write(0), Some((0, 1)), true),  // a stale duplicate: lost
            (p, d, write(0), None, false),         // no epochs kept: the dead one's
        ];
        let walk = CrashWalk::new(d, 1).walk(flights.clone(), |(from, to, msg, epochs, dup)| {
            Some(Flying {
                from: *from,
                to: *to,
                msg,
                epochs: *epochs,
                duplicate: *dup,
            })
        });
        let travel: Vec<(usize, Travel)> = walk
            .kept
            .iter()
            .map(|(f, t)| (flights.iter().position(|g| g == f).unwrap(), *t))
            .collect();
        assert_eq!(
            travel,
            vec![
                (2, Travel::Late),
                (3, Travel::OnItsWay),
                (4, Travel::OnItsWay)
            ]
        );
        assert_eq!(
            walk.flushed,
            own(7).write_id().into_iter().collect::<Vec<_>>()
        );
        assert_eq!(
            walk.failed.len(),
            2,
            "both writes to the dead incarnation fail back"
        );
        assert!(walk
            .failed
            .iter()
            .all(|(f, done)| f.0 == p && *done == failed_completion(&write(0)).unwrap()));
        assert_eq!(walk.lost.len(), 1);
        assert!(walk.lost[0].4, "the stale duplicate is lost");
        assert_eq!(walk.epoch(), 2);
    }

    #[test]
    fn a_crash_walk_flushes_posted_writes_and_keeps_what_is_no_message() {
        let (p, d) = (NodeId(1), NodeId(2));
        // A driver whose writes left its hands: every posted write is flushed.
        let mut posted = WritesInFlight::new();
        posted.post(p, &write_of(d, 3));
        let walk = CrashWalk::<(), ()>::new(d, 1).flush_posted(&mut posted);
        assert_eq!(
            walk.flushed,
            write_of(d, 3).write_id().into_iter().collect::<Vec<_>>()
        );
        assert!(posted.is_empty());
        // Not a message: it stays as it is.
        let walk = CrashWalk::<u8, ()>::new(d, 1).walk([9u8], |_| None);
        assert_eq!(walk.kept, vec![(9, Travel::OnItsWay)]);
    }

    #[test]
    fn data_faults_change_one_page_of_a_write_as_stated() {
        let page = |t: u32| SymbolicPage {
            tokens: vec![t; 4],
            tag: None,
        };
        let tag = |p: u32| PageTag {
            page: PageId(p),
            gen: Generation(3),
        };
        let w = || Msg::KvWrite {
            id: WriteId {
                writer: NodeId(1),
                epoch: 0,
                room: RoomKey::new(1, 1),
                chunk: 0,
            },
            src: vec![],
            dst: vec![tag(4), tag(8)],
            kv: vec![page(10), page(20)],
        };
        let parts = |m: &Msg<SymbolicPage>| match m {
            Msg::KvWrite { dst, kv, .. } => (dst.clone(), kv.clone()),
            _ => unreachable!(),
        };
        // Misdirect: the page goes to the next page id, wrapping in the pool.
        let mut m = w();
        let a = alter(&mut m, DataFault::Misdirect, 8, 1).unwrap();
        assert_eq!((a.index, a.meant, a.landed), (1, tag(8), tag(1)));
        assert_eq!(parts(&m).0, vec![tag(4), tag(1)]);
        // Torn: the last page keeps its leading half.
        let mut m = w();
        let a = alter(&mut m, DataFault::Torn, 8, 0).unwrap();
        assert_eq!(a.index, 1);
        assert_eq!(parts(&m).1[1].tokens, vec![20, 20]);
        assert_eq!(parts(&m).1[0].tokens.len(), 4);
        // Corrupt: one slot of one page differs.
        let mut m = w();
        let a = alter(&mut m, DataFault::Corrupt, 8, 0).unwrap();
        let (_, kv) = parts(&m);
        let changed = kv[a.index]
            .tokens
            .iter()
            .filter(|t| **t != [10, 20][a.index])
            .count();
        assert_eq!(changed, 1);
        // Nothing to act on: a one-page pool, a control message.
        assert_eq!(alter(&mut w(), DataFault::Misdirect, 1, 0), None);
        let mut abort = Msg::<SymbolicPage>::Abort {
            room: RoomKey::new(1, 1),
        };
        assert_eq!(alter(&mut abort, DataFault::Corrupt, 8, 0), None);
    }

    /// The writer and the receiver of the stale-duplicate tests.
    const DUP_FROM: NodeId = NodeId(1);
    const DUP_TO: NodeId = NodeId(3);

    fn tag_at(page: u32, gen: u64) -> PageTag {
        PageTag {
            page: PageId(page),
            gen: Generation(gen),
        }
    }

    /// A write by [`DUP_FROM`] of chunk `chunk` of room `room` to `dst`, every page
    /// filled with `fill`.
    fn filled_write(room: u32, chunk: u32, dst: Vec<PageTag>, fill: u32) -> Msg<SymbolicPage> {
        Msg::KvWrite {
            id: WriteId {
                writer: DUP_FROM,
                epoch: 0,
                room: RoomKey::new(room, 1),
                chunk,
            },
            src: vec![],
            kv: dst
                .iter()
                .map(|_| SymbolicPage {
                    tokens: vec![fill; 4],
                    tag: None,
                })
                .collect(),
            dst,
        }
    }

    /// A history of three writes from [`DUP_FROM`]: two to [`DUP_TO`] (the first to
    /// pages 5 and 6 at generation 2), one to another node; and that first write.
    fn three_writes() -> (WriteHistory<SymbolicPage>, Msg<SymbolicPage>) {
        let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
        let mut h: WriteHistory<SymbolicPage> = WriteHistory::new();
        let first = w(1, 0, vec![tag(5, 2), tag(6, 2)], 10);
        assert!(h.duplicate(d, &first, 0).is_none(), "nothing taken yet");
        h.remember(p, d, &first);
        h.remember(p, d, &w(2, 0, vec![tag(1, 2)], 20));
        h.remember(p, NodeId(4), &w(9, 0, vec![tag(6, 2)], 90));
        (h, first)
    }

    #[test]
    fn a_stale_duplicate_replays_an_earlier_write_of_a_page_being_rewritten() {
        let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
        let (mut h, first) = three_writes();
        // A newer use of page 6: the duplicate is the earlier write to page 6 at
        // node d, whatever the salt, carried as it was sent.
        let newer = w(3, 0, vec![tag(6, 4)], 30);
        for salt in 0..4 {
            let (from, dup, a) = h.duplicate(d, &newer, salt).unwrap();
            assert_eq!((from, dup.clone()), (p, first.clone()));
            assert_eq!(a.fault, DataFault::StaleDuplicate);
            assert_eq!((a.index, a.meant, a.landed), (1, tag(6, 4), tag(6, 2)));
        }
        // No earlier write shares a page: any earlier write to d, never the write itself.
        let elsewhere = w(4, 0, vec![tag(9, 4)], 40);
        let ids: Vec<_> = (0..4)
            .map(|s| h.duplicate(d, &elsewhere, s).unwrap().1.write_id())
            .collect();
        assert!(ids.contains(&first.write_id()));
        assert!(!ids.contains(&elsewhere.write_id()));
        h.remember(p, d, &elsewhere);
        assert_ne!(
            h.duplicate(d, &elsewhere, 0).unwrap().1.write_id(),
            elsewhere.write_id()
        );
    }

    #[test]
    fn the_duplicate_window_is_bounded_and_a_writer_crash_forgets() {
        let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
        let (mut h, first) = three_writes();
        let newer = w(3, 0, vec![tag(6, 4)], 30);
        // Bounded: only the last DUPLICATE_WINDOW writes are kept.
        for c in 0..DUPLICATE_WINDOW as u32 {
            h.remember(p, d, &w(7, c, vec![tag(2, 2)], 70));
        }
        assert_ne!(
            h.duplicate(d, &newer, 0).unwrap().1.write_id(),
            first.write_id()
        );
        // A crash of the writer forgets its writes; alter leaves the write unchanged.
        h.crash(p);
        assert!(h.duplicate(d, &newer, 0).is_none());
        let mut m = newer.clone();
        assert_eq!(alter(&mut m, DataFault::StaleDuplicate, 8, 0), None);
        assert_eq!(m, newer);
        // The duplicate's completion is the one the driver drops.
        let id = first.write_id().unwrap();
        assert!(duplicate_completion(
            id,
            &Msg::<()>::WriteDone { id, ok: true }
        ));
        assert!(!duplicate_completion(
            id,
            &Msg::<()>::WriteDone {
                id: newer.write_id().unwrap(),
                ok: true
            }
        ));
    }

    #[test]
    fn a_crash_keeps_fails_back_or_flushes() {
        let (p, d, r) = (NodeId(1), NodeId(2), NodeId(0));
        assert!(matches!(
            crash_fate(d, p, d, &write(0)),
            CrashFate::FailBack(Msg::WriteDone { ok: false, .. })
        ));
        assert_eq!(crash_fate(p, p, d, &write(0)), CrashFate::Flush);
        let abort = Msg::<()>::Abort {
            room: RoomKey::new(1, 1),
        };
        // To the dead incarnation: it reaches the restarted one (it used to be lost).
        assert_eq!(crash_fate(d, r, d, &abort), CrashFate::Keep);
        assert_eq!(crash_fate(d, r, p, &abort), CrashFate::Keep);
    }

    /// A timer's key orders as its (node, timer) pair and gives the pair back, for
    /// every variant and at the ends of each field's range.
    #[test]
    fn timer_keys_order_as_their_pairs() {
        let rooms = [
            RoomKey::new(0, 0),
            RoomKey::new(1, 7),
            RoomKey::new(1, u64::MAX),
            RoomKey::new(u32::MAX, 0),
        ];
        let mut pairs = vec![];
        for node in [NodeId(0), NodeId(3), NodeId(u16::MAX)] {
            pairs.push((node, Timer::Compute));
            for r in rooms {
                pairs.push((node, Timer::Bootstrap(r)));
                pairs.push((node, Timer::WaitingForKv(r)));
                pairs.push((node, Timer::Request(r)));
                for n in [0, 1, u32::MAX] {
                    pairs.push((node, Timer::DrainRetry(r, n)));
                }
            }
        }
        for a in &pairs {
            assert_eq!(TimerKey::of(a.0, a.1).pair(), *a);
            for b in &pairs {
                assert_eq!(
                    TimerKey::of(a.0, a.1).cmp(&TimerKey::of(b.0, b.1)),
                    a.cmp(b),
                    "{a:?} against {b:?}"
                );
            }
        }
    }

    #[test]
    fn timers_replace_cancel_and_die_with_their_node() {
        let mut t: Timers<u64> = Timers::new();
        let set = TimerOp::Set {
            timer: Timer::Compute,
            after_ns: 1,
        };
        t.apply(NodeId(1), set, 1);
        t.apply(NodeId(1), set, 2);
        t.apply(NodeId(2), set, 3);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(NodeId(1), Timer::Compute), Some(&2));
        t.apply(
            NodeId(2),
            TimerOp::Cancel {
                timer: Timer::Compute,
            },
            0,
        );
        assert_eq!(t.take(NodeId(2), Timer::Compute), None);
        t.crash(NodeId(1));
        assert!(t.is_empty());
    }

    fn posted(chunk: u32) -> (WriteId, Msg<()>) {
        let id = WriteId {
            writer: NodeId(1),
            epoch: 0,
            room: RoomKey::new(1, 1),
            chunk,
        };
        let msg = Msg::KvWrite {
            id,
            src: vec![],
            dst: vec![],
            kv: vec![],
        };
        (id, msg)
    }

    #[test]
    fn a_write_in_flight_leaves_once() {
        let (a, b, c) = (posted(0), posted(1), posted(2));
        let (d1, d2) = (NodeId(2), NodeId(3));
        let mut w = WritesInFlight::new();
        w.post(d1, &a.1);
        w.post(d1, &b.1);
        w.post(d2, &c.1);
        w.post(d1, &Msg::<()>::DrainAck { room: a.0.room });
        assert_eq!(w.len(), 3, "only KV writes are in flight");
        assert!(
            !w.complete(d2, a.0),
            "a completion from another node is not a's"
        );
        assert!(w.complete(d1, a.0));
        assert!(!w.complete(d1, a.0), "a write completes once");
        assert!(!w.fail(d1, a.0), "a completed write does not fail");
        assert_eq!(
            w.peer_lost(d1),
            vec![b.0],
            "the writes still in flight to d1"
        );
        assert!(
            !w.complete(d1, b.0),
            "a write failed back does not complete"
        );
        assert_eq!(w.peer_lost(d1), Vec::<WriteId>::new());
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![(d2, c.0)]);
        assert_eq!(
            w.crash(),
            vec![c.0],
            "a crash flushes every write in flight"
        );
        assert!(w.is_empty());
        assert!(!w.fail(d2, c.0), "a flushed write does not fail back");
    }
}
