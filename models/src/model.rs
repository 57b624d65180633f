//! `HandoffModel`: the stateright model whose transitions call the engine's own nodes.
//!
//! Each action is one environment decision (a client submits or disconnects, the
//! network delivers, loses, duplicates or fails a message, a timer fires). Its
//! transition feeds exactly one input to one real node through [`Node::handle`]-style
//! calls with an [`Outbox`], then applies the recorded effects the way the simulator
//! does: sends go in flight (responses reach the client at once, because client to
//! router traffic is not faulted), timers are set or cancelled, and every engine event
//! the handler emitted is checked by the oracles before the next action. Nothing about
//! the engine is re-specified here: only the environment is model-side.
//!
//! Oracles. A stateright property is a plain function of one state, so a transition
//! that emits an offending event records the broken invariant in
//! [`State::violations`]; the `always` properties read those bits. The checks are the
//! simulator's (`kvsim_sim::oracle`): S2 on KV-write delivery, S3 on every `Attend`
//! against `SymbolicGpu` provenance and on every reply's canary tokens, S4 and S7 on
//! `TransferAccepted`, S5 on admission, reservation, send or batch of a request that
//! must be rejected, S6 on every answer, S9 on `QuarantineReleased`, and each node's
//! own `invariants()` (S1, S8) after every input it handles.
//!
//! [`Node::handle`]: kvsim_engine::node::Node::handle

use crate::memo::{self, Cause, Effect, Machine, Routed};
use crate::shared::Shared;
use crate::spec::{ClientSpec, ModelSpec, SpecError};
use crate::state::{
    note, Action, Book, Client, Envelope, FaultsUsed, State, CLIENT, DECODE, PREFILL, ROUTER,
};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Input, TimerOp};
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, TenantId};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::{Msg, Status, TransferOutcome};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::trace::{Side, TraceEvent};
use kvsim_engine::{Cfg, Timer};
use kvsim_sim::oracle::{
    exceeds_limit, isolation_breach, length_disagreement, over_limit_invariant, source_read_breach,
    write_target_breach,
};
use kvsim_sim::report::describe_event;
use kvsim_sim::scenario::{canary_owner, PlannedRequest};
use smallvec::SmallVec;
use stateright::{Model, Property};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// What one transition did, for counterexamples and the Explorer: the engine events
/// it emitted as sentences, and each invariant it broke with a sentence saying how.
#[derive(Clone, Debug, Default)]
pub struct StepLog {
    pub events: Vec<String>,
    pub violations: Vec<Violation>,
}

/// A model of the prefill-to-decode handoff around the engine's real nodes.
#[derive(Debug)]
pub struct HandoffModel {
    spec: ModelSpec,
    cfg: Cfg,
    /// Per client slot, its group: the first slot with an identical spec.
    groups: Vec<u8>,
    /// Properties that already have a discovery (one bit each, see [`latch_first`]).
    latched: AtomicU64,
    /// This model's key in the node-transition caches ([`crate::memo`]).
    id: u64,
    /// Recompute every cached transition and compare (tests).
    memo_check: bool,
    /// Bypass the caches altogether (to measure what they save).
    memo_off: bool,
}

/// Model keys for the transition caches: one per `HandoffModel::new`.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

impl Clone for HandoffModel {
    /// A clone starts with no discovery latched: it is a fresh model for a new run.
    fn clone(&self) -> Self {
        HandoffModel {
            spec: self.spec.clone(),
            cfg: self.cfg.clone(),
            groups: self.groups.clone(),
            latched: AtomicU64::new(0),
            id: self.id,
            memo_check: self.memo_check,
            memo_off: self.memo_off,
        }
    }
}

/// Report a property's discovery once. stateright 0.31's checkers record a discovery
/// every time a state satisfies a `sometimes` or breaks an `always` (bfs.rs inserts
/// without checking), so the path it keeps is the last, deepest one. A property
/// function that answers "discovered" only for the first such state makes the
/// single-threaded BFS report a shortest path (and a multi-threaded one a near-shortest).
fn latch_first(m: &HandoffModel, bit: u32) -> bool {
    m.latched.fetch_or(1 << bit, AtomicOrdering::Relaxed) & (1 << bit) == 0
}

/// Has this property's discovery been reported already? (Then its condition need not
/// be evaluated again: the answer is "no new discovery".)
fn latched(m: &HandoffModel, bit: u32) -> bool {
    m.latched.load(AtomicOrdering::Relaxed) & (1 << bit) != 0
}

