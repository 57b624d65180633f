//! `HandoffModel`: the stateright model whose transitions call the engine's own nodes.
//!
//! Each action is one environment decision (a client submits or disconnects, the
//! network delivers, loses, duplicates or fails a message, a timer fires, a node
//! crashes). Its transition feeds exactly one input to one real node through the
//! node's handler with an `Outbox`, then carries out the recorded effects in the
//! order the handler issued them through the world module every driver uses
//! (`kvsim_engine::world`: sends go in flight, timers are set or cancelled with the
//! world's timer semantics, events go to the oracle), and decides what the world does
//! to a message with the same rules as the simulator (`world::arrival`,
//! `world::crash_fate`). Nothing about the engine is re-specified here: only the
//! environment's choices are model-side.
//!
//! Oracle. The state carries the oracle's model of the run (`kvsim_oracle::
//! OracleState`, the one implementation of every invariant that the simulator and
//! `kvsim audit` use), fed the same records the simulator's trace holds: engine
//! events, client submits, failed writes, crashes and restarts. A transition whose
//! records produce a finding (a violation, or a hazard a defense had to stop) sets the
//! invariant's bit in [`Book::violations`]; the `always` properties read those bits,
//! and the quiescence property asks the oracle's end-of-run check (L1-L4) of every
//! state where nothing is left to do.

