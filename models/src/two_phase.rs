//! stateright's own two-phase commit example, as the yardstick `kvsim check --vs-2pc`
//! measures the handoff model against (same checker, same search, same threads, one
//! invocation).
//!
//! Source: `examples/2pc.rs` of stateright 0.31.0 (github.com/stateright/stateright,
//! tag `ab8c8be`, "version 0.31.0"), Copyright (c) 2018 Jonathan Nadal and other
//! Stateright contributors, MIT License (the full text is `vendor/stateright/LICENSE`).
//! The model, its actions, its properties, its symmetry representative and its test
//! are upstream's, unchanged but for `pub` on what the benchmark calls and rustfmt;
//! upstream's `main` (check / explore subcommands with `pico_args`) is replaced by
//! [`check_2pc`], which runs the check and returns its counts and time. This is not a
//! model of kvsim: it is a benchmark of the checker on a model whose step is a few
//! dozen bytes of copying, so that a rate on this machine means something next to it.
//!
//! Upstream's own doc follows.
//!
//! This module implements a subset of the two phase commit specification presented in
//! the paper ["Consensus on Transaction Commit"](https://www.microsoft.com/en-us/research/wp-content/uploads/2016/02/tr-2003-96.pdf)
//! by Jim Gray and Leslie Lamport.

use stateright::{Checker, Model, Property, Representative, Rewrite, RewritePlan};
use std::collections::BTreeSet;
use std::hash::Hash;
use std::ops::Range;
use std::time::{Duration, Instant};

type R = usize; // represented by integers in 0..N-1

#[derive(Clone)]
pub struct TwoPhaseSys {
    pub rms: Range<R>,
}

#[derive(Clone, Debug, Eq, Hash, PartialEq)]
pub struct TwoPhaseState {
    rm_state: Vec<RmState>, // map from each RM
    tm_state: TmState,
    tm_prepared: Vec<bool>, // map from each RM
    msgs: BTreeSet<Message>,
}

#[derive(Clone, Debug, Eq, Hash, Ord, PartialEq, PartialOrd)]
enum Message {
    Prepared { rm: R },
    Commit,
    Abort,
}

#[derive(Clone, Debug, Eq, Hash, Ord, PartialEq, PartialOrd)]
enum RmState {
    Working,
    Prepared,
    Committed,
    Aborted,
}

#[derive(Clone, Debug, Eq, Hash, PartialEq)]
enum TmState {
    Init,
    Committed,
    Aborted,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    TmRcvPrepared(R),
    TmCommit,
    TmAbort,
    RmPrepare(R),
    RmChooseToAbort(R),
    RmRcvCommitMsg(R),
    RmRcvAbortMsg(R),
}

