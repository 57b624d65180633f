//! `Simulator`: the seeded discrete-event simulator of one run.
//!
//! It owns the engine's nodes, a virtual clock, an event queue ordered by (virtual
//! time, sequence number), the faulty network ([`crate::net`]), the fault schedule of
//! the [`Plan`] (partitions, crashes and restarts, the heal), the clients (submits,
//! aborts and disconnects at drawn phases of a request) and the [`Oracle`]. It feeds
//! each node one input at a time through [`Node::handle`] with an [`Outbox`] and
//! carries out the recorded effects afterwards: messages through the network model,
//! timers onto the queue (a replaced or cancelled timer is recognised by its token and
//! never fires). Nothing here reads a wall clock or an unseeded random source, so a
//! run is a pure function of its plan: same seed, same trace, byte for byte.
//!
//! Node incarnations: a crash kills the node's incarnation (its timers, its queued
//! writes, the connections messages to it were sent on); a restart brings up the next
//! one with an empty pool whose page generations lie in the new epoch. A message sent
//! to an incarnation that is gone is never delivered; a KV write from one is flushed,
//! never applied; a KV write addressed with page tags of an earlier incarnation fails
//! (its memory registration no longer exists), as RDMA would.
//!
//! Two phases: until the plan's heal instant faults are on (safety phase); then the
//! network delivers everything after its base latency, partitions are over and
//! crashed nodes are up, and the run must drain by the plan's deadline (liveness).

use crate::hash::TraceHash;
use crate::net::{ControlFate, NetModel, WriteFate};
use crate::plan::{Partition, Plan};
use crate::queue::EventQueue;
use crate::scenario::{CancelAt, PlannedRequest, ReqPhase};
use crate::stall::ClockRates;
use kvsim_engine::env::{Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, Token, WriteId};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::trace::{FaultAction, Side, TraceEvent};
use kvsim_engine::world::{
    self as env_world, Altered, Arrival, Arriving, CrashWalk, DataFault, Driver, DropReason,
    Flying, KvTransport, Timers, Topology, Transport, Travel, WriteFailure, WriteHistory,
};
use kvsim_engine::Cfg;
use kvsim_oracle::schema::{
    CancelHow, ClockKind, EndOutcome, Entry, FaultEvent, MsgView, Record, RunHeader,
};
use kvsim_oracle::Oracle;
use std::collections::BTreeMap;
use std::hash::Hash;

/// Something scheduled to happen.
#[derive(Clone, Debug)]
enum Pending<K> {
    Deliver {
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        /// Not boxed: the queue moves keys, never the event ([`EventQueue`]).
        msg: Msg<K>,
        /// A KV write whose failure was decided when it was sent.
        doomed: bool,
        /// A data fault the KV write suffers if it lands, with its salt.
        data: Option<(DataFault, u64)>,
        /// This KV write is a stale duplicate of an earlier one, and what it does
        /// ([`WriteHistory::duplicate`]).
        replay: Option<Altered>,
    },
    Fire {
        node: NodeId,
        timer: Timer,
        token: u64,
    },
    Submit {
        req: RequestId,
    },
    Cancel {
        req: RequestId,
        how: CancelHow,
    },
    Crash {
        node: NodeId,
        restart_ns: u64,
    },
    Restart {
        node: NodeId,
    },
    /// The node freezes for `len_ns` now, or is armed to freeze at its next transfer
    /// step ([`crate::stall::PausePlan`]).
    Pause {
        node: NodeId,
        len_ns: u64,
        on_transfer: bool,
    },
    PartitionStart(Partition),
    PartitionEnd(Partition),
    Heal,
}

/// A queued event as the crash walk takes it out of the queue.
struct Queued<K> {
    at_ns: u64,
    seq: u64,
    ev: Pending<K>,
}

/// A queued event as the crash walk sees it: a delivery is a message in flight (a
/// replayed one a stale duplicate); any other event is not a message.
fn flying<K>(q: &Queued<K>) -> Option<Flying<'_, K>> {
    let Pending::Deliver {
        from,
        to,
        from_epoch,
        to_epoch,
        msg,
        replay,
        ..
    } = &q.ev
    else {
        return None;
    };
    Some(Flying {
        from: *from,
        to: *to,
        msg,
        epochs: Some((*from_epoch, *to_epoch)),
        duplicate: replay.is_some(),
    })
}

/// The message of a queued delivery (the ones the crash walk took out of flight).
fn delivery<K>(q: &Queued<K>) -> Option<(NodeId, NodeId, &Msg<K>)> {
    match &q.ev {
        Pending::Deliver { from, to, msg, .. } => Some((*from, *to, msg)),
        _ => None,
    }
}

/// A reply as the client received it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClientReply {
    pub status: Status,
    pub tokens: Vec<Token>,
}

/// Counters of what the faults did in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultStats {
    pub messages: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub dropped: u64,
    pub writes: u64,
    pub writes_failed: u64,
    pub writes_late: u64,
    pub writes_flushed: u64,
    pub crashes: u64,
    /// Pauses that froze a live node.
    pub pauses: u64,
    pub cancels: u64,
    /// Engine paths hit and cancel phases fired (the sweep's coverage summary).
    pub coverage: crate::coverage::RunCoverage,
    /// KV writes that landed with a data fault (corrupted, misdirected, torn), and
    /// stale duplicates that landed (delivered to their node; the gate may refuse them).
    pub data_faults: u64,
    /// Of those: corrupted, misdirected and torn writes, and stale duplicates.
    pub corrupted: u64,
    pub misdirected: u64,
    pub torn: u64,
    pub stale_duplicates: u64,
    /// Control messages of an earlier use redelivered at a room number's reuse (also
    /// counted in `duplicated`).
    pub stale_replayed: u64,
}