use crate::memo::{self, Cause, Effect, Machine, Routed};
use crate::model_state::{
    altered, note, stale_landing, Action, Book, Client, Envelope, FaultsUsed, StaleCopy, State,
    CLIENT, DECODE, PREFILL, ROUTER,
};
use crate::shared::Shared;
use crate::spec::{ClientSpec, ModelSpec, SpecError};
use kvsim_engine::decode::{DecodeNode, DecodePhase};
use kvsim_engine::env::{Effect as Step, Input, TimerOp};
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::ids::{NodeId, RequestId, TenantId, WriteId};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::trace::{FaultAction, Side, TraceEvent};
use kvsim_engine::world::{
    self, Arrival, Arriving, CrashWalk, DataFault, Driver, Flying, Timers, Topology, WriteFailure,
};
use kvsim_engine::{Cfg, Timer};
use kvsim_oracle::oracle_state::{must_reject, Draft, WriteFacts};
use kvsim_oracle::render::describe_event;
use kvsim_oracle::schema::{ClockKind, EndOutcome, FaultEvent, Record, RunHeader};
use kvsim_oracle::OracleState;
use smallvec::SmallVec;
use stateright::{Model, Property};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// What one transition did, for counterexamples and the Explorer: the engine events
/// it emitted as sentences, and each finding with a sentence saying how.
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
    /// The facts of the run the oracle needs (the same header a simulator trace has).
    header: RunHeader,
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
            header: self.header.clone(),
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
        let header = RunHeader::new(
            "kvsim-models",
            ClockKind::Simulated,
            &spec.engine,
            &Self::topology_of(&spec),
        );
        Ok(HandoffModel {
            cfg: Cfg::new(spec.engine.clone()),
            header,
            spec,
            groups,
            latched: AtomicU64::new(0),
            id: NEXT_MODEL_ID.fetch_add(1, AtomicOrdering::Relaxed),
            memo_check: false,
            memo_off: false,
        })
    }

    /// One prefill and one decode node: router `n0`, prefill `n1`, decode `n2`,
    /// client `n3`, as the simulator numbers them.
    pub fn topology_of(spec: &ModelSpec) -> Topology {
        Topology {
            prefill_pools: vec![spec.prefill_pages],
            decode_pools: vec![spec.decode_pages],
        }
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

    pub fn header(&self) -> &RunHeader {
        &self.header
    }

    /// The spec of a client.
    pub fn client_spec(&self, c: &Client) -> &ClientSpec {
        &self.spec.clients[c.group as usize]
    }

    /// The prompt a client sends once it has been given `req` (the canary prompt).
    pub fn prompt(&self, c: &Client, req: RequestId) -> Vec<kvsim_engine::Token> {
        kvsim_oracle::canary::prompt(req, self.client_spec(c).prompt_len)
    }

    /// Must either half reject this request (the oracle's rule)?
    pub fn over_length(&self, spec: &ClientSpec) -> bool {
        [Side::Prefill, Side::Decode].into_iter().any(|side| {
            must_reject(
                &self.header,
                side,
                PREFILL,
                DECODE,
                spec.prompt_len,
                spec.max_new_tokens,
            )
        })
    }

    /// Must this request be refused whatever the environment does? Malformed (the
    /// router's 400: no prompt, no or too many new tokens) or over-length.
    pub fn must_refuse(&self, spec: &ClientSpec) -> bool {
        spec.prompt_len == 0
            || spec.max_new_tokens == 0
            || spec.max_new_tokens > self.cfg.max_new_tokens_limit
            || self.over_length(spec)
    }

    /// Is a client's error answer explained by the environment or the request? Judged
    /// when the router answers (see [`names::CAUSED`]), on the state after its
    /// transition: the client cancelled; the request must be refused; a fault has
    /// been used; or the answer is the router's 503 for a full room table (every
    /// room is live with another request: load shedding at the stated capacity,
    /// `max_rooms`).
    pub fn error_explained(&self, s: &State, slot: usize, status: Status) -> bool {
        let c = &s.clients()[slot];
        status.is_ok()
            || c.cancelled
            || self.must_refuse(self.client_spec(c))
            || s.faults().any()
            || (status == Status::UNAVAILABLE
                && s.router.get().live_rooms() >= self.cfg.max_rooms as usize)
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
            vec![PREFILL],
            SymbolicGpu::new(self.spec.decode_pages, ps),
        );
        State {
            router: Shared::new(router),
            prefill: Shared::new(prefill),
            decode: Shared::new(decode),
            net: Vec::new(),
            timers: Timers::new(),
            stale: Vec::new(),
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
                notes: SmallVec::new(),
                faults: FaultsUsed::default(),
                violations: 0,
                detected: 0,
                uncaused: false,
                spent: SmallVec::new(),
            }),
            oracle: Shared::new(OracleState::new(&self.header)),
        }
    }

    /// Apply one action to a state; with `log`, also say what happened.
    pub fn step(&self, s: &State, action: &Action, log: Option<&mut StepLog>) -> State {
        let mut tx = Tx {
            m: self,
            s: s.clone(),
            log,
            oracle: None,
            drafts: Vec::new(),
            restart: None,
            replaying: None,
            replay: None,
        };
        match action {
            Action::Submit(slot) => tx.submit(*slot as usize),
            Action::Cancel(slot) => tx.cancel(*slot as usize),
            Action::Deliver(e) => {
                if tx.s.take(e) {
                    tx.deliver(e, false, None);
                }
            }
            Action::Overtake(e) => {
                tx.s.book(|b| b.faults.overtakes += 1);
                if tx.s.take(e) {
                    tx.deliver(e, false, None);
                }
            }
            Action::Duplicate(e) => {
                tx.s.book(|b| b.faults.duplicates += 1);
                tx.deliver(e, false, None);
            }
            Action::Alter(e, fault) => {
                tx.s.book(|b| b.faults.data_faults += 1);
                if tx.s.take(e) {
                    tx.deliver(e, false, Some(*fault));
                }
            }
            Action::KeepStale(e) => tx.keep_stale(e),
            Action::LandStale(c) => {
                if tx.s.take_stale(c) {
                    tx.land_stale(c.get());
                }
            }
            Action::Lose(e) => {
                tx.s.book(|b| b.faults.losses += 1);
                tx.s.take(e);
            }
            Action::FailWrite(e) => {
                tx.s.book(|b| b.faults.write_failures += 1);
                if tx.s.take(e) {
                    tx.deliver(e, true, None);
                }
            }
            Action::Crash(node) => tx.crash(*node, true),
            Action::Pause(node) => tx.pause(*node),
            Action::Wake(node) => tx.wake(*node),
            Action::Fire(node, timer) => tx.fire_timer(*node, *timer),
            Action::Refire(node, timer) => tx.refire(*node, *timer),
        }
        tx.finish()
    }

    /// What the world knows about a message arriving at `to` in `s` (every node is up
    /// and connected: crashes restart at once, the models have no partitions).
    fn arriving(&self, s: &State, to: NodeId, fail: bool) -> Arriving {
        Arriving {
            sender_alive: true,
            receiver_alive: true,
            receiver_restarted: false,
            receiver_epoch: match to {
                PREFILL => s.prefill.get().pool().epoch(),
                DECODE => s.decode.get().pool().epoch(),
                _ => 0,
            },
            partitioned: false,
            injected_failure: fail,
        }
    }

    /// The faults the environment may do to the RDMA message `e` at the head of its
    /// channel: fail a KV write, or land it altered by a data fault (one with
    /// something to act on) or keep a copy of it to land again.
    #[inline]
    fn write_actions(&self, s: &State, e: &Shared<Envelope>, out: &mut Vec<Action>) {
        let bounds = &self.spec.faults;
        let used = &s.faults();
        let is_write = matches!(e.get().msg, Msg::KvWrite { .. });
        if is_write && used.write_failures < bounds.write_failures {
            out.push(Action::FailWrite(e.clone()));
        }
        if !is_write || used.data_faults >= bounds.data_faults {
            return;
        }
        // Only a write that lands, and a fault with something to act on.
        let env = e.get();
        let at = self.arriving(s, env.to, false);
        if !matches!(world::arrival(&env.msg, &at), Arrival::Deliver) {
            return;
        }
        let kinds = DataFault::ALL
            .into_iter()
            .filter(|f| bounds.data_fault_kind.is_none_or(|k| k == *f));
        for fault in kinds {
            if altered(&self.spec, env.to, &env.msg, fault).is_some() {
                out.push(Action::Alter(e.clone(), fault));
            } else if fault == DataFault::StaleDuplicate {
                // A second landing, later: the write lands now and a
                // copy of it stays in the network.
                out.push(Action::KeepStale(e.clone()));
            }
        }
    }

    /// The timers that may fire: a compute tick always, a timeout when it is not
    /// premature or the budget allows one, or when its node woke overdue; none of a
    /// frozen node.
    fn timer_actions(&self, s: &State, out: &mut Vec<Action>) {
        let used = s.faults();
        let frozen = used.frozen_node();
        let timeouts_left = used.early_timeouts < self.spec.faults.early_timeouts
            || !s.timeout_is_early(self.spec.engine.transport);
        for (node, timer) in s.timers.iter() {
            if Some(node) == frozen {
                continue;
            }
            if timer == Timer::Compute || timeouts_left || used.is_overdue(node) {
                out.push(Action::Fire(node, timer));
            }
        }
    }

    /// A pause races whatever else can happen (a node frozen at the end freezes
    /// nothing); the frozen node may always wake.
    fn pause_actions(used: &FaultsUsed, pauses: u8, out: &mut Vec<Action>) {
        match used.frozen_node() {
            Some(node) => out.push(Action::Wake(node)),
            None if used.pauses < pauses && !out.is_empty() => {
                out.push(Action::Pause(PREFILL));
                out.push(Action::Pause(DECODE));
            }
            None => {}
        }
    }

    /// Is no action enabled? (The definition of quiescence the liveness property uses.)
    /// A spent timer that may still be delivered again does not count: the run may end
    /// without it, so that ending is judged too (and the refire's successor as well).
    pub fn is_quiescent(&self, s: &State) -> bool {
        if !s.net.is_empty() || !s.timers.is_empty() || !s.stale.is_empty() {
            return false;
        }
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.iter().all(|a| matches!(a, Action::Refire(..)))
    }

    /// At quiescence, what the oracle's end-of-run check (L1-L4) finds, if anything: a
    /// request without an answer, a room still open, a request still held, a page not
    /// returned. A decode node that stopped loudly (a drain ack never came) may keep
    /// its quarantine: the oracle knows the stop from its fault event.
    pub fn quiescence_problem(&self, s: &State) -> Option<String> {
        let mut drafts = Vec::new();
        s.oracle
            .get()
            .at_end(EndOutcome::Drained, "drained", &mut drafts);
        drafts
            .first()
            .map(|d| format!("{}: {}", d.invariant, d.detail))
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
    /// The oracle's model, taken out of the state for this transition (copied once).
    oracle: Option<OracleState>,
    drafts: Vec<Draft>,
    /// A node that asked to be restarted (a fault with [`FaultAction::Restart`]).
    restart: Option<NodeId>,
    /// The write whose stale duplicate is being delivered: its receiver's completion
    /// of it is dropped ([`world::duplicate_completion`]).
    replaying: Option<WriteId>,
    /// The oracle's facts of that write, put back in flight as it lands.
    replay: Option<WriteFacts>,
}