impl Model for TwoPhaseSys {
    type State = TwoPhaseState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        vec![TwoPhaseState {
            rm_state: self.rms.clone().map(|_| RmState::Working).collect(),
            tm_state: TmState::Init,
            tm_prepared: self.rms.clone().map(|_| false).collect(),
            msgs: Default::default(),
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        if state.tm_state == TmState::Init && state.tm_prepared.iter().all(|p| *p) {
            actions.push(Action::TmCommit);
        }
        if state.tm_state == TmState::Init {
            actions.push(Action::TmAbort);
        }
        for rm in self.rms.clone() {
            if state.tm_state == TmState::Init && state.msgs.contains(&Message::Prepared { rm }) {
                actions.push(Action::TmRcvPrepared(rm));
            }
            if state.rm_state.get(rm) == Some(&RmState::Working) {
                actions.push(Action::RmPrepare(rm));
            }
            if state.rm_state.get(rm) == Some(&RmState::Working) {
                actions.push(Action::RmChooseToAbort(rm));
            }
            if state.msgs.contains(&Message::Commit) {
                actions.push(Action::RmRcvCommitMsg(rm));
            }
            if state.msgs.contains(&Message::Abort) {
                actions.push(Action::RmRcvAbortMsg(rm));
            }
        }
    }

    fn next_state(&self, last_state: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last_state.clone();
        match action {
            Action::TmRcvPrepared(rm) => {
                state.tm_prepared[rm] = true;
            }
            Action::TmCommit => {
                state.tm_state = TmState::Committed;
                state.msgs.insert(Message::Commit);
            }
            Action::TmAbort => {
                state.tm_state = TmState::Aborted;
                state.msgs.insert(Message::Abort);
            }
            Action::RmPrepare(rm) => {
                state.rm_state[rm] = RmState::Prepared;
                state.msgs.insert(Message::Prepared { rm });
            }
            Action::RmChooseToAbort(rm) => {
                state.rm_state[rm] = RmState::Aborted;
            }
            Action::RmRcvCommitMsg(rm) => {
                state.rm_state[rm] = RmState::Committed;
            }
            Action::RmRcvAbortMsg(rm) => {
                state.rm_state[rm] = RmState::Aborted;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::sometimes("abort agreement", |_, state| {
                state.rm_state.iter().all(|s| s == &RmState::Aborted)
            }),
            Property::<Self>::sometimes("commit agreement", |_, state| {
                state.rm_state.iter().all(|s| s == &RmState::Committed)
            }),
            Property::<Self>::always("consistent", |_, state| {
                !state.rm_state.iter().any(|s1| {
                    state
                        .rm_state
                        .iter()
                        .any(|s2| s1 == &RmState::Aborted && s2 == &RmState::Committed)
                })
            }),
        ]
    }
}

// Implementing this trait enables symmetry reduction to speed up model checking (optional).
impl Representative for TwoPhaseState {
    fn representative(&self) -> Self {
        let plan = RewritePlan::from_values_to_sort(&self.rm_state);
        Self {
            rm_state: plan.reindex(&self.rm_state),
            tm_state: self.tm_state.clone(),
            tm_prepared: plan.reindex(&self.tm_prepared),
            msgs: self
                .msgs
                .iter()
                .map(|m| match m {
                    Message::Prepared { rm } => Message::Prepared {
                        rm: plan.rewrite(rm),
                    },
                    Message::Commit => Message::Commit,
                    Message::Abort => Message::Abort,
                })
                .collect(),
        }
    }
}

impl<T> Rewrite<T> for RmState {
    fn rewrite<S>(&self, _: &RewritePlan<T, S>) -> Self {
        self.clone()
    }
}

/// The resource managers of the benchmark the issue names (stateright's example with
/// 8 resource managers).
pub const BENCH_RMS: usize = 8;

/// What one check of the two-phase commit model counted.
#[derive(Clone, Copy, Debug)]
pub struct TwoPhaseRun {
    pub rms: usize,
    pub generated: usize,
    pub unique: usize,
    pub elapsed: Duration,
    /// The one `always` property ("consistent") held on every state.
    pub consistent: bool,
}

impl TwoPhaseRun {
    pub fn states_per_sec(&self) -> f64 {
        self.unique as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Exhaust the two-phase commit model with `rms` resource managers, depth-first or
/// breadth-first, on `threads` threads (upstream's `check` subcommand, without its
/// report printer): the same checker calls as [`crate::check::check`] makes.
pub fn check_2pc(rms: usize, threads: usize, dfs: bool) -> TwoPhaseRun {
    assert!(
        rms > 0 && threads > 0,
        "a check needs a resource manager and a thread"
    );
    let builder = TwoPhaseSys { rms: 0..rms }.checker().threads(threads);
    let start = Instant::now();
    let (generated, unique, consistent) = if dfs {
        let c = builder.spawn_dfs().join();
        let ok = !c.discoveries().contains_key("consistent");
        (c.state_count(), c.unique_state_count(), ok)
    } else {
        let c = builder.spawn_bfs().join();
        let ok = !c.discoveries().contains_key("consistent");
        (c.state_count(), c.unique_state_count(), ok)
    };
    TwoPhaseRun {
        rms,
        generated,
        unique,
        elapsed: start.elapsed(),
        consistent,
    }
}

#[cfg(test)]
#[test]
fn can_model_2pc() {
    // for very small state space (using BFS this time)
    let checker = TwoPhaseSys { rms: 0..3 }.checker().spawn_bfs().join();
    assert_eq!(checker.unique_state_count(), 288);
    checker.assert_properties();

    // for slightly larger state space (using DFS this time)
    let checker = TwoPhaseSys { rms: 0..5 }.checker().spawn_dfs().join();
    assert_eq!(checker.unique_state_count(), 8_832);
    checker.assert_properties();

    // reverify the larger state space with symmetry reduction
    let checker = TwoPhaseSys { rms: 0..5 }
        .checker()
        .symmetry()
        .spawn_dfs()
        .join();
    assert_eq!(checker.unique_state_count(), 665);
    checker.assert_properties();
}

#[cfg(test)]
#[test]
fn the_benchmark_counts_what_the_checker_counts() {
    // kvsim's wrapper: both searches agree with upstream's pinned count and judge the
    // model consistent.
    for dfs in [true, false] {
        let r = check_2pc(5, 1, dfs);
        assert_eq!(r.unique, 8_832, "dfs {dfs}");
        assert!(r.consistent && r.generated >= r.unique, "{r:?}");
    }
}
