//! `HandoffModel` as a `stateright::Model`: which actions a state enables (clients,
//! the network and its faults, timers, crashes and pauses), and how the checker and
//! the Explorer see states and steps.
//!
//! Carrying an action out is [`crate::model::tx`]'s; the properties are
//! [`crate::model::properties`]'s.

use crate::model::handoff::HandoffModel;
use crate::model::properties;
use crate::model_state::{altered, Action, Collision, Envelope, FaultsUsed, State};
use kvsim_engine::ids::RequestId;
use kvsim_engine::msg::Carried;
use kvsim_engine::world::{self, Arrival, DataFault};
use kvsim_engine::Timer;
use kvsim_oracle::shared::Shared;
use stateright::{Model, Property};

impl HandoffModel {
    /// The faults the environment may do to the RDMA message `e` at the head of its
    /// channel: fail a KV write, or land it altered by a data fault (one with
    /// something to act on) or keep a copy of it to land again.
    #[inline]
    fn write_actions(&self, s: &State, e: &Shared<Envelope>, out: &mut Vec<Action>) {
        let bounds = &self.spec.faults;
        let used = &s.faults();
        let is_rdma = e.get().msg.is_rdma();
        let is_write = matches!(e.get().msg, Carried::Write(_));
        if is_rdma && used.write_failures < bounds.write_failures {
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

    /// Another party's start pair for each room use the router waits on: a request
    /// of its own, numbered after the collisions so far, with a prompt one token
    /// shorter than the live request's.
    fn collide_actions(&self, s: &State, out: &mut Vec<Action>) {
        let n = u64::from(s.faults().colliding_rooms);
        let router = s.router.get();
        for room in router.waiting_rooms() {
            let Some(live) = router.room_state(room) else {
                continue;
            };
            let Some(c) = s.clients().iter().find(|c| c.req == Some(live.req)) else {
                continue;
            };
            let spec = self.client_spec(c);
            out.push(Action::Collide(Collision {
                room,
                req: RequestId(world::COLLIDING_REQ + n + 1),
                prompt_len: spec.prompt_len.saturating_sub(1).max(1),
                max_new_tokens: spec.max_new_tokens,
            }));
        }
    }

    /// A pause of any prefill or decode node races whatever else can happen (a node
    /// frozen at the end freezes nothing); the frozen node may always wake.
    fn pause_actions(s: &State, used: &FaultsUsed, pauses: u8, out: &mut Vec<Action>) {
        match used.frozen_node() {
            Some(node) => out.push(Action::Wake(node)),
            None if used.pauses < pauses && !out.is_empty() => {
                out.extend(s.kv_ids().map(Action::Pause));
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
        if used.colliding_rooms < bounds.colliding_rooms {
            self.collide_actions(s, out);
        }
        // A crash races whatever else can happen; once nothing else can, the run is
        // over (and the quiescence property judges it), so a crash is not enabled.
        if used.crashes < bounds.crashes && !out.is_empty() {
            out.extend(s.kv_ids().map(Action::Crash));
        }
        Self::pause_actions(s, used, bounds.pauses, out);
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
        properties::all(self)
    }
}