impl HandoffModel {
    pub fn new(spec: ModelSpec) -> Result<Self, SpecError> {
        spec.validate()?;
        let groups = spec
            .clients
            .iter()
            .map(|c| {
                let first = spec.clients.iter().position(|d| d == c);
                first.expect("a client is equal to itself") as u8
            })
            .collect();
        Ok(HandoffModel {
            cfg: Cfg::new(spec.engine.clone()),
            spec,
            groups,
            latched: AtomicU64::new(0),
            id: NEXT_MODEL_ID.fetch_add(1, AtomicOrdering::Relaxed),
            memo_check: false,
            memo_off: false,
        })
    }

    /// Recompute every node transition the cache answers and panic if the engine now
    /// says something else (proves the cache changes nothing; slow).
    pub fn with_memo_check(mut self) -> Self {
        self.memo_check = true;
        self
    }

    /// Compute every node transition afresh: no cache (for comparison).
    pub fn without_memo(mut self) -> Self {
        self.memo_off = true;
        self
    }

    /// Node transitions this model's checks computed and reused so far (complete for
    /// threads that have exited: call it after the checker is joined).
    pub fn memo_stats(&self) -> memo::MemoStats {
        memo::stats(self.id)
    }

    /// The effect of `input` on one node, computed by the engine or reused.
    fn transition<N: Machine>(
        &self,
        id: NodeId,
        before: &Shared<N>,
        cause: Cause,
    ) -> Arc<Effect<N>> {
        if self.memo_off {
            memo::tally(self.id, false);
            Arc::new(memo::compute(id, before, cause.input()))
        } else {
            memo::transition(self.id, id, before, cause, self.memo_check)
        }
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn cfg(&self) -> &Cfg {
        &self.cfg
    }

    /// The spec of a client.
    pub fn client_spec(&self, c: &Client) -> &ClientSpec {
        &self.spec.clients[c.group as usize]
    }

    /// The request a client sends once it has been given `req`.
    pub fn planned(&self, c: &Client, req: RequestId) -> PlannedRequest {
        let spec = self.client_spec(c);
        PlannedRequest {
            req,
            tenant: TenantId(spec.tenant),
            prompt_len: spec.prompt_len,
            max_new_tokens: spec.max_new_tokens,
            at_ns: 0,
            cancel: None,
        }
    }

    /// Must `side` reject this request at intake (its own length limit)?
    pub fn must_reject(&self, spec: &ClientSpec, side: Side) -> bool {
        match side {
            Side::Prefill => exceeds_limit(&self.cfg, self.spec.prefill_pages, spec.prompt_len),
            Side::Decode => exceeds_limit(
                &self.cfg,
                self.spec.decode_pages,
                spec.prompt_len + u64::from(spec.max_new_tokens),
            ),
        }
    }

    /// Must either half reject this request?
    pub fn over_length(&self, spec: &ClientSpec) -> bool {
        self.must_reject(spec, Side::Prefill) || self.must_reject(spec, Side::Decode)
    }

    /// The initial state: fresh nodes, idle clients, nothing in flight.
    pub fn initial(&self) -> State {
        let router = Router::new(ROUTER, self.cfg.clone(), vec![PREFILL], vec![DECODE]);
        let ps = self.cfg.page_size;
        let prefill = PrefillNode::new(
            PREFILL,
            self.cfg.clone(),
            ROUTER,
            SymbolicGpu::new(self.spec.prefill_pages, ps),
        );
        let decode = DecodeNode::new(
            DECODE,
            self.cfg.clone(),
            ROUTER,
            SymbolicGpu::new(self.spec.decode_pages, ps),
        );
        State {
            router: Shared::new(router),
            prefill: Shared::new(prefill),
            decode: Shared::new(decode),
            net: Vec::new(),
            timers: Vec::new(),
            book: Shared::new(Book {
                clients: self
                    .groups
                    .iter()
                    .map(|&group| Client {
                        group,
                        req: None,
                        cancelled: false,
                        reply: None,
                    })
                    .collect(),
                rooms: SmallVec::new(),
                notes: SmallVec::new(),
                faults: FaultsUsed::default(),
                violations: 0,
            }),
        }
    }

    /// Apply one action to a state; with `log`, also say what happened.
    pub fn step(&self, s: &State, action: &Action, log: Option<&mut StepLog>) -> State {
        let mut tx = Tx {
            m: self,
            s: s.clone(),
            log,
        };
        match action {
            Action::Submit(slot) => {
                let slot = *slot as usize;
                let req = RequestId(s.clients().iter().filter(|c| c.req.is_some()).count() as u64);
                let client = s.clients()[slot];
                tx.s.book(|b| b.clients[slot].req = Some(req));
                let p = self.planned(&client, req);
                let msg = Msg::Submit {
                    req,
                    tenant: p.tenant,
                    prompt: p.prompt(),
                    max_new_tokens: p.max_new_tokens,
                };
                tx.dispatch(
                    ROUTER,
                    Cause::Input(Input::Message { from: CLIENT, msg }),
                    Some(req),
                );
            }
            Action::Cancel(slot) => {
                let slot = *slot as usize;
                tx.s.book(|b| b.clients[slot].cancelled = true);
                if let Some(req) = s.clients()[slot].req {
                    tx.dispatch(
                        ROUTER,
                        Cause::Input(Input::Message {
                            from: CLIENT,
                            msg: Msg::Cancel { req },
                        }),
                        None,
                    );
                }
            }
            Action::Deliver(e) => {
                if tx.s.take(e) {
                    tx.deliver(e);
                }
            }
            Action::Overtake(e) => {
                tx.s.book(|b| b.faults.overtakes += 1);
                if tx.s.take(e) {
                    tx.deliver(e);
                }
            }
            Action::Duplicate(e) => {
                tx.s.book(|b| b.faults.duplicates += 1);
                tx.deliver(e);
            }
            Action::Lose(e) => {
                tx.s.book(|b| b.faults.losses += 1);
                tx.s.take(e);
            }
            Action::FailWrite(e) => {
                tx.s.book(|b| b.faults.write_failures += 1);
                if tx.s.take(e) {
                    if let Some(done) = e.get().failed_completion() {
                        tx.s.send(done);
                    }
                }
            }
            Action::Crash(node) => tx.crash(*node),
            Action::Fire(node, timer) => {
                if *timer != Timer::Compute && s.timeout_is_early() {
                    tx.s.book(|b| b.faults.early_timeouts += 1);
                }
                if tx.s.cancel_timer(*node, *timer) {
                    if let (DECODE, Timer::DrainRetry(room)) = (*node, *timer) {
                        if tx.quarantined(room) {
                            tx.s.note(room, note::DRAIN_RETRIED);
                        }
                    }
                    tx.dispatch(*node, Cause::Input(Input::Timer(*timer)), None);
                }
            }
        }
        tx.s
    }

    /// Is no action enabled? (The definition of quiescence the liveness property uses.)
    pub fn is_quiescent(&self, s: &State) -> bool {
        if !s.net.is_empty() || !s.timers.is_empty() {
            return false;
        }
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.is_empty()
    }

    /// At quiescence, what is not as it must be: a request without an answer, a room
    /// still open, a request still held, a page not returned. A decode node that
    /// stopped loudly (a drain ack never came) may keep its quarantine: that is the
    /// loud stop DESIGN L3 allows, never a silent leak.
    pub fn quiescence_problem(&self, s: &State) -> Option<String> {
        if let Some((i, _)) = s
            .clients()
            .iter()
            .enumerate()
            .find(|(_, c)| c.reply.is_none())
        {
            return Some(format!("L1: client {i} never got an answer"));
        }
        let router = s.router.get();
        if router.live_rooms() > 0 {
            return Some(format!(
                "L2: the router still has {} rooms open",
                router.live_rooms()
            ));
        }
        let prefill = s.prefill.get();
        let decode = s.decode.get();
        if prefill.requests() > 0 || decode.requests() > 0 {
            return Some(format!(
                "L1: requests still held (prefill {}, decode {})",
                prefill.requests(),
                decode.requests()
            ));
        }
        let full = |p: &kvsim_engine::kv::PagePool| p.free_count() == p.capacity();
        if !full(prefill.pool()) {
            return Some("L4: prefill's pool is not full".into());
        }
        if decode.fatal().is_none() {
            if decode.quarantined_rooms() > 0 {
                return Some(format!(
                    "L3: decode still quarantines {} rooms and has not stopped",
                    decode.quarantined_rooms()
                ));
            }
            if !full(decode.pool()) {
                return Some("L4: decode's pool is not full".into());
            }
        }
        None
    }

    /// The rendered log of one action from `s`.
    pub fn explain(&self, s: &State, action: &Action) -> (State, StepLog) {
        let mut log = StepLog::default();
        let next = self.step(s, action, Some(&mut log));
        (next, log)
    }
}

/// One transition under construction.
struct Tx<'a> {
    m: &'a HandoffModel,
    s: State,
    log: Option<&'a mut StepLog>,
}

