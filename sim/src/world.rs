//! `World`: the seeded discrete-event simulator of one run.
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
use crate::log::{DropReason, Entry, FaultEvent, MsgView, Record, WriteFailure};
use crate::net::{ControlFate, NetModel, WriteFate};
use crate::oracle::Oracle;
use crate::plan::{Partition, Plan};
use crate::scenario::{CancelAt, CancelHow, PlannedRequest, ReqPhase};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, Token};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::trace::{Side, TraceEvent};
use kvsim_engine::Cfg;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::hash::Hash;

/// Something scheduled to happen.
#[derive(Clone, Debug)]
enum Pending<K> {
    Deliver {
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        /// Boxed: queue entries move on every push and pop, and a message is large.
        msg: Box<Msg<K>>,
        /// A KV write whose failure was decided when it was sent.
        doomed: bool,
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
    PartitionStart(Partition),
    PartitionEnd(Partition),
    Heal,
}

struct Queued<K> {
    at_ns: u64,
    seq: u64,
    ev: Pending<K>,
}

impl<K> PartialEq for Queued<K> {
    fn eq(&self, o: &Self) -> bool {
        (self.at_ns, self.seq) == (o.at_ns, o.seq)
    }
}
impl<K> Eq for Queued<K> {}
impl<K> PartialOrd for Queued<K> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<K> Ord for Queued<K> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at_ns, self.seq).cmp(&(o.at_ns, o.seq))
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
    pub cancels: u64,
}

/// The driver of one run.
pub struct World<G: Gpu> {
    now_ns: u64,
    seq: u64,
    events: u64,
    queue: BinaryHeap<Reverse<Queued<G::Kv>>>,
    nodes: Vec<Node<G>>,
    /// Current incarnation of each node (index = node id; the client's entry too).
    epochs: Vec<u32>,
    down: Vec<bool>,
    router: NodeId,
    client: NodeId,
    timers: BTreeMap<(NodeId, Timer), u64>,
    net: NetModel,
    partitions: Vec<Partition>,
    requests: Vec<PlannedRequest>,
    room_req: BTreeMap<RoomKey, RequestId>,
    /// Phase-triggered cancels not yet triggered.
    armed: BTreeMap<RequestId, (ReqPhase, u64, CancelHow)>,
    replies: BTreeMap<RequestId, Vec<ClientReply>>,
    oracle: Oracle,
    outbox: Outbox<G::Kv>,
    log: Option<Vec<Entry>>,
    hash: TraceHash,
    /// KV writes queued and not yet landed or failed, per (receiver, room use).
    writes_in_flight: BTreeMap<(NodeId, RoomKey), u32>,
    heal_at_ns: Option<u64>,
    deadline_ns: u64,
    max_events: u64,
    findings_logged: usize,
    stats: FaultStats,
}