/// Where a run's trace goes besides the oracle.
pub trait TraceSink {
    fn line(&mut self, line: &str);
    /// An entry: its JSON line, unless the sink reads entries as they are (an audit
    /// handed the run in memory).
    fn entry(&mut self, e: &Entry) {
        self.line(&kvsim_oracle::schema::entry_line(e));
    }
}

impl TraceSink for Vec<String> {
    fn line(&mut self, line: &str) {
        self.push(line.to_string());
    }
}

/// A room number's latest use and its control messages as sent (from, to, message).
/// A room use's remembered control messages: sender, receiver, the pair's incarnations
/// at the send, the message.
type LastUse<K> = (RoomKey, Vec<(NodeId, NodeId, (u32, u32), Msg<K>)>);

/// The driver of one run.
pub struct Simulator<G: Gpu> {
    now_ns: u64,
    seq: u64,
    events: u64,
    queue: EventQueue<Pending<G::Kv>>,
    nodes: Vec<Node<G>>,
    /// Current incarnation of each node (index = node id; the client's entry too).
    epochs: Vec<u32>,
    down: Vec<bool>,
    /// Until when each node is frozen (index = node id; 0: running).
    paused_until: Vec<u64>,
    /// Pauses waiting for their node's next transfer step: (node, length).
    armed_pauses: Vec<(NodeId, u64)>,
    /// Each node's clock rate: scales the timers it sets.
    clocks: ClockRates,
    /// Whether a KV write lands in a frozen receiver's memory (one-sided).
    transport: KvTransport,
    router: NodeId,
    client: NodeId,
    timers: Timers<u64>,
    net: NetModel,
    partitions: Vec<Partition>,
    requests: Vec<PlannedRequest>,
    room_req: BTreeMap<RoomKey, RequestId>,
    /// Phase-triggered cancels not yet triggered.
    armed: BTreeMap<RequestId, (ReqPhase, u64, CancelHow)>,
    replies: BTreeMap<RequestId, Vec<ClientReply>>,
    header: RunHeader,
    oracle: Oracle,
    outbox: Outbox<G::Kv>,
    /// The node whose effects are being applied (for `Driver`).
    log: Option<Vec<Entry>>,
    /// Every entry as a JSON line, header first (`--trace-json`, `--audit`).
    json: Option<Box<dyn TraceSink>>,
    /// The run's trace hash, where someone reads it ([`Simulator::without_trace_hash`]).
    hash: Option<TraceHash>,
    heal_at_ns: Option<u64>,
    slow_writer: Option<(NodeId, u64)>,
    /// Per room number, the control messages of its latest use (at most 8), for the
    /// stale replay at its next reuse.
    last_use: BTreeMap<u32, LastUse<G::Kv>>,
    /// The use before the latest, per room number.
    prev_use: BTreeMap<u32, LastUse<G::Kv>>,
    /// The KV writes each node took lately, for stale duplicates (kept only when
    /// they are drawn).
    history: WriteHistory<G::Kv>,
    /// The write whose stale duplicate is being delivered: its receiver's completion
    /// is dropped ([`env_world::duplicate_completion`]).
    replaying: Option<WriteId>,
    deadline_ns: u64,
    max_events: u64,
    stats: FaultStats,
    /// The protocol paths the run reached ([`crate::reach`]), fed as entries happen.
    reach: crate::reach::ReachTracker,
}

impl<G: Gpu> Simulator<G> {
    /// Build the topology of `plan` (router 0, prefill nodes, decode nodes, then the
    /// client endpoint) and schedule its workload and faults. `make_gpu(pages,
    /// page_size)` builds each node's KV memory. With `trace`, every entry is also kept
    /// in memory ([`Simulator::take_log`]).
    pub fn new(plan: &Plan, make_gpu: impl Fn(u32, u32) -> G, trace: bool) -> Self {
        let cfg = Cfg::new(plan.engine.clone());
        let topology = Topology {
            prefill_pools: plan.prefill_pools.clone(),
            decode_pools: plan.decode_pools.clone(),
        };
        let nodes = topology.build(&cfg, make_gpu);
        let client = topology.client();
        let mut requests = plan.requests.clone();
        requests.sort_by_key(|r| r.req);
        let mut header = RunHeader::new("kvsim-sim", ClockKind::Simulated, &plan.engine, &topology);
        header.scenario = Some(plan.scenario.clone());
        header.seed = Some(plan.seed);
        header.cleanup_bound_ns = plan.cleanup_bound_ns;
        let oracle = Oracle::new(header.clone());
        let n = nodes.len() + 1;
        let mut w = Simulator {
            now_ns: 0,
            seq: 0,
            events: 0,
            queue: EventQueue::default(),
            nodes,
            epochs: vec![0; n],
            down: vec![false; n],
            paused_until: vec![0; n],
            armed_pauses: Vec::new(),
            clocks: plan.clocks.clone(),
            transport: plan.engine.transport,
            router: env_world::ROUTER,
            client,
            timers: Timers::new(),
            net: NetModel::new(plan.seed, plan.net.clone()),
            partitions: plan.partitions.clone(),
            requests: requests.clone(),
            room_req: BTreeMap::new(),
            armed: BTreeMap::new(),
            replies: BTreeMap::new(),
            header,
            oracle,
            outbox: Outbox::new(0),
            log: trace.then(Vec::new),
            json: None,
            hash: Some(TraceHash::default()),
            heal_at_ns: plan.heal_at_ns,
            slow_writer: plan.slow_writer,
            last_use: BTreeMap::new(),
            prev_use: BTreeMap::new(),
            history: WriteHistory::new(),
            replaying: None,
            deadline_ns: plan.deadline_ns,
            max_events: plan.max_events,
            stats: FaultStats::default(),
            reach: crate::reach::ReachTracker::default(),
        };
        w.schedule_workload(&requests);
        w.schedule_faults(plan);
        w
    }