impl Tx<'_> {
    fn violate(&mut self, inv: Invariant, detail: impl FnOnce() -> String) {
        self.s.violate(inv);
        if let Some(log) = self.log.as_deref_mut() {
            log.violations.push(Violation::new(inv, detail()));
        }
    }

    fn event(&mut self, text: impl FnOnce() -> String) {
        if let Some(log) = self.log.as_deref_mut() {
            log.events.push(text());
        }
    }

    fn quarantined(&self, room: RoomKey) -> bool {
        self.s
            .decode
            .get()
            .pool()
            .records()
            .any(|(_, r)| r.owner == Some(room) && r.state == PageState::Quarantined)
    }

    fn describe(&self, room: RoomKey) -> String {
        match self
            .s
            .req_of(room)
            .and_then(|r| self.s.client_of(r).map(|c| (r, c)))
        {
            Some((req, c)) => {
                let spec = self.m.client_spec(c);
                format!(
                    "{room} ({req} of t{}, prompt {} tokens)",
                    spec.tenant, spec.prompt_len
                )
            }
            None => room.to_string(),
        }
    }

    /// The prefill or decode node crashes and restarts at once into its next
    /// incarnation, as the simulator's `World` does it: the node's timers die; messages
    /// in flight to it are lost with the dead incarnation, except that a KV write to
    /// it fails back to its writer (the writer's NIC reports the error); its own KV
    /// writes in flight are flushed, never applied. Control messages it sent before
    /// the crash still arrive.
    fn crash(&mut self, node: NodeId) {
        let busy = match node {
            PREFILL => self.s.prefill.get().requests() > 0,
            DECODE => {
                let d = self.s.decode.get();
                d.requests() > 0 || d.quarantined_rooms() > 0
            }
            _ => return,
        };
        self.s.book(|b| {
            b.faults.crashes += 1;
            if busy {
                b.faults.busy_crashes += 1;
            }
        });
        let local = match node {
            PREFILL => {
                let epoch = self.s.prefill.get().pool().epoch() + 1;
                self.s.prefill.update(|n| {
                    n.restart(epoch);
                    n.invariants()
                })
            }
            _ => {
                let epoch = self.s.decode.get().pool().epoch() + 1;
                self.s.decode.update(|n| {
                    n.restart(epoch);
                    n.invariants()
                })
            }
        };
        self.event(|| format!("{node} crashes and restarts into a new incarnation"));
        if let Err(v) = local {
            self.violate(v.invariant, || format!("{node}: {}", v.detail));
        }
        self.s.timers.retain(|(n, _)| *n != node);
        let mut failed = Vec::new();
        self.s.net.retain(|e| {
            let env = e.get();
            if env.to == node {
                failed.extend(env.failed_completion());
                return false;
            }
            !(env.from == node && matches!(env.msg, Msg::KvWrite { .. }))
        });
        for env in failed {
            self.s.send(env);
        }
        if node == DECODE {
            // The new incarnation has no quarantine and no retry count.
            let rooms: Vec<RoomKey> = self.s.book.get().notes.iter().map(|(k, _)| *k).collect();
            for room in rooms {
                self.s.unnote(room, note::DRAIN_RETRIED);
            }
        }
    }

    /// Checks at delivery, before the receiver acts (as the simulator's oracle).
    fn deliver(&mut self, shared: &Shared<Envelope>) {
        let env = shared.get();
        if let Msg::KvWrite { room, dst, .. } = &env.msg {
            let epoch = self.s.decode.get().pool().epoch();
            if env.to == DECODE && dst.iter().any(|t| t.gen.epoch() != epoch) {
                // Addressed to a dead incarnation's memory registration: the write
                // fails on the wire and the writer's NIC reports it.
                self.event(|| {
                    format!("the KV write for {room} fails: its registration died with decode's previous incarnation")
                });
                self.s.send(env.failed_completion().expect("a KV write"));
                return;
            }
        }
        match &env.msg {
            Msg::KvWrite { room, src, dst, .. } if env.to == DECODE => {
                let room = *room;
                if let Some((t, rec)) = write_target_breach(self.s.decode.get().pool(), room, dst) {
                    let d = self.describe(room);
                    self.violate(Invariant::S2, || {
                        let now = rec.map_or("not a pool page".into(), |r| {
                            format!("{} {} owner {:?}", r.state, r.gen, r.owner)
                        });
                        format!("a KV write for {d} aimed at decode page {t} lands after the page left the room (now {now})")
                    });
                }
                if let Some(t) = source_read_breach(self.s.prefill.get().pool(), src) {
                    let d = self.describe(room);
                    self.violate(Invariant::S2, || {
                        format!("prefill freed source page {t} of {d} while its KV write was still reading it")
                    });
                }
            }
            Msg::KvDone {
                room,
                outcome: TransferOutcome::Failed,
            } if env.to == DECODE => self.s.note(*room, note::TRANSFER_FAILED),
            _ => {}
        }
        self.dispatch(env.to, Cause::Delivered(shared.clone()), None);
    }

    /// Feed one input to one node and apply its effects.
    fn dispatch(&mut self, node: NodeId, cause: Cause, submitted: Option<RequestId>) {
        // S7 needs to know which completion (if any) the input is.
        let kv_done = match &cause {
            Cause::Delivered(e) => match &e.get().msg {
                Msg::KvDone { room, .. } => Some((e.get().from, *room)),
                _ => None,
            },
            Cause::Input(_) => None,
        };
        match node {
            ROUTER => {
                let e = self.m.transition(node, &self.s.router, cause);
                self.s.router = e.after.clone();
                self.apply(
                    node, &e.local, &e.sends, &e.timers, &e.traces, kv_done, submitted,
                );
            }
            PREFILL => {
                let e = self.m.transition(node, &self.s.prefill, cause);
                self.s.prefill = e.after.clone();
                self.apply(
                    node, &e.local, &e.sends, &e.timers, &e.traces, kv_done, submitted,
                );
            }
            DECODE => {
                let e = self.m.transition(node, &self.s.decode, cause);
                self.s.decode = e.after.clone();
                self.apply(
                    node, &e.local, &e.sends, &e.timers, &e.traces, kv_done, submitted,
                );
            }
            _ => {}
        }
    }

    /// Apply what a node did (its new state is already in place): check its events,
    /// put its messages in flight, answer clients, set and cancel its timers.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        node: NodeId,
        local: &Result<(), Violation>,
        sends: &[Routed],
        timers: &[TimerOp],
        traces: &[TraceEvent],
        kv_done: Option<(NodeId, RoomKey)>,
        submitted: Option<RequestId>,
    ) {
        if let Some(req) = submitted {
            for send in sends {
                if let Routed::Peer(e) = send {
                    if let Msg::DecodeStart { room, .. } = &e.get().msg {
                        self.s.add_room(*room, req);
                    }
                }
            }
        }
        for ev in traces {
            self.event(|| describe_event(ev));
            self.check(node, ev, kv_done);
        }
        if let Err(v) = local {
            self.violate(v.invariant, || format!("{node}: {}", v.detail));
        }
        for send in sends {
            match send {
                Routed::Client(msg) => self.respond(msg),
                Routed::Peer(e) => {
                    if let Some(log) = self.log.as_deref_mut() {
                        log.events.push(format!(
                            "{node} sends {} to {}",
                            e.get().msg.summary(),
                            e.get().to
                        ));
                    }
                    self.s.send_shared(e.clone());
                }
            }
        }
        for op in timers {
            match *op {
                TimerOp::Set { timer, .. } => self.s.set_timer(node, timer),
                TimerOp::Cancel { timer } => {
                    self.s.cancel_timer(node, timer);
                }
            }
        }
    }

    /// The router answered a client (delivered at once: client traffic is reliable).
    fn respond(&mut self, msg: &Msg<SymbolicPage>) {
        let &Msg::Response {
            req,
            status,
            ref tokens,
        } = msg
        else {
            return;
        };
        let Some(i) = self.s.clients().iter().position(|c| c.req == Some(req)) else {
            return;
        };
        self.event(|| {
            format!(
                "client {i} gets {status} for {req} ({} tokens)",
                tokens.len()
            )
        });
        let client = self.s.clients()[i];
        if client.reply.is_some() {
            self.violate(Invariant::S6, || {
                format!("{req} got a second terminal response ({status})")
            });
        } else {
            self.s.book(|b| b.clients[i].reply = Some(status));
        }
        if status.is_ok() && self.m.over_length(self.m.client_spec(&client)) {
            self.violate(Invariant::S6, || {
                format!("{req} does not fit the pool and must be rejected, but the client got 200")
            });
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| canary_owner(t).is_some_and(|o| o != req))
        {
            self.violate(Invariant::S3, || {
                format!(
                    "canary: the {status} reply to {req} echoes token {t:#010x} from the prompt of {}",
                    canary_owner(t).map_or("?".into(), |o| o.to_string())
                )
            });
        }
    }

    /// S5 (or L5) when a request that exceeds `side`'s limit gets something there.
    fn s5(&mut self, node: NodeId, room: RoomKey, side: Side, what: &str) {
        let Some(spec) = self
            .s
            .req_of(room)
            .and_then(|r| self.s.client_of(r))
            .map(|c| self.m.client_spec(c))
        else {
            return;
        };
        if !self.m.must_reject(spec, side) {
            return;
        }
        let (need, flag) = match side {
            Side::Prefill => (spec.prompt_len, note::FLAGGED_PREFILL),
            Side::Decode => (
                spec.prompt_len + u64::from(spec.max_new_tokens),
                note::FLAGGED_DECODE,
            ),
        };
        let flagged = self.s.noted(room, flag);
        let d = self.describe(room);
        match over_limit_invariant(Some(need), self.m.cfg.context_len, flagged) {
            Invariant::L5 => self.violate(Invariant::L5, || {
                format!(
                    "{d} needs more than {node}'s pool, yet it {what}: admitted beyond the pool"
                )
            }),
            inv => self.violate(inv, || {
                format!("{d} exceeds {node}'s limit and must be rejected at intake, but it {what}")
            }),
        }
    }

    /// The simulator oracle's per-event checks, on the state after the handler.
    fn check(&mut self, node: NodeId, ev: &TraceEvent, kv_done: Option<(NodeId, RoomKey)>) {
        match ev {
            TraceEvent::Admitted { room, side, .. } => self.s5(
                node,
                *room,
                *side,
                "was admitted (got a sender or receiver)",
            ),
            TraceEvent::PagesReserved { room, pages, .. } => {
                let (side, cap) = if node == PREFILL {
                    (Side::Prefill, self.m.spec.prefill_pages)
                } else {
                    (Side::Decode, self.m.spec.decode_pages)
                };
                let n = pages.len();
                self.s5(node, *room, side, &format!("got {n} pages"));
                if n > cap as usize {
                    let d = self.describe(*room);
                    self.violate(Invariant::L5, || {
                        format!("{d} reserved {n} pages on {node}, whose pool has {cap}")
                    });
                }
            }
            TraceEvent::KvSent { room, .. } => self.s5(node, *room, Side::Prefill, "sent KV"),
            TraceEvent::Running { room, side, .. } => {
                self.s5(node, *room, *side, "joined a running batch")
            }
            TraceEvent::TransferAccepted {
                room,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
                ..
            } => {
                let room = *room;
                if kv_done != Some((PREFILL, room)) {
                    let d = self.describe(room);
                    self.violate(Invariant::S7, || {
                        format!("decode accepted the transfer of {d} on an input that is not that room use's completion from its prefill ({kv_done:?})")
                    });
                }
                if !self.s.noted(room, note::TRANSFER_FAILED) {
                    let true_len = self
                        .s
                        .req_of(room)
                        .and_then(|r| self.s.client_of(r))
                        .map(|c| self.m.client_spec(c).prompt_len);
                    if let Some(p) = length_disagreement(
                        true_len,
                        *prompt_len,
                        *reserved_pages,
                        *sent_tokens,
                        *sent_pages,
                        *fully_written,
                    ) {
                        let d = self.describe(room);
                        self.violate(Invariant::S4, || {
                            format!("decode accepted the transfer of {d}: {p}")
                        });
                    }
                }
            }
            TraceEvent::Attend {
                room,
                seq_len,
                pages,
                ..
            } => {
                let breach = isolation_breach(
                    self.s.decode.get().gpu(),
                    self.m.cfg.page_size,
                    *room,
                    *seq_len,
                    pages,
                );
                if let Some((i, t, prov)) = breach {
                    let (room, d) = (*room, self.describe(*room));
                    let whose = match prov.writer {
                        Some(w) if w == room => {
                            format!("only slots {}..{} are its own", prov.lo, prov.hi)
                        }
                        Some(w) => format!("it holds KV written by {}", self.describe(w)),
                        None => "it was never written".to_string(),
                    };
                    self.violate(Invariant::S3, || {
                        format!("decode attends for {d} over page {t} (page {i} of its sequence) but {whose}")
                    });
                }
            }
            TraceEvent::RejectedLegacy { node, room, .. } => self.s.note(
                *room,
                if *node == PREFILL {
                    note::FLAGGED_PREFILL
                } else {
                    note::FLAGGED_DECODE
                },
            ),
            TraceEvent::AbortNoted {
                room,
                side: Side::Prefill,
                ..
            } => self.s.note(*room, note::PREFILL_ABORTED),
            TraceEvent::Responded {
                room, side, status, ..
            } if status.is_ok() => {
                let room = *room;
                if *side == Side::Prefill && self.s.noted(room, note::PREFILL_ABORTED) {
                    let d = self.describe(room);
                    self.violate(Invariant::S6, || {
                        format!("prefill answered 200 for {d} after its abort became visible")
                    });
                }
                if *side == Side::Decode && self.s.noted(room, note::TRANSFER_FAILED) {
                    let d = self.describe(room);
                    self.violate(Invariant::S6, || {
                        format!("decode answered 200 for {d} after its KV transfer failed")
                    });
                }
            }
            TraceEvent::QuarantineReleased { room, acked, .. } => {
                let (room, acked) = (*room, *acked);
                if acked != room {
                    let d = self.describe(room);
                    self.violate(Invariant::S9, || {
                        format!("decode released the quarantine of {d} on a drain ack for {acked}")
                    });
                }
                let flying = self
                    .s
                    .prefill
                    .get()
                    .writes_in_flight(room)
                    .max(self.s.writes_in_flight(room));
                if flying > 0 {
                    let d = self.describe(room);
                    self.violate(Invariant::S9, || {
                        format!("decode released the quarantine of {d} while {flying} of its KV writes were still in flight")
                    });
                }
                self.s.unnote(room, note::DRAIN_RETRIED);
            }
            TraceEvent::RoomCleared { room, .. } => self
                .s
                .unnote(*room, note::TRANSFER_FAILED | note::PREFILL_ABORTED),
            _ => {}
        }
    }
}