impl<G: Gpu> World<G> {
    /// Build the topology of `plan` (router 0, prefill nodes, decode nodes, then the
    /// client endpoint) and schedule its workload and faults. `make_gpu(pages,
    /// page_size)` builds each node's KV memory.
    pub fn new(plan: &Plan, make_gpu: impl Fn(u32, u32) -> G, trace: bool) -> Self {
        let cfg = Cfg::new(plan.engine.clone());
        let router = NodeId(0);
        let prefills = plan.prefill_ids();
        let decodes = plan.decode_ids();
        let mut nodes = vec![Node::Router(Router::new(
            router,
            cfg.clone(),
            prefills.clone(),
            decodes.clone(),
        ))];
        let mut pool_pages = BTreeMap::new();
        for (id, &pages) in prefills.iter().zip(&plan.prefill_pools) {
            nodes.push(Node::Prefill(PrefillNode::new(
                *id,
                cfg.clone(),
                router,
                make_gpu(pages, cfg.page_size),
            )));
            pool_pages.insert(*id, pages);
        }
        for (id, &pages) in decodes.iter().zip(&plan.decode_pools) {
            nodes.push(Node::Decode(DecodeNode::new(
                *id,
                cfg.clone(),
                router,
                make_gpu(pages, cfg.page_size),
            )));
            pool_pages.insert(*id, pages);
        }
        let client = NodeId(nodes.len() as u16);
        let mut requests = plan.requests.clone();
        requests.sort_by_key(|r| r.req);
        let oracle = Oracle::new(cfg.clone(), &requests, pool_pages);
        let n = nodes.len() + 1;
        let mut w = World {
            now_ns: 0,
            seq: 0,
            events: 0,
            queue: BinaryHeap::new(),
            nodes,
            epochs: vec![0; n],
            down: vec![false; n],
            router,
            client,
            timers: BTreeMap::new(),
            net: NetModel::new(plan.seed, plan.net.clone()),
            partitions: plan.partitions.clone(),
            requests: requests.clone(),
            room_req: BTreeMap::new(),
            armed: BTreeMap::new(),
            replies: BTreeMap::new(),
            oracle,
            outbox: Outbox::new(0),
            log: trace.then(Vec::new),
            hash: TraceHash::default(),
            writes_in_flight: BTreeMap::new(),
            heal_at_ns: plan.heal_at_ns,
            deadline_ns: plan.deadline_ns,
            max_events: plan.max_events,
            findings_logged: 0,
            stats: FaultStats::default(),
        };
        for r in &requests {
            w.push(r.at_ns, Pending::Submit { req: r.req });
            if let Some(c) = r.cancel {
                match c.at {
                    CancelAt::AfterNs(after) => w.push(
                        r.at_ns.saturating_add(after),
                        Pending::Cancel {
                            req: r.req,
                            how: c.how,
                        },
                    ),
                    CancelAt::Phase { phase, delay_ns } => {
                        w.armed.insert(r.req, (phase, delay_ns, c.how));
                    }
                }
            }
        }
        for p in &plan.partitions {
            w.push(p.from_ns, Pending::PartitionStart(*p));
            w.push(p.until_ns, Pending::PartitionEnd(*p));
        }
        for c in &plan.crashes {
            w.push(
                c.at_ns,
                Pending::Crash {
                    node: c.node,
                    restart_ns: c.restart_ns,
                },
            );
        }
        if let Some(h) = plan.heal_at_ns {
            w.push(h, Pending::Heal);
        }
        w
    }