    /// Queue each request's submit and its client's cancel: a timed cancel as an
    /// event, a cancel at a phase armed until the phase is reached.
    fn schedule_workload(&mut self, requests: &[PlannedRequest]) {
        for r in requests {
            self.push(r.at_ns, Pending::Submit { req: r.req });
            if let Some(c) = r.cancel {
                match c.at {
                    CancelAt::AfterNs(after) => self.push(
                        r.at_ns.saturating_add(after),
                        Pending::Cancel {
                            req: r.req,
                            how: c.how,
                        },
                    ),
                    CancelAt::Phase { phase, delay_ns } => {
                        self.armed.insert(r.req, (phase, delay_ns, c.how));
                    }
                }
            }
        }
    }

    /// Queue the plan's partition windows, crashes and the heal.
    fn schedule_faults(&mut self, plan: &Plan) {
        for p in &plan.partitions {
            self.push(p.from_ns, Pending::PartitionStart(*p));
            self.push(p.until_ns, Pending::PartitionEnd(*p));
        }
        for c in &plan.crashes {
            self.push(
                c.at_ns,
                Pending::Crash {
                    node: c.node,
                    restart_ns: c.restart_ns,
                },
            );
        }
        for p in &plan.pauses {
            self.push(
                p.at_ns,
                Pending::Pause {
                    node: p.node,
                    len_ns: p.len_ns,
                    on_transfer: p.on_transfer,
                },
            );
        }
        if let Some(h) = plan.heal_at_ns {
            self.push(h, Pending::Heal);
        }
    }

    /// Keep no trace hash: for a run whose hash nobody reads (a sweep's seed that
    /// finds nothing). The run itself is the same; [`Simulator::trace_hash`] is `None`.
    pub fn without_trace_hash(mut self) -> Self {
        self.hash = None;
        self
    }

    /// Also write every entry as a JSON line to `sink`, the header first.
    pub fn with_json(mut self, mut sink: Box<dyn TraceSink>) -> Self {
        sink.line(&kvsim_oracle::schema::header_line(&self.header));
        self.json = Some(sink);
        self
    }

    fn push(&mut self, at_ns: u64, ev: Pending<G::Kv>) {
        self.seq += 1;
        self.queue.push(at_ns, self.seq, ev);
    }

    /// Is anybody besides the oracle reading the trace?
    fn traced(&self) -> bool {
        self.log.is_some() || self.json.is_some()
    }

    /// An entry for the readers of the trace only (the oracle judges nothing by it):
    /// built only when someone reads the trace.
    fn record(&mut self, rec: impl FnOnce() -> Record) {
        if self.traced() {
            self.write(rec());
        }
    }

    /// A message that never reached its node, for the trace (when traced).
    fn record_drop(&mut self, (from, to): (NodeId, NodeId), msg: &Msg<G::Kv>, why: DropReason) {
        self.record(|| Record::Drop {
            from,
            to,
            msg: MsgView::of(msg),
            reason: why,
        });
    }

    /// An entry the oracle judges: always built.
    fn emit(&mut self, rec: Record) {
        let e = Entry {
            at_ns: self.now_ns,
            seq: self.events,
            rec,
        };
        let found: Vec<Record> = if self.traced() {
            self.oracle
                .observe(&e)
                .iter()
                .map(Record::violation)
                .collect()
        } else {
            self.oracle.observe(&e);
            Vec::new()
        };
        if self.traced() {
            self.write_entry(e);
            for rec in found {
                self.write(rec);
            }
        }
    }

    fn write(&mut self, rec: Record) {
        let e = Entry {
            at_ns: self.now_ns,
            seq: self.events,
            rec,
        };
        self.write_entry(e);
    }

    fn write_entry(&mut self, e: Entry) {
        if let Some(sink) = &mut self.json {
            sink.entry(&e);
        }
        if let Some(log) = &mut self.log {
            log.push(e);
        }
    }