macro_rules! safety {
    ($($fn_name:ident => $inv:ident),* $(,)?) => {
        $(fn $fn_name(m: &HandoffModel, s: &State) -> bool {
            !(s.violated(Invariant::$inv) && latch_first(m, Invariant::$inv as u32))
        })*
    };
}

safety!(
    holds_s1 => S1, holds_s2 => S2, holds_s3 => S3, holds_s4 => S4, holds_s5 => S5,
    holds_s6 => S6, holds_s7 => S7, holds_s8 => S8, holds_s9 => S9, holds_l2 => L2,
    holds_l5 => L5,
);

/// Latch bits of the properties that are not one invariant each.
const BIT_QUIESCENCE: u32 = 20;
const BIT_COMPLETES: u32 = 21;
const BIT_REJECTED: u32 = 22;
const BIT_ABORT_RACE: u32 = 23;
const BIT_LATE_ACK: u32 = 24;
const BIT_CRASH: u32 = 25;

fn quiescence_holds(m: &HandoffModel, s: &State) -> bool {
    latched(m, BIT_QUIESCENCE)
        || !(m.is_quiescent(s)
            && m.quiescence_problem(s).is_some()
            && latch_first(m, BIT_QUIESCENCE))
}

fn request_completes(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_COMPLETES)
        && s.clients().iter().any(|c| c.reply == Some(Status::OK))
        && latch_first(m, BIT_COMPLETES)
}

