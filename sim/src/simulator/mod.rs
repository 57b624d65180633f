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

mod driver;
mod faults;
mod network;
pub(crate) mod output;
mod pending;

pub use output::{ClientReply, FaultStats, TraceSink};

use crate::hash::TraceHash;
use crate::net::NetModel;
use crate::plan::{Partition, Plan};
use crate::queue::EventQueue;
use crate::scenario::{CancelAt, PlannedRequest, ReqPhase};
use crate::stall::ClockRates;
use kvsim_engine::env::{Input, Outbox};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, WriteId};
use kvsim_engine::msg::{Carried, Msg};
use kvsim_engine::node::Node;
use kvsim_engine::world::{
    self as env_world, DropReason, KvTransport, Timers, Topology, WriteHistory,
};
use kvsim_engine::Cfg;
use kvsim_oracle::schema::{
    CancelHow, ClockKind, EndOutcome, Entry, FaultEvent, MsgView, Record, RunHeader,
};
use kvsim_oracle::Oracle;
use pending::Pending;
use std::collections::BTreeMap;

/// A room number's latest use and its control messages as sent (from, to, message).
/// A room use's remembered control messages: sender, receiver, the pair's incarnations
/// at the send, the message.
type LastUse = (RoomKey, Vec<(NodeId, NodeId, (u32, u32), Msg)>);

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
    last_use: BTreeMap<u32, LastUse>,
    /// The use before the latest, per room number.
    prev_use: BTreeMap<u32, LastUse>,
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
        let nodes = match plan.worker_mode {
            true => topology.build_behind_fronts(&cfg, make_gpu),
            false => topology.build(&cfg, make_gpu),
        };
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
    fn record_drop(&mut self, (from, to): (NodeId, NodeId), msg: &Carried<G::Kv>, why: DropReason) {
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
