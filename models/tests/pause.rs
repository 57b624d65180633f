//! The pause fault (`FaultBounds::pauses`, `models/src/model.rs`): a frozen node
//! takes no input that needs its process while the other nodes' timers fire as on
//! time, and the bugs that need a timeout to race a transfer are found by a pause
//! alone, with no early timeout, no failed write and no lost message.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::world::KvTransport;
use kvsim_models::model_state::{Envelope, DECODE, PREFILL};
use kvsim_models::{check, names, Action, CheckOptions, CheckReport, HandoffModel, ModelSpec};
use kvsim_models::{check::Verdict, State};
use stateright::{Checker, Model, Property};
use std::sync::atomic::{AtomicUsize, Ordering};

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

fn assert_clean(r: &CheckReport) {
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
}

/// `pause-race-small`: one request, one pause of either node at any point.
#[test]
fn pause_race_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::pause_race_small());
    assert_clean(&r);
    assert_eq!(
        r.unique, PAUSE_RACE_SMALL,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
    assert!(matches!(
        r.status(names::FROZEN_TIMEOUT),
        Some(Verdict::Reached { .. })
    ));
}

const PAUSE_RACE_SMALL: usize = 4_346;

/// `pause-race`: two requests of two tenants on a decode pool that holds one.
/// `cargo test --release -p kvsim-models --test pause -- --ignored`
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn pause_race_full_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::pause_race());
    assert_clean(&r);
    assert_eq!(
        r.unique, PAUSE_RACE,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

const PAUSE_RACE: usize = 1_060_851;

/// Does `a` hand the frozen node `n` an input its process would have to run for?
fn runs_frozen(a: &Action, n: kvsim_engine::ids::NodeId, spec: &ModelSpec) -> bool {
    let waits = |e: &Envelope| e.held_by(Some(n), spec.engine.transport);
    match a {
        Action::Fire(node, _) | Action::Refire(node, _) => *node == n,
        Action::Deliver(e)
        | Action::Overtake(e)
        | Action::Duplicate(e)
        | Action::Alter(e, _)
        | Action::KeepStale(e) => waits(e.get()),
        Action::LandStale(c) => waits(&c.get().env),
        _ => false,
    }
}

/// `pause-race` walked transition by transition: no action taken while a node is
/// frozen hands it an input that needs its process, and some timer of another node
/// fires while a message to the frozen node waits (the race the fault exists for).
struct FreezeProbe {
    model: HandoffModel,
    raced: AtomicUsize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Probed {
    s: State,
    ran_frozen: bool,
}

impl Model for FreezeProbe {
    type State = Probed;
    type Action = Action;

    fn init_states(&self) -> Vec<Probed> {
        let s = self.model.init_states().remove(0);
        vec![Probed {
            s,
            ran_frozen: false,
        }]
    }

    fn actions(&self, p: &Probed, out: &mut Vec<Action>) {
        self.model.actions(&p.s, out);
    }

    fn next_state(&self, p: &Probed, a: Action) -> Option<Probed> {
        let spec = self.model.spec();
        let frozen = p.s.faults().frozen_node();
        let ran = frozen.is_some_and(|n| runs_frozen(&a, n, spec));
        if let (Some(n), Action::Fire(other, _)) = (frozen, &a) {
            let waiting =
                p.s.net
                    .iter()
                    .any(|e| e.get().held_by(Some(n), spec.engine.transport));
            if *other != n && waiting {
                self.raced.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(Probed {
            s: self.model.step(&p.s, &a, None),
            ran_frozen: p.ran_frozen || ran,
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(
            "a frozen node runs nothing",
            |_, p: &Probed| !p.ran_frozen,
        )]
    }
}

#[test]
fn a_frozen_node_runs_nothing_while_its_peers_time_out() {
    let mut two_sided = ModelSpec::pause_race_small();
    two_sided.engine.transport = KvTransport::TwoSided;
    for spec in [ModelSpec::pause_race_small(), two_sided] {
        let probe = FreezeProbe {
            model: HandoffModel::new(spec.clone()).unwrap(),
            raced: AtomicUsize::new(0),
        };
        let c = probe.checker().spawn_bfs().join();
        assert!(c.is_done());
        if let Some(path) = c.discovery("a frozen node runs nothing") {
            let steps: Vec<String> = path.into_actions().iter().map(|a| a.to_string()).collect();
            panic!("{}: {}", spec.name, steps.join("; "));
        }
        let raced = c.model().raced.load(Ordering::Relaxed);
        assert!(
            raced > 0,
            "{}: no timer fired past a frozen node",
            spec.name
        );
    }
    // Both nodes freeze somewhere in the model.
    let model = HandoffModel::new(ModelSpec::pause_race_small()).unwrap();
    let mut acts = Vec::new();
    let s0 = model.init_states().remove(0);
    let s1 = model.step(&s0, &Action::Submit(0), None);
    model.actions(&s1, &mut acts);
    assert!(acts.contains(&Action::Pause(PREFILL)) && acts.contains(&Action::Pause(DECODE)));
}

/// A timeout racing a transfer needs no early timer when a node can freeze: each
/// switch below is found by the pause alone, and the same model without the pause
/// (no fault at all) finds none of them.
#[test]
fn a_pause_alone_finds_the_timeout_races() {
    for bug in [
        Bug::PrefillReleaseBeforeDrain,
        Bug::SuccessOverwritesAbort,
        Bug::FailOpenOnRecvError,
    ] {
        let spec = ModelSpec::pause_race_small().with_bugs(BugSet::NONE.with(bug));
        let with = run(spec.clone());
        assert!(with.violated(), "{bug:?} not found with a pause");
        let mut calm = spec;
        calm.faults.pauses = 0;
        calm.reaches.clear();
        let without = run(calm);
        assert!(!without.violated(), "{bug:?} found with no fault at all");
    }
}