fn over_length_rejected(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_REJECTED)
        && s.clients()
            .iter()
            .any(|c| c.reply == Some(Status::BAD_REQUEST) && m.over_length(m.client_spec(c)))
        && latch_first(m, BIT_REJECTED)
}

/// A KV write is in flight to decode while its destination no longer belongs to a
/// live request of its room (the room was aborted or failed: quarantined, or freed).
fn abort_races_write(m: &HandoffModel, s: &State) -> bool {
    let pool = s.decode.get().pool();
    !latched(m, BIT_ABORT_RACE)
        && s.net.iter().any(|e| match &e.get().msg {
            Msg::KvWrite { room, dst, .. } if e.get().to == DECODE => dst.iter().any(|t| {
                !pool
                    .record(t.page)
                    .is_some_and(|r| r.gen == t.gen && r.owner == Some(*room) && r.state.is_owned())
            }),
            _ => false,
        })
        && latch_first(m, BIT_ABORT_RACE)
}

/// A drain ack is on its way to decode for a quarantine whose retry timer already
/// fired (the ack is late: it arrives after the drain timeout).
fn drain_ack_after_timeout(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_LATE_ACK)
        && s.net.iter().any(|e| match &e.get().msg {
            Msg::DrainAck { room } => e.get().to == DECODE && s.noted(*room, note::DRAIN_RETRIED),
            _ => false,
        })
        && latch_first(m, BIT_LATE_ACK)
}