    fn push(&mut self, at_ns: u64, ev: Pending<G::Kv>) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at_ns,
            seq: self.seq,
            ev,
        }));
    }

    fn record(&mut self, rec: impl FnOnce() -> Record) {
        if let Some(log) = &mut self.log {
            log.push(Entry {
                at_ns: self.now_ns,
                event: self.events,
                rec: rec(),
            });
        }
    }

    pub fn nodes(&self) -> &[Node<G>] {
        &self.nodes
    }
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
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
        self.stats
    }
    /// The digest of every input handed to a node and every event a node emitted.
    pub fn trace_hash(&self) -> u64 {
        self.hash.digest()
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

    /// Drop queued timer firings that were cancelled or replaced, so the head of the
    /// queue is a real event. Returns its time.
    fn next_live(&mut self) -> Option<u64> {
        loop {
            let q = &self.queue.peek()?.0;
            if let Pending::Fire { node, timer, token } = &q.ev {
                if self.timers.get(&(*node, *timer)) != Some(token) {
                    self.queue.pop();
                    continue;
                }
            }
            return Some(q.at_ns);
        }
    }

    /// Process one event. `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        if self.next_live().is_none() {
            return false;
        }
        let Some(Reverse(q)) = self.queue.pop() else {
            return false;
        };
        self.now_ns = q.at_ns;
        self.events += 1;
        self.oracle.set_clock(self.now_ns, self.events);
        match q.ev {
            Pending::Submit { req } => self.on_submit(req),
            Pending::Cancel { req, how } => {
                self.stats.cancels += 1;
                let plan = self
                    .request(req)
                    .and_then(|r| r.cancel)
                    .map_or_else(String::new, |c| c.to_string());
                self.record(|| Record::ClientCancel { req, how, plan });
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
            } => self.deliver(from, to, from_epoch, to_epoch, *msg, doomed),
            Pending::Fire { node, timer, .. } => {
                self.timers.remove(&(node, timer));
                self.record(|| Record::TimerFire { node, timer });
                self.dispatch(node, Input::Timer(timer), None);
            }
            Pending::Crash { node, restart_ns } => self.crash(node, restart_ns),
            Pending::Restart { node } => self.restart(node),
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
            Pending::Heal => {
                self.net.heal();
                self.record(|| Record::Fault(FaultEvent::Heal));
                for i in 0..self.nodes.len() {
                    if self.down[i] {
                        self.restart(NodeId(i as u16));
                    }
                }
            }
        }
        self.log_findings();
        true
    }

    fn log_findings(&mut self) {
        let n = self.oracle.findings().len();
        if n > self.findings_logged {
            if self.log.is_some() {
                let new: Vec<_> = self.oracle.findings()[self.findings_logged..].to_vec();
                for f in new {
                    self.record(|| Record::violation(&f));
                }
            }
            self.findings_logged = n;
        }
    }

    fn on_submit(&mut self, req: RequestId) {
        let Some(r) = self.request(req).cloned() else {
            return;
        };
        self.record(|| Record::Submit {
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

    fn enqueue(&mut self, at_ns: u64, from: NodeId, to: NodeId, msg: Msg<G::Kv>, doomed: bool) {
        let (from_epoch, to_epoch) = (self.epochs[from.0 as usize], self.epochs[to.0 as usize]);
        self.push(
            at_ns,
            Pending::Deliver {
                from,
                to,
                from_epoch,
                to_epoch,
                msg: Box::new(msg),
                doomed,
            },
        );
    }

    /// A node (or the client) sends: the network model decides the message's fate.
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) {
        let now = self.now_ns;
        let harness = from == self.client || to == self.client;
        if harness || matches!(msg, Msg::WriteDone { .. }) {
            // The client link is the harness; completions ride the reliable connection.
            let at = now + self.net.latency_ns();
            self.log_send(from, to, &msg, at, false);
            self.enqueue(at, from, to, msg, false);
            return;
        }
        self.stats.messages += 1;
        if let Msg::KvWrite { room, .. } = &msg {
            self.stats.writes += 1;
            *self.writes_in_flight.entry((to, *room)).or_insert(0) += 1;
            match self.net.write() {
                WriteFate::Land { after_ns, late } => {
                    self.stats.writes_late += u64::from(late);
                    self.log_send(from, to, &msg, now + after_ns, false);
                    self.enqueue(now + after_ns, from, to, msg, false);
                }
                WriteFate::Fail { after_ns } => {
                    self.log_send(from, to, &msg, now + after_ns, false);
                    self.enqueue(now + after_ns, from, to, msg, true);
                }
            }
            return;
        }
        match self.net.control(true) {
            ControlFate::Lost => {
                self.stats.lost += 1;
                self.record(|| Record::Drop {
                    from,
                    to,
                    msg: MsgView::of(&msg),
                    reason: DropReason::Lost,
                });
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

    fn log_send(&mut self, from: NodeId, to: NodeId, msg: &Msg<G::Kv>, at: u64, duplicate: bool) {
        self.record(|| Record::Send {
            from,
            to,
            msg: MsgView::of(msg),
            deliver_at_ns: at,
            duplicate,
        });
    }

    fn write_failed(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>, reason: WriteFailure) {
        self.stats.writes_failed += 1;
        self.record(|| Record::WriteFailed {
            from,
            to,
            msg: MsgView::of(&msg),
            reason,
        });
        if let Msg::KvWrite { room, chunk, .. } = msg {
            // Exactly one completion per write: the failed one, to the sender's
            // incarnation that posted it (dropped if that one is gone too).
            let at = self.now_ns + self.net.latency_ns();
            let from_epoch = self.epochs[from.0 as usize];
            self.push(
                at,
                Pending::Deliver {
                    from: to,
                    to: from,
                    from_epoch: self.epochs[to.0 as usize],
                    to_epoch: from_epoch,
                    msg: Box::new(Msg::WriteDone {
                        room,
                        chunk,
                        ok: false,
                    }),
                    doomed: false,
                },
            );
        }
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        msg: Msg<G::Kv>,
        doomed: bool,
    ) {
        if to == self.client {
            self.deliver_to_client(msg);
            return;
        }
        let (ti, fi) = (to.0 as usize, from.0 as usize);
        if ti >= self.nodes.len() || fi >= self.epochs.len() {
            return;
        }
        let gone = self.down[ti] || self.epochs[ti] != to_epoch;
        if let Msg::KvWrite { room, dst, .. } = &msg {
            if self.epochs[fi] != from_epoch {
                // Counted out of flight when the sender crashed.
                self.stats.writes_flushed += 1;
                self.record(|| Record::Drop {
                    from,
                    to,
                    msg: MsgView::of(&msg),
                    reason: DropReason::SenderCrashed,
                });
                return;
            }
            let key = (to, *room);
            if let Some(n) = self.writes_in_flight.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.writes_in_flight.remove(&key);
                }
            }
            let failure = if doomed {
                Some(WriteFailure::Injected)
            } else if gone {
                Some(WriteFailure::ReceiverGone)
            } else if self.partitioned(from, to) {
                Some(WriteFailure::Partitioned)
            } else if dst.iter().any(|t| t.gen.epoch() != self.epochs[ti]) {
                Some(WriteFailure::StaleRegistration)
            } else {
                None
            };
            if let Some(reason) = failure {
                self.write_failed(from, to, msg, reason);
                return;
            }
        } else if gone || (self.partitioned(from, to) && !matches!(msg, Msg::WriteDone { .. })) {
            // A completion is the sender NIC's own report: a partition cannot lose it.
            let reason = if gone {
                DropReason::ReceiverGone
            } else {
                DropReason::Partitioned
            };
            self.stats.dropped += 1;
            self.record(|| Record::Drop {
                from,
                to,
                msg: MsgView::of(&msg),
                reason,
            });
            return;
        }
        self.record(|| Record::Deliver {
            from,
            to,
            msg: MsgView::of(&msg),
        });
        self.oracle.before_deliver(&self.nodes, from, to, &msg);
        let submitted = match &msg {
            Msg::Submit { req, .. } if to == self.router => Some(*req),
            _ => None,
        };
        self.dispatch(to, Input::Message { from, msg }, submitted);
    }

    fn deliver_to_client(&mut self, msg: Msg<G::Kv>) {
        if let Msg::Response {
            req,
            status,
            tokens,
        } = msg
        {
            (self.now_ns, req, status, &tokens).hash(&mut self.hash);
            self.record(|| Record::Response {
                req,
                status,
                tokens: tokens.clone(),
            });
            self.oracle.on_response(req, status, &tokens);
            self.replies
                .entry(req)
                .or_default()
                .push(ClientReply { status, tokens });
        }
    }

    fn dispatch(&mut self, node: NodeId, input: Input<G::Kv>, submitted: Option<RequestId>) {
        let i = node.0 as usize;
        (self.now_ns, node, &input).hash(&mut self.hash);
        self.outbox.reset(self.now_ns);
        self.nodes[i].handle(input, &mut self.outbox);
        let traces = std::mem::take(&mut self.outbox.traces);
        let sends = std::mem::take(&mut self.outbox.sends);
        let timers = std::mem::take(&mut self.outbox.timers);
        if node == self.router {
            for (to, msg) in &sends {
                self.oracle.on_router_send(submitted, msg, *to);
                if let (Some(req), Msg::DecodeStart { room, .. }) = (submitted, msg) {
                    self.room_req.insert(*room, req);
                }
            }
        }
        for ev in &traces {
            ev.hash(&mut self.hash);
            self.oracle
                .on_trace(&self.nodes, &self.writes_in_flight, ev);
            self.trigger_cancels(ev);
            self.record(|| Record::Engine(ev.clone()));
        }
        for (to, msg) in sends {
            self.send(node, to, msg);
        }
        for op in timers {
            match op {
                TimerOp::Set { timer, after_ns } => {
                    self.seq += 1;
                    let token = self.seq;
                    self.timers.insert((node, timer), token);
                    let at = self.now_ns + after_ns;
                    self.record(|| Record::TimerSet {
                        node,
                        timer,
                        fire_at_ns: at,
                    });
                    self.queue.push(Reverse(Queued {
                        at_ns: at,
                        seq: token,
                        ev: Pending::Fire { node, timer, token },
                    }));
                }
                TimerOp::Cancel { timer } => {
                    if self.timers.remove(&(node, timer)).is_some() {
                        self.record(|| Record::TimerCancel { node, timer });
                    }
                }
            }
        }
        self.oracle.after_event(&self.nodes[i]);
        // Give the buffers back so the next call reuses their capacity.
        self.outbox.traces = traces;
        self.outbox.traces.clear();
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
            TraceEvent::KvSent { room, .. } => Some((*room, ReqPhase::KvSent)),
            TraceEvent::KvLanded { room, .. } => Some((*room, ReqPhase::KvLanded)),
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

    fn crash(&mut self, node: NodeId, restart_ns: u64) {
        let i = node.0 as usize;
        if i >= self.nodes.len() || node == self.router || self.down[i] {
            return;
        }
        self.stats.crashes += 1;
        let dead = self.epochs[i];
        self.record(|| Record::Fault(FaultEvent::Crash { node, epoch: dead }));
        self.epochs[i] += 1;
        self.down[i] = true;
        // Its timers die with it.
        self.timers.retain(|(n, _), _| *n != node);
        // Its NIC's posted writes are flushed, never applied: out of flight now.
        let mut flushed = Vec::new();
        for q in self.queue.iter() {
            if let Pending::Deliver {
                from,
                to,
                from_epoch,
                msg,
                ..
            } = &q.0.ev
            {
                if let Msg::KvWrite { room, .. } = &**msg {
                    if *from == node && *from_epoch == dead {
                        flushed.push((*to, *room));
                    }
                }
            }
        }
        for key in flushed {
            if let Some(n) = self.writes_in_flight.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.writes_in_flight.remove(&key);
                }
            }
        }
        self.push(restart_ns.max(self.now_ns), Pending::Restart { node });
    }

    fn restart(&mut self, node: NodeId) {
        let i = node.0 as usize;
        if !self.down[i] {
            return;
        }
        self.down[i] = false;
        let epoch = self.epochs[i];
        (self.now_ns, node, epoch).hash(&mut self.hash);
        self.nodes[i].restart(epoch);
        self.oracle.on_restart(node);
        self.record(|| Record::Fault(FaultEvent::Restart { node, epoch }));
        self.oracle.after_event(&self.nodes[i]);
    }

    /// Run to the end: until the queue is empty (everything drained), the deadline of
    /// the liveness phase passes, or the event limit is hit; then check liveness.
    pub fn run(&mut self) {
        let mut stuck = None;
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
                stuck = Some(format!("the run did not drain within {since}"));
                break;
            }
            if self.events >= self.max_events {
                stuck = Some(format!(
                    "the run did not drain within {} events",
                    self.max_events
                ));
                break;
            }
            self.step();
        }
        self.oracle.at_quiescence(&self.nodes, stuck);
        self.log_findings();
    }
}