    pub fn nodes(&self) -> &[Node<G>] {
        &self.nodes
    }
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
    }
    pub fn header(&self) -> &RunHeader {
        &self.header
    }
    pub fn replies(&self) -> &BTreeMap<RequestId, Vec<ClientReply>> {
        &self.replies
    }
    pub fn requests(&self) -> &[PlannedRequest] {
        &self.requests
    }
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }
    pub fn events(&self) -> u64 {
        self.events
    }
    pub fn stats(&self) -> FaultStats {
        let mut stats = self.stats;
        stats.coverage.reach = self.reach.reached();
        stats
    }
    /// The digest of every input handed to a node and every event a node emitted
    /// (`None` when the run kept none).
    pub fn trace_hash(&self) -> Option<u64> {
        self.hash.as_ref().map(TraceHash::digest)
    }
    pub fn take_log(&mut self) -> Vec<Entry> {
        self.log.take().unwrap_or_default()
    }
    /// Which request each room use served.
    pub fn room_requests(&self) -> &BTreeMap<RoomKey, RequestId> {
        &self.room_req
    }

    fn request(&self, req: RequestId) -> Option<&PlannedRequest> {
        self.requests
            .binary_search_by_key(&req, |r| r.req)
            .ok()
            .map(|i| &self.requests[i])
    }

    fn partitioned(&self, a: NodeId, b: NodeId) -> bool {
        let now = self.now_ns;
        self.partitions.iter().any(|p| {
            ((p.prefill == a && p.decode == b) || (p.prefill == b && p.decode == a))
                && p.from_ns <= now
                && now < p.until_ns
        })
    }

    /// The time of the next event that will do something (skipping stale timers).
    fn next_live(&mut self) -> Option<u64> {
        loop {
            let (at_ns, ev) = self.queue.peek()?;
            if let Pending::Fire { node, timer, token } = ev {
                if self.timers.get(*node, *timer) != Some(token) {
                    self.queue.pop();
                    continue;
                }
            }
            return Some(at_ns);
        }
    }

    /// Process one event. `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        self.next_live().is_some() && self.step_live()
    }

    /// Process the event at the head of the queue, which [`Simulator::next_live`] has
    /// just found live.
    fn step_live(&mut self) -> bool {
        let Some((at_ns, _, ev)) = self.queue.pop() else {
            return false;
        };
        self.now_ns = at_ns;
        self.events += 1;
        if let Some(wake) = self.held_until(&ev) {
            // Waits in the frozen node's queues; in order, behind what waits already.
            self.push(wake, ev);
            return true;
        }
        match ev {
            Pending::Submit { req } => self.on_submit(req),
            Pending::Cancel { req, how } => {
                self.stats.cancels += 1;
                let cancel = self.request(req).and_then(|r| r.cancel);
                if let Some(c) = &cancel {
                    self.stats.coverage.cancel(c);
                }
                let plan = cancel.map_or_else(String::new, |c| c.to_string());
                self.emit(Record::ClientCancel { req, how, plan });
                let (client, router) = (self.client, self.router);
                self.send(client, router, Msg::Cancel { req });
            }
            Pending::Deliver {
                from,
                to,
                from_epoch,
                to_epoch,
                msg,
                doomed,
                data,
                replay,
            } => match replay {
                Some(a) => self.deliver_duplicate(from, to, from_epoch, to_epoch, msg, a),
                None => self.deliver(from, to, from_epoch, to_epoch, msg, doomed, data),
            },
            Pending::Fire { node, timer, .. } => {
                self.timers.take(node, timer);
                self.record(|| Record::TimerFire { node, timer });
                self.reach.handling_timer(Some((node, timer)));
                self.dispatch(node, Input::Timer(timer));
                self.reach.handling_timer(None);
            }
            Pending::Crash { node, restart_ns } => self.crash(node, restart_ns),
            Pending::Restart { node } => self.restart(node),
            Pending::Pause {
                node,
                len_ns,
                on_transfer,
            } => self.on_pause(node, len_ns, on_transfer),
            Pending::PartitionStart(p) => self.record(|| {
                Record::Fault(FaultEvent::PartitionStart {
                    prefill: p.prefill,
                    decode: p.decode,
                })
            }),
            Pending::PartitionEnd(p) => self.record(|| {
                Record::Fault(FaultEvent::PartitionEnd {
                    prefill: p.prefill,
                    decode: p.decode,
                })
            }),
            Pending::Heal => self.heal(),
        }
        true
    }

    /// The safety phase ends: the network stops injecting faults, armed pauses are
    /// dropped, and every crashed node comes back up.
    fn heal(&mut self) {
        self.net.heal();
        self.armed_pauses.clear();
        self.record(|| Record::Fault(FaultEvent::Heal));
        for i in 0..self.nodes.len() {
            if self.down[i] {
                self.restart(NodeId(i as u16));
            }
        }
    }

    fn on_submit(&mut self, req: RequestId) {
        let Some(r) = self.request(req).cloned() else {
            return;
        };
        self.emit(Record::Submit {
            req,
            tenant: r.tenant,
            prompt_len: r.prompt_len,
            max_new_tokens: r.max_new_tokens,
        });
        let msg = Msg::Submit {
            req,
            tenant: r.tenant,
            prompt: r.prompt(),
            max_new_tokens: r.max_new_tokens,
        };
        let (client, router) = (self.client, self.router);
        self.send(client, router, msg);
    }

    /// Keep a control message of a room use for a stale replay at the number's reuse.
    fn remember_control(&mut self, from: NodeId, to: NodeId, msg: &Msg<G::Kv>) {
        let Some(room) = msg.room() else { return };
        let sent = (from, to, self.pair_epochs(from, to), msg.clone());
        let e = self
            .last_use
            .entry(room.room.0)
            .or_insert_with(|| (room, Vec::new()));
        if e.0 != room {
            if room.gen < e.0.gen {
                return;
            }
            let old = std::mem::replace(e, (room, vec![sent]));
            self.prev_use.insert(room.room.0, old);
            return;
        }
        if e.1.len() < 8 {
            e.1.push(sent);
        }
    }

    /// The current incarnations of a sender and a receiver.
    fn pair_epochs(&self, from: NodeId, to: NodeId) -> (u32, u32) {
        let epoch = |n: NodeId| self.epochs.get(n.0 as usize).copied().unwrap_or(0);
        (epoch(from), epoch(to))
    }

    /// A room number's new use was routed: maybe redeliver its previous use's control
    /// messages right now, as stale duplicates. A copy is a duplicate on the connection
    /// the message was first sent on, so it is replayed only while both ends are still
    /// the incarnations that sent and received it: a connection (TCP, or a ZMQ socket
    /// whose queue delivered the message) does not outlive either end, and no transport
    /// hands an already delivered message to the process that restarted at an address.
    fn stale_replay(&mut self, room: RoomKey) {
        // The latest use before `room`: the last one remembered, or the one before it
        // when `room` itself already sent control messages.
        let earlier = match self.last_use.get(&room.room.0) {
            Some(u) if u.0 == room => self.prev_use.get(&room.room.0),
            u => u,
        };
        let Some((prev, msgs)) = earlier else {
            return;
        };
        if prev.gen >= room.gen || !self.net.stale_replay() {
            return;
        }
        let msgs = msgs.clone();
        for (from, to, epochs, msg) in msgs {
            if epochs != self.pair_epochs(from, to) {
                continue;
            }
            self.stats.duplicated += 1;
            self.stats.stale_replayed += 1;
            let at = self.now_ns + self.net.latency_ns();
            self.log_send(from, to, &msg, at, true);
            self.enqueue(at, from, to, msg, false);
        }
    }

    /// How much later the slow writer's writes land (during the safety phase).
    fn slow_writer_delay(&self, from: NodeId) -> u64 {
        match self.slow_writer {
            Some((node, ns)) if node == from && self.heal_at_ns.is_none_or(|h| self.now_ns < h) => {
                ns
            }
            _ => 0,
        }
    }

    fn enqueue(&mut self, at_ns: u64, from: NodeId, to: NodeId, msg: Msg<G::Kv>, doomed: bool) {
        self.enqueue_write(at_ns, from, to, msg, doomed, None);
    }

    fn enqueue_write(
        &mut self,
        at_ns: u64,
        from: NodeId,
        to: NodeId,
        msg: Msg<G::Kv>,
        doomed: bool,
        data: Option<(DataFault, u64)>,
    ) {
        let (from_epoch, to_epoch) = (self.epochs[from.0 as usize], self.epochs[to.0 as usize]);
        self.push(
            at_ns,
            Pending::Deliver {
                from,
                to,
                from_epoch,
                to_epoch,
                msg,
                doomed,
                data,
                replay: None,
            },
        );
    }

    /// A node (or the client) sends: the network model decides the message's fate.
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) {
        if let Some(dup) = self.replaying {
            if env_world::duplicate_completion(dup, &msg) {
                return;
            }
        }
        let now = self.now_ns;
        match env_world::transport(from, to, self.client, &msg) {
            Transport::Client | Transport::Completion => {
                // The client link is the harness; completions ride the reliable
                // connection.
                let at = now + self.net.latency_ns();
                self.log_send(from, to, &msg, at, false);
                self.enqueue(at, from, to, msg, false);
            }
            Transport::Write => {
                self.stats.messages += 1;
                self.stats.writes += 1;
                match self.net.write() {
                    WriteFate::Land {
                        mut after_ns,
                        late,
                        data,
                    } => {
                        after_ns += self.slow_writer_delay(from);
                        self.stats.writes_late += u64::from(late);
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue_write(now + after_ns, from, to, msg, false, data);
                    }
                    WriteFate::Fail { after_ns } => {
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue(now + after_ns, from, to, msg, true);
                    }
                }
            }
            Transport::Control => {
                self.stats.messages += 1;
                if self.net.params().stale_replay_permille > 0 {
                    self.remember_control(from, to, &msg);
                }
                match self.net.control(true) {
                    ControlFate::Lost => {
                        self.stats.lost += 1;
                        self.record_drop((from, to), &msg, DropReason::Lost);
                    }
                    ControlFate::Deliver { after_ns, dup_ns } => {
                        if let Some(d) = dup_ns {
                            self.stats.duplicated += 1;
                            self.log_send(from, to, &msg, now + d, true);
                            self.enqueue(now + d, from, to, msg.clone(), false);
                        }
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue(now + after_ns, from, to, msg, false);
                    }
                }
            }
        }
    }

    fn log_send(&mut self, from: NodeId, to: NodeId, msg: &Msg<G::Kv>, at: u64, duplicate: bool) {
        self.record(|| Record::Send {
            from,
            to,
            msg: MsgView::of(msg),
            deliver_at_ns: at,
            duplicate,
        });
    }

    /// A KV write failed on the wire: it is not applied, and its one failed completion
    /// travels back to the incarnation of the writer that posted it.
    fn write_failed(
        &mut self,
        from: NodeId,
        to: NodeId,
        id: WriteId,
        completion: Msg<G::Kv>,
        reason: WriteFailure,
    ) {
        self.stats.writes_failed += 1;
        self.reach.write_done(id);
        self.emit(Record::WriteFailed {
            from,
            to,
            write: id,
            reason,
        });
        let at = self.now_ns + self.net.latency_ns();
        self.push(
            at,
            Pending::Deliver {
                from: to,
                to: from,
                from_epoch: self.epochs[to.0 as usize],
                to_epoch: id.epoch,
                msg: completion,
                doomed: false,
                data: None,
                replay: None,
            },
        );
    }

    /// What the world knows of a message's arrival from `from`'s incarnation
    /// `from_epoch` at `to`'s `to_epoch`; `None` for an address outside the topology.
    fn arriving(
        &self,
        (from, from_epoch): (NodeId, u32),
        (to, to_epoch): (NodeId, u32),
        injected_failure: bool,
    ) -> Option<Arriving> {
        let (ti, fi) = (to.0 as usize, from.0 as usize);
        if ti >= self.nodes.len() || fi >= self.epochs.len() {
            return None;
        }
        Some(Arriving {
            sender_alive: self.epochs[fi] == from_epoch,
            receiver_alive: !self.down[ti] && self.epochs[ti] == to_epoch,
            receiver_restarted: !self.down[ti] && self.epochs[ti] > to_epoch,
            receiver_epoch: self.epochs[ti],
            partitioned: self.partitioned(from, to),
            injected_failure,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        mut msg: Msg<G::Kv>,
        doomed: bool,
        data: Option<(DataFault, u64)>,
    ) {
        if to == self.client {
            self.deliver_to_client(msg);
            return;
        }
        let Some(at) = self.arriving((from, from_epoch), (to, to_epoch), doomed) else {
            return;
        };
        match env_world::arrival(&msg, &at) {
            Arrival::Deliver => {}
            Arrival::Drop(reason) => {
                if reason == DropReason::SenderCrashed {
                    self.stats.writes_flushed += 1;
                } else {
                    self.stats.dropped += 1;
                }
                self.record_drop((from, to), &msg, reason);
                return;
            }
            Arrival::Fail { reason, completion } => {
                if let Some(id) = msg.write_id() {
                    self.write_failed(from, to, id, completion, reason);
                }
                return;
            }
        }
        if self.net.params().stale_duplicate_write_permille > 0 {
            if let Some((DataFault::StaleDuplicate, salt)) = data {
                self.schedule_stale_duplicate(to, &msg, salt);
            }
            self.history.remember(from, to, &msg);
        }
        if let Some((fault, salt)) = data {
            self.alter_landing(from, to, &mut msg, fault, salt);
        }
        self.record(|| Record::Deliver {
            from,
            to,
            msg: MsgView::of(&msg),
        });
        self.dispatch(to, Input::Message { from, msg });
    }

    /// A KV write landing at `to` drew a stale duplicate: queue a copy of an earlier
    /// write to `to` ([`WriteHistory::duplicate`]), if it took one.
    fn schedule_stale_duplicate(&mut self, to: NodeId, msg: &Msg<G::Kv>, salt: u64) {
        let Some((writer, dup, a)) = self.history.duplicate(to, msg, salt) else {
            return;
        };
        let at = self.now_ns + crate::net::stale_duplicate_delay(salt);
        let (from_epoch, to_epoch) = (
            dup.write_id().map_or(0, |id| id.epoch),
            self.epochs[to.0 as usize],
        );
        self.log_send(writer, to, &dup, at, true);
        self.push(
            at,
            Pending::Deliver {
                from: writer,
                to,
                from_epoch,
                to_epoch,
                msg: dup,
                doomed: false,
                data: None,
                replay: Some(a),
            },
        );
    }

    /// A landing KV write suffers its drawn data fault ([`env_world::alter`]): count
    /// it and record it for the oracle.
    fn alter_landing(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: &mut Msg<G::Kv>,
        fault: DataFault,
        salt: u64,
    ) {
        let pages = self.header.node(to).and_then(|n| n.pool_pages).unwrap_or(0);
        let Some(a) = env_world::alter(msg, fault, pages, salt) else {
            return;
        };
        self.stats.data_faults += 1;
        match a.fault {
            DataFault::Corrupt => self.stats.corrupted += 1,
            DataFault::Misdirect => self.stats.misdirected += 1,
            DataFault::Torn => self.stats.torn += 1,
            // `alter` leaves the write itself alone; the copy is counted
            // when it lands (`deliver_duplicate`).
            DataFault::StaleDuplicate => {}
        }
        if let Some(write) = msg.write_id() {
            self.emit(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
        }
    }

    /// A stale duplicate of an earlier KV write arrives. The world's rule for an
    /// arriving write applies; one that would fail is simply gone (its writer knows
    /// nothing of it: no completion), one that lands is recorded as a `data_fault`
    /// and handed to its node, whose completion of it is dropped.
    fn deliver_duplicate(
        &mut self,
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        msg: Msg<G::Kv>,
        a: Altered,
    ) {
        let Some(write) = msg.write_id() else { return };
        let Some(at) = self.arriving((from, from_epoch), (to, to_epoch), false) else {
            return;
        };
        let gone = match env_world::arrival(&msg, &at) {
            Arrival::Deliver => None,
            Arrival::Drop(reason) => Some(reason),
            Arrival::Fail { reason, .. } => Some(match reason {
                WriteFailure::Partitioned => DropReason::Partitioned,
                _ => DropReason::ReceiverGone,
            }),
        };
        if let Some(reason) = gone {
            self.record_drop((from, to), &msg, reason);
            return;
        }
        self.stats.data_faults += 1;
        self.stats.stale_duplicates += 1;
        self.emit(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
        self.record(|| Record::Deliver {
            from,
            to,
            msg: MsgView::of(&msg),
        });
        self.replaying = Some(write);
        self.dispatch(to, Input::Message { from, msg });
        self.replaying = None;
    }

    fn deliver_to_client(&mut self, msg: Msg<G::Kv>) {
        if let Msg::Response {
            req,
            status,
            tokens,
            ..
        } = msg
        {
            if let Some(h) = &mut self.hash {
                (self.now_ns, req, status, &tokens).hash(h);
            }
            self.emit(Record::Response {
                req,
                status,
                tokens: tokens.clone(),
            });
            self.replies
                .entry(req)
                .or_default()
                .push(ClientReply { status, tokens });
        }
    }

    /// Feed one input to one node and carry out its effects, in the order issued.
    fn dispatch(&mut self, node: NodeId, input: Input<G::Kv>) {
        let i = node.0 as usize;
        if let Some(h) = &mut self.hash {
            (self.now_ns, node, &input).hash(h);
        }
        self.outbox.reset(self.now_ns);
        env_world::step(&mut self.nodes[i], input, &mut self.outbox);
        let mut effects = std::mem::take(&mut self.outbox.effects);
        env_world::apply(node, effects.drain(..), self);
        // Give the buffer back so the next call reuses its capacity.
        self.outbox.effects = effects;
    }

    /// Arm a client cancel whose phase this event reached.
    fn trigger_cancels(&mut self, ev: &TraceEvent) {
        if self.armed.is_empty() {
            return;
        }
        let role = |n: &NodeId| self.nodes.get(n.0 as usize).map(Node::role);
        let hit = match ev {
            TraceEvent::Admitted {
                room,
                side: Side::Prefill,
                ..
            } => Some((*room, ReqPhase::PrefillAdmitted)),
            TraceEvent::PagesReserved { node, room, .. } if role(node) == Some(Role::Decode) => {
                Some((*room, ReqPhase::DecodeReserved))
            }
            TraceEvent::KvSent { write, .. } => Some((write.room, ReqPhase::KvSent)),
            TraceEvent::KvLanded { write, .. } => Some((write.room, ReqPhase::KvLanded)),
            TraceEvent::TransferAccepted { room, .. } => Some((*room, ReqPhase::TransferAccepted)),
            TraceEvent::Attend { room, step, .. } => Some((*room, ReqPhase::Decoding(*step))),
            TraceEvent::Responded {
                room,
                side: Side::Prefill,
                ..
            } => Some((*room, ReqPhase::PrefillAnswered)),
            _ => None,
        };
        let target = match (ev, hit) {
            (TraceEvent::RouterResponse { req, .. }, _) => Some((*req, ReqPhase::Answered)),
            (_, Some((room, phase))) => self.room_req.get(&room).map(|r| (*r, phase)),
            _ => None,
        };
        let Some((req, phase)) = target else {
            return;
        };
        if let Some(&(want, delay, how)) = self.armed.get(&req) {
            if want == phase {
                self.armed.remove(&req);
                self.push(self.now_ns + delay, Pending::Cancel { req, how });
            }
        }
    }

    /// If `ev` is an input of a frozen node, the instant it wakes. Its timers wait,
    /// and so does every arrival the transport says needs its process
    /// ([`KvTransport::arrival_waits_for_receiver`]); a crash does not wait (the
    /// process is killed frozen).
    fn held_until(&self, ev: &Pending<G::Kv>) -> Option<u64> {
        let node = match ev {
            Pending::Fire { node, .. } => *node,
            Pending::Deliver { to, msg, .. }
                if *to != self.client && self.transport.arrival_waits_for_receiver(msg) =>
            {
                *to
            }
            _ => return None,
        };
        let wake = self.paused_until.get(node.0 as usize).copied()?;
        (wake > self.now_ns).then_some(wake)
    }

    /// A node freezes for `len_ns`, at most until the heal (a live one; a pause of a
    /// crashed node is nothing). Its inputs are held by [`Simulator::held_until`].
    fn pause(&mut self, node: NodeId, len_ns: u64) {
        let i = node.0 as usize;
        let heal = self.heal_at_ns.unwrap_or(u64::MAX);
        let until_ns = self.now_ns.saturating_add(len_ns).min(heal);
        if i >= self.nodes.len() || self.down[i] || until_ns <= self.now_ns {
            return;
        }
        self.paused_until[i] = self.paused_until[i].max(until_ns);
        self.stats.pauses += 1;
        self.reach.paused(node);
        self.emit(Record::Fault(FaultEvent::Pause {
            node,
            until_ns: self.paused_until[i],
        }));
    }

    /// A planned pause: it strikes now, or is armed for the node's next transfer step.
    fn on_pause(&mut self, node: NodeId, len_ns: u64, on_transfer: bool) {
        if on_transfer {
            self.armed_pauses.push((node, len_ns));
        } else {
            self.pause(node, len_ns);
        }
    }

    /// Strike an armed pause whose node this event is a transfer step of: the node
    /// freezes once the step's handling is over (its later effects are held).
    fn trigger_pause(&mut self, ev: &TraceEvent) {
        if self.armed_pauses.is_empty() {
            return;
        }
        let hit = self
            .armed_pauses
            .iter()
            .position(|(node, _)| crate::stall::transfer_step(*node, ev));
        if let Some(i) = hit {
            let (node, len_ns) = self.armed_pauses.remove(i);
            self.pause(node, len_ns);
        }
    }

    /// A crash: the node's incarnation dies with its timers and memory registrations
    /// (KV writes to it fail back to their writers; other messages to it reach the
    /// restarted incarnation late) and its NIC's queue (its own writes are flushed,
    /// never applied). The world's one crash walk ([`CrashWalk`], with
    /// [`env_world::crash_fate`]) decides each message in flight.
    fn crash(&mut self, node: NodeId, restart_ns: u64) {
        let i = node.0 as usize;
        if i >= self.nodes.len() || node == self.router || self.down[i] {
            return;
        }
        self.stats.crashes += 1;
        self.reach.crashed(node);
        // A frozen process can be killed: its held inputs are in the queue, and the
        // crash walk below decides them as any other in flight.
        self.paused_until[i] = 0;
        let dead = self.epochs[i];
        self.epochs[i] += 1;
        self.down[i] = true;
        self.timers.crash(node);
        self.history.crash(node);
        let queue = self.queue.take_all().into_iter();
        let mut walk = CrashWalk::new(node, dead).walk(
            queue.map(|(at_ns, seq, ev)| Queued { at_ns, seq, ev }),
            flying,
        );
        for (mut q, travel) in std::mem::take(&mut walk.kept) {
            if travel == Travel::Late {
                // On its way to the dead incarnation: it reaches the restarted one, its
                // remaining delay counted from the restart (late, and reordered with
                // what is sent after the restart).
                let left = q.at_ns.saturating_sub(self.now_ns);
                q.at_ns = restart_ns.max(self.now_ns) + 1 + left;
            }
            self.queue.push(q.at_ns, q.seq, q.ev);
        }
        self.report_crash(walk);
        self.push(restart_ns.max(self.now_ns), Pending::Restart { node });
    }

    /// Record a crash and carry out what it did to the messages in flight: flushed
    /// writes, lost messages, failed-back writes.
    fn report_crash(&mut self, walk: CrashWalk<Queued<G::Kv>, G::Kv>) {
        let CrashWalk {
            node,
            dead,
            flushed,
            failed,
            lost,
            ..
        } = walk;
        self.stats.writes_flushed += flushed.len() as u64;
        self.emit(Record::Fault(FaultEvent::Crash {
            node,
            epoch: dead,
            flushed,
        }));
        for (from, to, msg) in lost.iter().filter_map(delivery) {
            self.stats.dropped += 1;
            self.record(|| Record::Drop {
                from,
                to,
                msg: MsgView::of(msg),
                reason: DropReason::ReceiverGone,
            });
        }
        for (q, done) in failed {
            if let Some((from, to, id)) =
                delivery(&q).and_then(|(f, t, m)| Some((f, t, m.write_id()?)))
            {
                self.write_failed(from, to, id, done, WriteFailure::ReceiverGone);
            }
        }
    }

    fn restart(&mut self, node: NodeId) {
        let i = node.0 as usize;
        if !self.down[i] {
            return;
        }
        self.down[i] = false;
        let epoch = self.epochs[i];
        if let Some(h) = &mut self.hash {
            (self.now_ns, node, epoch).hash(h);
        }
        env_world::restart(&mut self.nodes[i], epoch);
        self.emit(Record::Fault(FaultEvent::Restart { node, epoch }));
    }

    /// Run to the end: until the queue is empty (everything drained), the deadline of
    /// the liveness phase passes, or the event limit is hit; then judge liveness.
    pub fn run(&mut self) {
        let mut end = (EndOutcome::Drained, "drained".to_string());
        while let Some(next) = self.next_live() {
            if next > self.deadline_ns {
                let since = match self.heal_at_ns {
                    Some(h) => format!(
                        "{} after the faults healed",
                        crate::report::secs(self.deadline_ns.saturating_sub(h))
                    ),
                    None => format!(
                        "{} of simulated time",
                        crate::report::secs(self.deadline_ns)
                    ),
                };
                end = (
                    EndOutcome::LivenessBound,
                    format!("the run did not drain within {since}"),
                );
                break;
            }
            if self.events >= self.max_events {
                end = (
                    EndOutcome::EventLimit,
                    format!("the run did not drain within {} events", self.max_events),
                );
                break;
            }
            self.step_live();
        }
        self.events += 1;
        self.emit(Record::End {
            outcome: end.0,
            detail: end.1,
        });
    }
}

/// The simulator carries out a node's effects: sends go through its network model,
/// timers onto its queue (a replaced or cancelled timer is recognised by its token),
/// events to the oracle and the trace, and a fault that asks for a restart crashes the
/// node now and brings it back at once.
impl<G: Gpu> Driver<Msg<G::Kv>> for Simulator<G> {
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) {
        Simulator::send(self, from, to, msg);
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        match op {
            TimerOp::Set { timer, after_ns } => {
                self.seq += 1;
                let token = self.seq;
                self.timers.apply(node, op, token);
                let after = self.clocks.true_ns(node, timer, after_ns);
                let at = self.now_ns.saturating_add(after);
                self.record(|| Record::TimerSet {
                    node,
                    timer,
                    fire_at_ns: at,
                });
                self.queue
                    .push(at, token, Pending::Fire { node, timer, token });
            }
            TimerOp::Cancel { timer } => {
                if self.timers.take(node, timer).is_some() {
                    self.record(|| Record::TimerCancel { node, timer });
                }
            }
        }
    }

    fn event(&mut self, _node: NodeId, ev: TraceEvent) {
        if let Some(h) = &mut self.hash {
            ev.hash(h);
        }
        self.stats.coverage.event(&ev);
        self.reach.event(&ev);
        if let TraceEvent::Routed { req, room, .. } = &ev {
            self.room_req.insert(*room, *req);
            if self.net.params().stale_replay_permille > 0 {
                self.stale_replay(*room);
            }
        }
        // And when a use of a reused number is quarantined: a stale drain ack then is
        // what generation-blind handling gets wrong.
        if let TraceEvent::Quarantined { room, .. } = &ev {
            if self.net.params().stale_replay_permille > 0 {
                self.stale_replay(*room);
            }
        }
        self.trigger_cancels(&ev);
        self.trigger_pause(&ev);
        let restart = match &ev {
            TraceEvent::Fault { node, fault } if fault.action() == FaultAction::Restart => {
                Some(*node)
            }
            _ => None,
        };
        self.emit(Record::Engine(ev));
        if let Some(node) = restart {
            self.push(
                self.now_ns,
                Pending::Crash {
                    node,
                    restart_ns: self.now_ns,
                },
            );
        }
    }
}