/// A prefill or decode node crashed while it held a request (or a quarantine).
fn busy_crash(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_CRASH) && s.faults().busy_crashes > 0 && latch_first(m, BIT_CRASH)
}

/// A property's condition.
type Condition = fn(&HandoffModel, &State) -> bool;

/// The names of the properties, as the CLI and the tests refer to them.
pub mod names {
    pub const S1: &str = "S1 partition";
    pub const S2: &str = "S2 no write after free";
    pub const S3: &str = "S3 isolation";
    pub const S4: &str = "S4 length agreement";
    pub const S5: &str = "S5 rejected means retired";
    pub const S6: &str = "S6 one honest answer";
    pub const S7: &str = "S7 metadata integrity";
    pub const S8: &str = "S8 free discipline";
    pub const S9: &str = "S9 release after drain";
    pub const L2: &str = "L2 room table consistent";
    pub const L5: &str = "L5 nothing larger than the pool admitted";
    pub const QUIESCENCE: &str =
        "L1-L4 no action enabled => every request answered, every pool full";
    pub const COMPLETES: &str = "a request completes";
    pub const ABORT_RACE: &str = "an abort races an in-flight KV write";
    pub const REJECTED: &str = "an over-length request is rejected";
    pub const LATE_ACK: &str = "a drain ack arrives after a timeout";
    pub const CRASH: &str = "a node crashes while it holds a request";
}

