//! `World`: the deterministic discrete-event driver of one run.
//!
//! It owns the nodes, a virtual clock, an event queue ordered by (time, sequence
//! number), the network between nodes and the client endpoint, and the oracle. It
//! feeds each node one input at a time through [`Node::handle`] with an [`Outbox`] and
//! applies the recorded effects afterwards: messages go onto the queue after the link
//! latency, timers onto the queue after their delay (a replaced or cancelled timer is
//! recognised by its token and never fires). Nothing here reads a wall clock or an
//! unseeded random source, so a run is a pure function of its scenario and seed.

use crate::oracle::Oracle;
use crate::scenario::{PlannedRequest, Scenario, ScenarioError};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, Token};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::Node;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::Cfg;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};

/// Something scheduled to happen.
#[derive(Clone, Debug)]
pub enum Pending<K> {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: Msg<K>,
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
    },
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

/// One line of a run's trace: when, where, which room, and what.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceLine {
    pub at_ns: u64,
    pub event: u64,
    pub room: Option<RoomKey>,
    pub text: String,
}

/// A reply as the client received it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClientReply {
    pub status: Status,
    pub tokens: Vec<Token>,
}

/// The driver of one run.
pub struct World<G: Gpu> {
    now_ns: u64,
    seq: u64,
    events: u64,
    queue: BinaryHeap<Reverse<Queued<G::Kv>>>,
    nodes: Vec<Node<G>>,
    router: NodeId,
    client: NodeId,
    timers: BTreeMap<(NodeId, Timer), u64>,
    latency_ns: u64,
    requests: Vec<PlannedRequest>,
    replies: BTreeMap<RequestId, Vec<ClientReply>>,
    oracle: Oracle,
    outbox: Outbox<G::Kv>,
    log: Option<Vec<TraceLine>>,
    max_events: u64,
    max_time_ns: u64,
}

impl<G: Gpu> World<G> {
    /// Build the topology (router 0, prefill nodes, decode nodes, then the client
    /// endpoint) after the pre-flight check. `make_gpu(pages, page_size)` builds each
    /// node's KV memory.
    pub fn new(
        sc: &Scenario,
        requests: Vec<PlannedRequest>,
        make_gpu: impl Fn(u32, u32) -> G,
        trace: bool,
    ) -> Result<Self, ScenarioError> {
        sc.validate()?;
        sc.preflight()?;
        let cfg = Cfg::new(sc.engine.clone());
        let np = sc.topology.prefill_pool_pages.len() as u16;
        let nd = sc.topology.decode_pool_pages.len() as u16;
        let router = NodeId(0);
        let prefills: Vec<NodeId> = (1..=np).map(NodeId).collect();
        let decodes: Vec<NodeId> = (np + 1..=np + nd).map(NodeId).collect();
        let mut nodes = vec![Node::Router(Router::new(
            router,
            cfg.clone(),
            prefills.clone(),
            decodes.clone(),
        ))];
        let mut pool_pages = BTreeMap::new();
        for (id, &pages) in prefills.iter().zip(&sc.topology.prefill_pool_pages) {
            nodes.push(Node::Prefill(PrefillNode::new(
                *id,
                cfg.clone(),
                router,
                make_gpu(pages, cfg.page_size),
            )));
            pool_pages.insert(*id, pages);
        }
        for (id, &pages) in decodes.iter().zip(&sc.topology.decode_pool_pages) {
            nodes.push(Node::Decode(DecodeNode::new(
                *id,
                cfg.clone(),
                router,
                make_gpu(pages, cfg.page_size),
            )));
            pool_pages.insert(*id, pages);
        }
        let client = NodeId(np + nd + 1);
        let oracle = Oracle::new(cfg.clone(), &requests, pool_pages);
        let mut w = World {
            now_ns: 0,
            seq: 0,
            events: 0,
            queue: BinaryHeap::new(),
            nodes,
            router,
            client,
            timers: BTreeMap::new(),
            latency_ns: sc.network.latency_us * 1_000,
            requests: requests.clone(),
            replies: BTreeMap::new(),
            oracle,
            outbox: Outbox::new(0),
            log: trace.then(Vec::new),
            max_events: sc.run.max_events,
            max_time_ns: sc.run.max_time_ms.saturating_mul(1_000_000),
        };
        for r in &requests {
            w.push(r.at_ns, Pending::Submit { req: r.req });
            if let Some(at) = r.cancel_at_ns {
                w.push(at, Pending::Cancel { req: r.req });
            }
        }
        Ok(w)
    }

