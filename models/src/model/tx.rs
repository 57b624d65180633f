//! One transition: an action carried out through the engine's nodes, their effects
//! applied with the world's rules, and every record shown to the oracle.
//!
//! Message arrivals are in [`crate::model::delivery`] and a node's crash in
//! [`crate::model::crash`]; which actions are enabled is decided elsewhere
//! ([`crate::model::actions`]).

use crate::memo::{Cause, Routed};
use crate::model::handoff::HandoffModel;
use crate::model_state::{note, Action, Collision, Envelope, KvNode, State, ROUTER};
use kvsim_engine::decode::DecodePhase;
use kvsim_engine::env::{Effect as Step, Input, TimerOp};
use kvsim_engine::ids::{NodeId, RequestId, TenantId, Token, WriteId};
use kvsim_engine::invariant::Violation;
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::{Carried, Msg};
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::{self, Driver};
use kvsim_engine::Timer;
use kvsim_oracle::oracle_state::{Draft, WriteFacts};
use kvsim_oracle::render::describe_event;
use kvsim_oracle::schema::Record;
use kvsim_oracle::shared::Shared;
use kvsim_oracle::OracleState;

/// What one transition did, for counterexamples and the Explorer: the engine events
/// it emitted as sentences, and each finding with a sentence saying how.
#[derive(Clone, Debug, Default)]
pub struct StepLog {
    pub events: Vec<String>,
    pub violations: Vec<Violation>,
}

impl HandoffModel {
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
            Action::Collide(c) => tx.collide(c),
        }
        tx.finish()
    }

    /// The rendered log of one action from `s`.
    pub fn explain(&self, s: &State, action: &Action) -> (State, StepLog) {
        let mut log = StepLog::default();
        let next = self.step(s, action, Some(&mut log));
        (next, log)
    }
}

/// One transition under construction.
pub(super) struct Tx<'a> {
    pub(super) m: &'a HandoffModel,
    pub(super) s: State,
    log: Option<&'a mut StepLog>,
    /// The oracle's model, taken out of the state for this transition (copied once).
    oracle: Option<OracleState>,
    drafts: Vec<Draft>,
    /// A node that asked to be restarted (a fault with [`FaultAction::Restart`]).
    restart: Option<NodeId>,
    /// The write whose stale duplicate is being delivered: its receiver's completion
    /// of it is dropped ([`world::duplicate_completion`]).
    pub(super) replaying: Option<WriteId>,
    /// The oracle's facts of that write, put back in flight as it lands.
    pub(super) replay: Option<WriteFacts>,
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

    pub(super) fn event_text(&mut self, text: impl FnOnce() -> String) {
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
    pub(super) fn record(&mut self, rec: &Record) {
        let m = self.m;
        let mut drafts = std::mem::take(&mut self.drafts);
        self.oracle().observe(&m.header, rec, &mut drafts);
        self.drafts = drafts;
        self.judged();
    }

    /// Does the decode node `node` hold pages of `room` in quarantine?
    fn quarantined(&self, node: NodeId, room: kvsim_engine::ids::RoomKey) -> bool {
        self.s.pool(node).is_some_and(|pool| {
            pool.records()
                .any(|(_, r)| r.owner == Some(room) && r.state == PageState::Quarantined)
        })
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
        let from = self.s.client_id();
        self.dispatch(ROUTER, Cause::Input(Input::Message { from, msg }));
    }

    /// Another party's start pair for a live room use goes in flight from the
    /// router's address (`world::colliding_starts`).
    fn collide(&mut self, c: &Collision) {
        let Some(live) = self.s.router.get().room_state(c.room) else {
            return;
        };
        self.s.book(|b| b.faults.colliding_rooms += 1);
        let prompt = world::colliding_prompt(c.prompt_len);
        let halves = (live.prefill, live.decode);
        for (to, msg) in world::colliding_starts(c.room, halves, c.req, prompt, c.max_new_tokens) {
            self.event_text(|| format!("{} sends a start for {} to {to}", c.req, c.room));
            self.s.send(Envelope {
                from: ROUTER,
                to,
                msg: Carried::Msg(msg),
            });
        }
    }

    /// Client `slot` disconnects: the router hears a cancel if it has a request.
    #[inline]
    fn cancel(&mut self, slot: usize) {
        self.s.book(|b| b.clients[slot].cancelled = true);
        if let Some(req) = self.s.clients()[slot].req {
            let from = self.s.client_id();
            let msg = Msg::Cancel { req };
            self.dispatch(ROUTER, Cause::Input(Input::Message { from, msg }));
        }
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

    /// A timer input reaches its node (fired, or delivered again).
    fn fire(&mut self, node: NodeId, timer: Timer) {
        if let (Some(decode), Timer::DrainRetry(room, arming)) = (self.s.decode(node), timer) {
            // Only the arming decode set last is a retry (a stale copy is ignored).
            let counted = matches!(
                decode.room_phase(room),
                Some(DecodePhase::Quarantined { retries }) if retries == arming
            );
            if counted && self.quarantined(node, room) {
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

    /// Feed one input to one node and carry out its effects, in order.
    pub(super) fn dispatch(&mut self, node: NodeId, cause: Cause) {
        match (node, self.s.kv_node(node)) {
            (ROUTER, _) => {
                let e = self.m.transition(node, &self.s.router, cause);
                self.s.router = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            (_, Some(KvNode::Prefill(i))) => {
                let e = self.m.transition(node, &self.s.prefills[i], cause);
                self.s.prefills[i] = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            (_, Some(KvNode::Decode(i))) => {
                let e = self.m.transition(node, &self.s.decodes[i], cause);
                self.s.decodes[i] = e.after.clone();
                world::apply(node, e.effects.iter().map(Step::as_ref), self);
            }
            _ => {}
        }
        if let Some(n) = self.restart.take() {
            self.crash(n, false);
        }
    }

    /// The router answered a client (delivered at once: client traffic is reliable).
    fn respond(&mut self, msg: &Msg) {
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
                if let (Some(dup), Some(msg)) = (self.replaying, e.get().msg.msg()) {
                    if world::duplicate_completion(dup, msg) {
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

    /// A posted KV write goes in flight as a send does (pre-routed the same way).
    fn write(&mut self, from: NodeId, to: NodeId, write: &'r Routed) {
        self.send(from, to, write);
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        if let TimerOp::Set { timer, after_ns } = op {
            if self.m.spec.faults.horizon_ns.is_some_and(|h| after_ns > h) {
                // Due after the run is over: it never fires (one set before is
                // replaced by this one, so it is gone too).
                self.event_text(|| format!("{node}'s {timer:?} is due after the run ends"));
                self.s.timers.apply(node, TimerOp::Cancel { timer }, ());
                return;
            }
        }
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

    /// The model's client reads only the terminal answer: the token is in the trace already (decode's `TokenOut`).
    fn stream(&mut self, _: NodeId, _: NodeId, _: RequestId, _: u32, _: Token) {}
}