impl Model for HandoffModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for (slot, c) in s.clients().iter().enumerate() {
            if c.req.is_none() {
                out.push(Action::Submit(slot as u8));
            } else if self.client_spec(c).may_cancel && !c.cancelled && c.reply.is_none() {
                out.push(Action::Cancel(slot as u8));
            }
        }
        let bounds = &self.spec.faults;
        let used = &s.faults();
        for (i, e) in s.net.iter().enumerate() {
            if !s.is_head(i) {
                // Values are unique within a channel, so each overtake is one branch.
                if used.overtakes < bounds.overtakes {
                    out.push(Action::Overtake(e.clone()));
                }
                continue;
            }
            out.push(Action::Deliver(e.clone()));
            if e.get().is_rdma() {
                let is_write = matches!(e.get().msg, Msg::KvWrite { .. });
                if is_write && used.write_failures < bounds.write_failures {
                    out.push(Action::FailWrite(e.clone()));
                }
            } else {
                if used.losses < bounds.losses {
                    out.push(Action::Lose(e.clone()));
                }
                if used.duplicates < bounds.duplicates {
                    out.push(Action::Duplicate(e.clone()));
                }
            }
        }
        let timeouts_left = used.early_timeouts < bounds.early_timeouts || !s.timeout_is_early();
        for &(node, timer) in &s.timers {
            if timer == Timer::Compute || timeouts_left {
                out.push(Action::Fire(node, timer));
            }
        }
        // A crash races whatever else can happen; once nothing else can, the run is
        // over (and the quiescence property judges it), so a crash is not enabled.
        if used.crashes < bounds.crashes && !out.is_empty() {
            out.push(Action::Crash(PREFILL));
            out.push(Action::Crash(DECODE));
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        Some(self.step(s, &action, None))
    }

    fn format_action(&self, action: &Action) -> String {
        action.to_string()
    }

    fn format_step(&self, s: &State, action: Action) -> Option<String> {
        let (_, log) = self.explain(s, &action);
        let mut lines = log.events;
        lines.extend(log.violations.iter().map(|v| format!("VIOLATION {v}")));
        Some(lines.join("\n"))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::always(names::S1, holds_s1),
            Property::always(names::S2, holds_s2),
            Property::always(names::S3, holds_s3),
            Property::always(names::S4, holds_s4),
            Property::always(names::S5, holds_s5),
            Property::always(names::S6, holds_s6),
            Property::always(names::S7, holds_s7),
            Property::always(names::S8, holds_s8),
            Property::always(names::S9, holds_s9),
            Property::always(names::L2, holds_l2),
            Property::always(names::L5, holds_l5),
            Property::always(names::QUIESCENCE, quiescence_holds),
        ];
        let sometimes: [(&'static str, Condition); 5] = [
            (names::COMPLETES, request_completes),
            (names::ABORT_RACE, abort_races_write),
            (names::LATE_ACK, drain_ack_after_timeout),
            (names::REJECTED, over_length_rejected),
            (names::CRASH, busy_crash),
        ];
        for (name, f) in sometimes {
            if self.spec.reaches.contains(&name) {
                props.push(Property::sometimes(name, f));
            }
        }
        props
    }
}

/// The symmetry representative: clients of one group are interchangeable (identical
/// specs; ids are handed out in submission order, not per client), so sorting them is
/// a permutation the engine cannot observe. Pages and rooms are not permuted: renaming
/// them is not an automorphism of the engine (the pool releases a batch in page-id
/// order, as SGLang's `free` sorts it, so ids decide which page is handed out next;
/// see `renaming_pages_is_not_an_automorphism_of_the_allocator` in the engine's tests).
pub fn representative(s: &State) -> State {
    let mut r = s.clone();
    r.book(|b| b.clients.sort());
    r
}