impl Tx<'_> {
    fn finish(mut self) -> State {
        if let Some(o) = self.oracle.take() {
            // Events that changed nothing leave the old model (and its digest) in place.
            if !o.same_parts(self.s.oracle.get()) {
                self.s.oracle = Shared::new(o);
            }
        }
        self.s
    }

    fn event_text(&mut self, text: impl FnOnce() -> String) {
        if let Some(log) = self.log.as_deref_mut() {
            log.events.push(text());
        }
    }

    /// The oracle's model, copied out of the state on first use in this transition.
    fn oracle(&mut self) -> &mut OracleState {
        let s = &self.s;
        self.oracle.get_or_insert_with(|| s.oracle.get().clone())
    }

    /// Turn the oracle's drafts into violation bits (and sentences, when logging).
    fn judged(&mut self) {
        for d in std::mem::take(&mut self.drafts) {
            if d.detected_by.is_some() && self.m.spec.detections_hold {
                self.s.detect(d.invariant);
            } else {
                self.s.violate(d.invariant);
            }
            if let Some(log) = self.log.as_deref_mut() {
                let detail = match d.detected_by {
                    Some(def) => format!("DETECTED by {def}: {}", d.detail),
                    None => d.detail,
                };
                log.violations.push(Violation::new(d.invariant, detail));
            }
        }
    }

    /// A world record for the oracle.
    fn record(&mut self, rec: &Record) {
        let m = self.m;
        let mut drafts = std::mem::take(&mut self.drafts);
        self.oracle().observe(&m.header, rec, &mut drafts);
        self.drafts = drafts;
        self.judged();
    }

    fn quarantined(&self, room: kvsim_engine::ids::RoomKey) -> bool {
        self.s
            .decode
            .get()
            .pool()
            .records()
            .any(|(_, r)| r.owner == Some(room) && r.state == PageState::Quarantined)
    }

    fn epoch(&self, node: NodeId) -> u32 {
        match node {
            PREFILL => self.s.prefill.get().pool().epoch(),
            DECODE => self.s.decode.get().pool().epoch(),
            _ => 0,
        }
    }

    /// Client `slot` submits: it is given the next request id, the oracle sees the
    /// submit, the router gets the request.
    #[inline]
    fn submit(&mut self, slot: usize) {
        let req = RequestId(self.s.clients().iter().filter(|c| c.req.is_some()).count() as u64);
        let client = self.s.clients()[slot];
        self.s.book(|b| b.clients[slot].req = Some(req));
        let spec = self.m.client_spec(&client);
        self.record(&Record::Submit {
            req,
            tenant: TenantId(spec.tenant),
            prompt_len: spec.prompt_len,
            max_new_tokens: spec.max_new_tokens,
        });
        let msg = Msg::Submit {
            req,
            tenant: TenantId(spec.tenant),
            prompt: self.m.prompt(&client, req),
            max_new_tokens: spec.max_new_tokens,
        };
        self.dispatch(ROUTER, Cause::Input(Input::Message { from: CLIENT, msg }));
    }

    /// Client `slot` disconnects: the router hears a cancel if it has a request.
    #[inline]
    fn cancel(&mut self, slot: usize) {
        self.s.book(|b| b.clients[slot].cancelled = true);
        if let Some(req) = self.s.clients()[slot].req {
            self.dispatch(
                ROUTER,
                Cause::Input(Input::Message {
                    from: CLIENT,
                    msg: Msg::Cancel { req },
                }),
            );
        }
    }

    /// A KV write lands and the network keeps a copy of it, to land again later.
    #[inline]
    fn keep_stale(&mut self, e: &Shared<Envelope>) {
        self.s.book(|b| b.faults.data_faults += 1);
        if !self.s.take(e) {
            return;
        }
        // The oracle's facts of the write as it is in flight now, before
        // it lands (the simulator's oracle keeps them at the landing).
        let facts = e
            .get()
            .msg
            .write_id()
            .and_then(|id| self.s.oracle.get().write_in_flight(id).cloned());
        self.event_text(|| "the network keeps a copy of the KV write, to land again later".into());
        self.deliver(e, false, None);
        self.s.keep_stale(StaleCopy {
            env: e.get().clone(),
            facts,
        });
    }

    /// A set timer fires (counted as an early timeout when work is still under way,
    /// unless the node woke from a pause with its timers overdue).
    #[inline]
    fn fire_timer(&mut self, node: NodeId, timer: Timer) {
        let transport = self.m.spec.engine.transport;
        if timer != Timer::Compute && self.s.faults().frozen_node().is_some() {
            self.s.book(|b| b.faults.frozen_timeouts = 1);
        }
        if timer != Timer::Compute
            && !self.s.faults().is_overdue(node)
            && self.s.timeout_is_early(transport)
        {
            self.s.book(|b| b.faults.early_timeouts += 1);
        }
        if self.s.timers.take(node, timer).is_some() {
            self.spent(node, timer);
            self.fire(node, timer);
        }
    }

    /// A spent timer is delivered again.
    #[inline]
    fn refire(&mut self, node: NodeId, timer: Timer) {
        self.s.book(|b| b.faults.timer_refires += 1);
        if !self.refires_left() {
            // No further refire can happen: forget them all (merges states).
            self.s.forget_spent(|_, _| false);
        }
        self.event_text(|| {
            format!(
                "{node}'s spent timer {} is delivered again",
                crate::model_state::timer_text(timer)
            )
        });
        self.fire(node, timer);
    }

    /// `node` freezes: [`HandoffModel::actions`] holds its timers and the arrivals
    /// that need its process until [`Tx::wake`].
    fn pause(&mut self, node: NodeId) {
        self.s.book(|b| {
            b.faults.pauses += 1;
            b.faults.frozen = node.0 as u8 + 1;
        });
        self.event_text(|| format!("{node} freezes (a stall): its timers and inputs wait"));
    }

    /// The frozen node runs again, its timers overdue until it handles a message.
    fn wake(&mut self, node: NodeId) {
        self.s.book(|b| {
            b.faults.frozen = 0;
            b.faults.overdue = node.0 as u8 + 1;
        });
        self.event_text(|| format!("{node} wakes: its timers are overdue"));
    }

    /// The prefill or decode node crashes and restarts at once into its next
    /// incarnation: the world's rules ([`world::crash_fate`]) decide each message in
    /// flight, its timers die ([`Timers::crash`]). `budget`: an environment fault (it
    /// counts against the crash bound), not a restart the node asked for.
    fn crash(&mut self, node: NodeId, budget: bool) {
        let busy = match node {
            PREFILL => self.s.prefill.get().requests() > 0,
            DECODE => {
                let d = self.s.decode.get();
                d.requests() > 0 || d.quarantined_rooms() > 0
            }
            _ => return,
        };
        if budget {
            self.s.book(|b| {
                b.faults.crashes += 1;
                if busy {
                    b.faults.busy_crashes += 1;
                }
            });
        }
        let f = self.s.faults();
        if f.frozen_node() == Some(node) || f.is_overdue(node) {
            // A frozen process can be killed; its successor is neither frozen nor late.
            self.s.book(|b| {
                if b.faults.frozen_node() == Some(node) {
                    b.faults.frozen = 0;
                }
                if b.faults.is_overdue(node) {
                    b.faults.overdue = 0;
                }
            });
        }
        let dead = self.epoch(node);
        match node {
            PREFILL => self.s.prefill.update(|n| world::restart(n, dead + 1)),
            _ => self.s.decode.update(|n| world::restart(n, dead + 1)),
        }
        self.event_text(|| format!("{node} crashes and restarts into a new incarnation"));
        self.forget_incarnation(node);
        let (flushed, failed) = self.crash_walk(node, dead);
        self.record(&Record::Fault(FaultEvent::Crash {
            node,
            epoch: dead,
            flushed,
        }));
        self.fail_back(failed);
        self.record(&Record::Fault(FaultEvent::Restart {
            node,
            epoch: dead + 1,
        }));
        if node == DECODE {
            // The new incarnation has no quarantine and no retry count.
            let rooms: Vec<_> = self.s.book.get().notes.iter().map(|(k, _)| *k).collect();
            for room in rooms {
                self.s.unnote(room, note::DRAIN_RETRIED);
            }
        }
    }

    /// What dies with `node`'s incarnation besides its messages: its timers (with its
    /// timer wheel), its spent timers, and the kept copies of writes to or from it.
    #[inline]
    fn forget_incarnation(&mut self, node: NodeId) {
        self.s.timers.crash(node);
        // The dead incarnation's timers are gone with its timer wheel.
        self.s.forget_spent(|n, _| n != node);
        // A kept copy of a write to or from the dead incarnation is gone with its
        // connections (the simulator's write history forgets them; one already on its
        // way is dropped as it arrives).
        if self
            .s
            .stale
            .iter()
            .any(|c| c.get().env.from == node || c.get().env.to == node)
        {
            self.s
                .stale
                .retain(|c| c.get().env.from != node && c.get().env.to != node);
        }
    }

    /// The world's crash walk ([`CrashWalk`], with [`world::crash_fate`]) over the
    /// messages in flight at the crash of `node`'s incarnation `dead`: the ones kept stay
    /// in the network (a message to the dead incarnation reaches the next one at once:
    /// the model has no time); returns the dead incarnation's flushed writes and the
    /// writes to it that fail back, with their completions.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn crash_walk(
        &mut self,
        node: NodeId,
        dead: u32,
    ) -> (Vec<WriteId>, Vec<(NodeId, NodeId, Msg<SymbolicPage>)>) {
        let net = std::mem::take(&mut self.s.net);
        let walk = CrashWalk::new(node, dead).walk(net, |e| {
            let env = e.get();
            Some(Flying {
                from: env.from,
                to: env.to,
                msg: &env.msg,
                epochs: None,
                duplicate: false,
            })
        });
        self.s.net = walk.kept.into_iter().map(|(e, _)| e).collect();
        let failed = walk.failed.into_iter();
        let failed = failed.map(|(e, done)| (e.get().from, e.get().to, done));
        (walk.flushed, failed.collect())
    }

    /// Writes to a dead incarnation fail: the oracle hears each, and its failed
    /// completion travels back to its writer.
    #[inline]
    fn fail_back(&mut self, failed: Vec<(NodeId, NodeId, Msg<SymbolicPage>)>) {
        for (from, to, done) in failed {
            if let Some(write) = done.write_id() {
                self.record(&Record::WriteFailed {
                    from,
                    to,
                    write,
                    reason: WriteFailure::ReceiverGone,
                });
            }
            self.s.send(Envelope {
                from: to,
                to: from,
                msg: done,
            });
        }
    }

    /// A timer input reaches its node (fired, or delivered again).
    fn fire(&mut self, node: NodeId, timer: Timer) {
        if let (DECODE, Timer::DrainRetry(room, arming)) = (node, timer) {
            // Only the arming decode set last is a retry (a stale copy is ignored).
            let counted = matches!(
                self.s.decode.get().room_phase(room),
                Some(DecodePhase::Quarantined { retries }) if retries == arming
            );
            if counted && self.quarantined(room) {
                self.s.note(room, note::DRAIN_RETRIED);
            }
        }
        self.dispatch(node, Cause::Input(Input::Timer(timer)));
    }

    /// May a timer still be delivered again in this run?
    fn refires_left(&self) -> bool {
        self.s.faults().timer_refires < self.m.spec.faults.timer_refires
    }

    /// A timer fired or was cancelled: remember it while a refire may still happen.
    fn spent(&mut self, node: NodeId, timer: Timer) {
        if self.refires_left() {
            self.s.spend(node, timer);
        }
    }

    /// A message arrives; the world's rules ([`world::arrival`]) decide what follows.
    /// `fail`: the environment fails this KV write on the wire; `fault`: a KV write
    /// that is delivered lands altered by this data fault ([`crate::model_state::altered`]).
    fn deliver(&mut self, shared: &Shared<Envelope>, fail: bool, fault: Option<DataFault>) {
        let env = shared.get();
        let transport = self.m.spec.engine.transport;
        if self.s.faults().is_overdue(env.to) && transport.arrival_waits_for_receiver(&env.msg) {
            // The woken node's loop ran: what was overdue has had its chance.
            self.s.book(|b| b.faults.overdue = 0);
        }
        let at = self.m.arriving(&self.s, env.to, fail);
        match world::arrival(&env.msg, &at) {
            Arrival::Deliver => {
                let altered = fault.and_then(|f| altered(&self.m.spec, env.to, &env.msg, f));
                match (altered, env.msg.write_id()) {
                    (Some((msg, a)), Some(write)) => {
                        self.event_text(|| {
                            format!(
                                "the KV write {write} lands {}: its page meant for {} lands at {}",
                                a.fault.name(),
                                a.meant,
                                a.landed
                            )
                        });
                        self.record(&Record::Fault(FaultEvent::data_fault(
                            env.from, env.to, write, &a,
                        )));
                        let changed = Shared::new(Envelope {
                            from: env.from,
                            to: env.to,
                            msg,
                        });
                        self.dispatch(env.to, Cause::Delivered(changed))
                    }
                    _ => self.dispatch(env.to, Cause::Delivered(shared.clone())),
                }
            }
            Arrival::Drop(_) => {}
            Arrival::Fail { reason, completion } => {
                if let Some(write) = env.msg.write_id() {
                    self.event_text(|| {
                        format!("the KV write {write} fails on the wire ({reason:?})")
                    });
                    self.record(&Record::WriteFailed {
                        from: env.from,
                        to: env.to,
                        write,
                        reason,
                    });
                }
                // The writer's NIC reports the failure.
                self.s.send(Envelope {
                    from: env.to,
                    to: env.from,
                    msg: completion,
                });
            }
        }
    }

    /// A kept copy of a KV write lands again as a stale duplicate. The world's rule for
    /// an arriving write applies (one that would fail is simply gone: its writer knows
    /// nothing of it); one that lands is announced with the simulator's `data_fault`
    /// record and handed to its node, whose completion of it is dropped.
    fn land_stale(&mut self, copy: &StaleCopy) {
        let env = &copy.env;
        let at = self.m.arriving(&self.s, env.to, false);
        if !matches!(world::arrival(&env.msg, &at), Arrival::Deliver) {
            return;
        }
        let Some(write) = env.msg.write_id() else {
            return;
        };
        let pool = match env.to {
            PREFILL => self.s.prefill.get().pool(),
            _ => self.s.decode.get().pool(),
        };
        let Some(a) = stale_landing(pool, &env.msg) else {
            return;
        };
        self.event_text(|| {
            format!(
                "a stale duplicate of the KV write {write} lands: its page {} lands over {}",
                a.landed, a.meant
            )
        });
        self.record(&Record::Fault(FaultEvent::data_fault(
            env.from, env.to, write, &a,
        )));
        self.replaying = Some(write);
        self.replay = copy.facts.clone();
        self.dispatch(env.to, Cause::Delivered(Shared::new(env.clone())));
        self.replaying = None;
        self.replay = None;
    }

    /// Feed one input to one node and carry out its effects, in order.
    fn dispatch(&mut self, node: NodeId, cause: Cause) {
        match node {
            ROUTER => {
                let e = self.m.transition(node, &self.s.router, cause);
                self.s.router = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            PREFILL => {
                let e = self.m.transition(node, &self.s.prefill, cause);
                self.s.prefill = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            DECODE => {
                let e = self.m.transition(node, &self.s.decode, cause);
                self.s.decode = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            _ => {}
        }
        if let Some(n) = self.restart.take() {
            self.crash(n, false);
        }
    }

    /// The router answered a client (delivered at once: client traffic is reliable).
    fn respond(&mut self, msg: &Msg<SymbolicPage>) {
        let &Msg::Response {
            req,
            status,
            ref tokens,
            ..
        } = msg
        else {
            return;
        };
        let Some(i) = self.s.clients().iter().position(|c| c.req == Some(req)) else {
            return;
        };
        self.event_text(|| {
            format!(
                "client {i} gets {status} for {req} ({} tokens)",
                tokens.len()
            )
        });
        if self.s.clients()[i].reply.is_none() {
            self.s.book(|b| b.clients[i].reply = Some(status));
            if !self.m.error_explained(&self.s, i, status) {
                self.event_text(|| {
                    format!(
                        "nothing explains the {status}: no fault, no cancel, and the request fits"
                    )
                });
                self.s.book(|b| b.uncaused = true);
            }
        }
    }
}

/// The model carries out a node's (cached) effects: a send goes in flight, or to the
/// client at once; a timer is set or cancelled; an event goes to the oracle.
impl<'r> Driver<&'r Routed, &'r TraceEvent> for Tx<'_> {
    fn send(&mut self, from: NodeId, _to: NodeId, msg: &'r Routed) {
        match msg {
            Routed::Client(msg) => self.respond(msg),
            Routed::Peer(e) => {
                if let Some(dup) = self.replaying {
                    if world::duplicate_completion(dup, &e.get().msg) {
                        self.event_text(|| {
                            format!("{from}'s completion of the stale duplicate is dropped")
                        });
                        return;
                    }
                }
                if let Some(log) = self.log.as_deref_mut() {
                    log.events.push(format!(
                        "{from} sends {} to {}",
                        e.get().msg.summary(),
                        e.get().to
                    ));
                }
                self.s.send_shared(e.clone());
            }
        }
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        if let TimerOp::Cancel { timer } = op {
            if self.s.timers.get(node, timer).is_some() {
                self.spent(node, timer);
            }
        }
        self.s.timers.apply(node, op, ());
    }

    fn event(&mut self, _node: NodeId, ev: &'r TraceEvent) {
        self.event_text(|| describe_event(ev));
        if let TraceEvent::Fault { node, fault } = ev {
            if fault.action() == FaultAction::Restart {
                self.restart = Some(*node);
            }
        }
        if let TraceEvent::QuarantineReleased { room, .. } = ev {
            self.s.unnote(*room, note::DRAIN_RETRIED);
        }
        if self.replay.is_some() {
            let mut replay = self.replay.take();
            self.oracle().duplicate_lands(&mut replay, ev);
            self.replay = replay;
        }
        let m = self.m;
        let mut drafts = std::mem::take(&mut self.drafts);
        self.oracle().observe_event(&m.header, ev, &mut drafts);
        self.drafts = drafts;
        self.judged();
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
    holds_s6 => S6, holds_s7 => S7, holds_s8 => S8, holds_s9 => S9, holds_s10 => S10,
    holds_l5 => L5,
);

/// Latch bits of the properties that are not one invariant each.
const BIT_QUIESCENCE: u32 = 20;
const BIT_COMPLETES: u32 = 21;
const BIT_REJECTED: u32 = 22;
const BIT_ABORT_RACE: u32 = 23;
const BIT_LATE_ACK: u32 = 24;
const BIT_CRASH: u32 = 25;
const BIT_STOPPED: u32 = 26;
const BIT_ALTERED: u32 = 27;
const BIT_REFIRED: u32 = 28;
const BIT_UNCAUSED: u32 = 29;
const BIT_RETRIED_LIVE: u32 = 30;
const BIT_FROZEN_TIMEOUT: u32 = 31;

fn quiescence_holds(m: &HandoffModel, s: &State) -> bool {
    latched(m, BIT_QUIESCENCE)
        || !(m.is_quiescent(s)
            && m.quiescence_problem(s).is_some()
            && latch_first(m, BIT_QUIESCENCE))
}

/// "An error answer has a cause": a client that got a non-OK answer either
/// cancelled, or sent a request that must be refused (malformed, or over-length /
/// larger than a pool: [`HandoffModel::must_refuse`]), or the run has used at least
/// one fault (any count in the fault book). A request the environment did nothing to
/// is answered 200. Safety invariants cannot say this (an abort is always safe);
/// liveness only asks for *an* answer.
///
/// A model property, not an oracle finding: its premise is the fault book, the
/// environment's own record of what it did. A trace records crashes, partitions and
/// data faults, but not a lost, duplicated or overtaking message, nor a timer that
/// fired early, so the oracle cannot tell an unexplained error from one a lost
/// message explains.
fn error_has_cause(m: &HandoffModel, s: &State) -> bool {
    latched(m, BIT_UNCAUSED) || !(s.book.get().uncaused && latch_first(m, BIT_UNCAUSED))
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
            Msg::KvWrite { id, dst, .. } if e.get().to == DECODE => dst.iter().any(|t| {
                !pool.record(t.page).is_some_and(|r| {
                    r.gen == t.gen && r.owner == Some(id.room) && r.state.is_owned()
                })
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

/// A timeout fired at one node while another was frozen.
fn timeout_while_frozen(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_FROZEN_TIMEOUT)
        && s.faults().frozen_timeouts > 0
        && latch_first(m, BIT_FROZEN_TIMEOUT)
}

/// A prefill or decode node crashed while it held a request (or a quarantine).
fn busy_crash(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_CRASH) && s.faults().busy_crashes > 0 && latch_first(m, BIT_CRASH)
}

/// A defense stopped a hazard (a `DETECTED` finding, in a model where that holds).
fn defense_stops(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_STOPPED) && s.book.get().detected != 0 && latch_first(m, BIT_STOPPED)
}

/// A KV write landed altered by a data fault.
fn write_altered(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_ALTERED) && s.faults().data_faults > 0 && latch_first(m, BIT_ALTERED)
}

/// The router started another attempt of a request while an attempt it gave up still
/// has a half working (`sglang-router`).
fn retried_while_live(m: &HandoffModel, s: &State) -> bool {
    let r = s.router.get();
    !latched(m, BIT_RETRIED_LIVE)
        && r.abandoned_rooms() > 0
        && r.live_rooms() > r.abandoned_rooms()
        && latch_first(m, BIT_RETRIED_LIVE)
}

/// A spent timer was delivered again.
fn timer_refired(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_REFIRED) && s.faults().timer_refires > 0 && latch_first(m, BIT_REFIRED)
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
    pub const S10: &str = "S10 reply correctness";
    pub const L5: &str = "L5 nothing larger than the pool admitted";
    pub const QUIESCENCE: &str =
        "L1-L4 no action enabled => every request answered, every pool full";
    pub const COMPLETES: &str = "a request completes";
    pub const ABORT_RACE: &str = "an abort races an in-flight KV write";
    pub const REJECTED: &str = "an over-length request is rejected";
    pub const LATE_ACK: &str = "a drain ack arrives after a timeout";
    pub const CRASH: &str = "a node crashes while it holds a request";
    pub const STOPPED: &str = "a defense stops a hazard";
    pub const ALTERED: &str = "a KV write lands altered by a data fault";
    pub const REFIRED: &str = "a spent timer is delivered again";
    pub const CAUSED: &str = "an error answer has a cause";
    pub const RETRIED_LIVE: &str = "a request is retried while a given-up attempt's half is live";
    pub const FROZEN_TIMEOUT: &str = "a timeout fires while a node is frozen";
}

impl Model for HandoffModel {
    type State = State;
    type Action = Action;

    fn prefetch(&self, state: &State, near: bool) {
        state.prefetch(near);
    }

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
        let transport = self.spec.engine.transport;
        let frozen = used.frozen_node();
        for (i, e) in s.net.iter().enumerate() {
            if e.get().held_by(frozen, transport) {
                // Waits in the frozen node's queues; the network may still lose it.
                if !e.get().is_rdma() && s.is_head(i) && used.losses < bounds.losses {
                    out.push(Action::Lose(e.clone()));
                }
                continue;
            }
            if !s.is_head(i) {
                // Values are unique within a channel, so each overtake is one branch.
                if used.overtakes < bounds.overtakes {
                    out.push(Action::Overtake(e.clone()));
                }
                continue;
            }
            out.push(Action::Deliver(e.clone()));
            if e.get().is_rdma() {
                self.write_actions(s, e, out);
            } else {
                if used.losses < bounds.losses {
                    out.push(Action::Lose(e.clone()));
                }
                if used.duplicates < bounds.duplicates {
                    out.push(Action::Duplicate(e.clone()));
                }
            }
        }
        // A kept copy lands again at any point, in no order.
        for c in &s.stale {
            if !c.get().env.held_by(frozen, transport) {
                out.push(Action::LandStale(c.clone()));
            }
        }
        self.timer_actions(s, out);
        // A crash races whatever else can happen; once nothing else can, the run is
        // over (and the quiescence property judges it), so a crash is not enabled.
        if used.crashes < bounds.crashes && !out.is_empty() {
            out.push(Action::Crash(PREFILL));
            out.push(Action::Crash(DECODE));
        }
        Self::pause_actions(used, bounds.pauses, out);
        // A spent timer may be delivered again at any point, even after everything
        // else is done (a stale entry of a timer wheel); see `is_quiescent`.
        if used.timer_refires < bounds.timer_refires {
            for &(node, timer) in &s.book.get().spent {
                if Some(node) != frozen {
                    out.push(Action::Refire(node, timer));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        Some(self.step(s, &action, None))
    }

    fn format_action(&self, action: &Action) -> String {
        action.to_string()
    }

    fn name(&self) -> String {
        self.spec.name.clone()
    }

    fn format_state(&self, s: &State) -> String {
        crate::view::state_text(&self.spec.name, s)
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
            Property::always(names::S10, holds_s10),
            Property::always(names::L5, holds_l5),
            Property::always(names::QUIESCENCE, quiescence_holds),
            Property::always(names::CAUSED, error_has_cause),
        ];
        let sometimes: [(&'static str, Condition); 10] = [
            (names::FROZEN_TIMEOUT, timeout_while_frozen),
            (names::RETRIED_LIVE, retried_while_live),
            (names::STOPPED, defense_stops),
            (names::ALTERED, write_altered),
            (names::REFIRED, timer_refired),
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