    fn push(&mut self, at_ns: u64, ev: Pending<G::Kv>) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at_ns,
            seq: self.seq,
            ev,
        }));
    }

    fn line(&mut self, room: Option<RoomKey>, text: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(TraceLine {
                at_ns: self.now_ns,
                event: self.events,
                room,
                text: text(),
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
    pub fn take_log(&mut self) -> Vec<TraceLine> {
        self.log.take().unwrap_or_default()
    }

    /// KV writes for `room` addressed to `node` still in the queue.
    fn writes_in_queue(
        queue: &BinaryHeap<Reverse<Queued<G::Kv>>>,
        node: NodeId,
        room: RoomKey,
    ) -> usize {
        queue
            .iter()
            .filter(|q| matches!(&q.0.ev, Pending::Deliver { to, msg: Msg::KvWrite { room: r, .. }, .. } if *to == node && *r == room))
            .count()
    }

    /// Process one event. `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse(q)) = self.queue.pop() else {
            return false;
        };
        if let Pending::Fire { node, timer, token } = &q.ev {
            // A cancelled or replaced timer: not an event, and it does not move time.
            if self.timers.get(&(*node, *timer)) != Some(token) {
                return true;
            }
        }
        self.now_ns = q.at_ns;
        self.events += 1;
        self.oracle.set_clock(self.now_ns, self.events);
        match q.ev {
            Pending::Submit { req } => {
                let Some(r) = self.requests.get(req.0 as usize).cloned() else {
                    return true;
                };
                let msg = Msg::Submit {
                    req,
                    tenant: r.tenant,
                    prompt: r.prompt(),
                    max_new_tokens: r.max_new_tokens,
                };
                let (client, router) = (self.client, self.router);
                self.line(None, || {
                    format!(
                        "client submits {req} ({}, prompt {} tokens)",
                        r.tenant, r.prompt_len
                    )
                });
                self.send(client, router, msg);
            }
            Pending::Cancel { req } => {
                let (client, router) = (self.client, self.router);
                self.line(None, || format!("client disconnects {req}"));
                self.send(client, router, Msg::Cancel { req });
            }
            Pending::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Pending::Fire { node, timer, token } => {
                if self.timers.get(&(node, timer)) == Some(&token) {
                    self.timers.remove(&(node, timer));
                    let room = match timer {
                        Timer::Bootstrap(r)
                        | Timer::WaitingForKv(r)
                        | Timer::DrainRetry(r)
                        | Timer::Request(r) => Some(r),
                        Timer::Compute => None,
                    };
                    self.line(room, || format!("{node} timer {timer:?} fires"));
                    self.dispatch(node, Input::Timer(timer));
                }
            }
        }
        true
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) {
        let at = self.now_ns + self.latency_ns;
        self.push(at, Pending::Deliver { from, to, msg });
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, msg: Msg<G::Kv>) {
        let room = msg.room();
        self.line(room, || format!("{to} <- {from} {}", msg.summary()));
        if to == self.client {
            if let Msg::Response {
                req,
                status,
                tokens,
            } = msg
            {
                self.oracle.on_response(req, status, &tokens);
                self.replies
                    .entry(req)
                    .or_default()
                    .push(ClientReply { status, tokens });
            }
            return;
        }
        if (to.0 as usize) >= self.nodes.len() {
            return;
        }
        self.oracle.before_deliver(&self.nodes, from, to, &msg);
        let submitted = match &msg {
            Msg::Submit { req, .. } if to == self.router => Some(*req),
            _ => None,
        };
        self.dispatch_with(to, Input::Message { from, msg }, submitted);
    }

    fn dispatch(&mut self, node: NodeId, input: Input<G::Kv>) {
        self.dispatch_with(node, input, None)
    }

    fn dispatch_with(&mut self, node: NodeId, input: Input<G::Kv>, submitted: Option<RequestId>) {
        self.outbox.reset(self.now_ns);
        self.nodes[node.0 as usize].handle(input, &mut self.outbox);
        let traces = std::mem::take(&mut self.outbox.traces);
        let sends = std::mem::take(&mut self.outbox.sends);
        let timers = std::mem::take(&mut self.outbox.timers);
        for (to, msg) in &sends {
            if node == self.router {
                self.oracle.on_router_send(submitted, msg, *to);
            }
        }
        for ev in &traces {
            let queue = &self.queue;
            let flying = |n: NodeId, r: RoomKey| Self::writes_in_queue(queue, n, r);
            self.oracle.on_trace(&self.nodes, &flying, ev);
            self.line(ev.room(), || {
                format!("  {}", crate::report::describe_event(ev))
            });
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
                    self.queue.push(Reverse(Queued {
                        at_ns: at,
                        seq: token,
                        ev: Pending::Fire { node, timer, token },
                    }));
                }
                TimerOp::Cancel { timer } => {
                    self.timers.remove(&(node, timer));
                }
            }
        }
        self.oracle.after_event(&self.nodes);
        // Give the buffers back so the next call reuses their capacity.
        self.outbox.traces = traces;
        self.outbox.traces.clear();
    }

    /// Run until the queue is empty or a limit is hit; then check liveness.
    pub fn run(&mut self) {
        let mut stuck = None;
        while self.step() {
            if self.events >= self.max_events {
                stuck = Some(format!(
                    "run did not settle within {} events",
                    self.max_events
                ));
                break;
            }
            if self.now_ns >= self.max_time_ns {
                stuck = Some(format!(
                    "run did not settle within {} ms of simulated time",
                    self.max_time_ns / 1_000_000
                ));
                break;
            }
        }
        self.oracle.at_quiescence(&self.nodes, stuck);
    }
}
