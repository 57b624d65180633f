//! The `worker-front` model: `retry-race-small` with the prefill and the decode
//! node each behind its SGLang worker front (`engine/src/nodes/worker/behind.rs`),
//! the `sglang-router` policy reaching them only through the fronts. Exhausted
//! clean, its state count pinned (docs/COUNTS.md).

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, ModelSpec};

const WORKER_FRONT: usize = 193_808;

#[test]
fn worker_front_is_clean_with_a_pinned_state_count() {
    let r = check(ModelSpec::worker_front(), &CheckOptions::default()).unwrap();
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
    assert!(matches!(
        r.status(names::RETRIED_LIVE),
        Some(Verdict::Reached { .. })
    ));
    assert_eq!(
        r.unique, WORKER_FRONT,
        "state count changed: re-check, then re-pin (docs/COUNTS.md)"
    );
}

/// A bug switch behind the fronts: decode frees an aborted request's pages while its
/// write is in flight (`decode-release-immediate`); found at its root, S9, and the
/// counterexample replays through the engine's hand-stepped driver with the nodes
/// behind their fronts.
#[test]
fn a_bug_switch_behind_the_fronts_is_found_and_replays() {
    let bugs = BugSet::parse("decode-release-immediate").unwrap();
    let spec = ModelSpec::worker_front().with_bugs(bugs);
    let r = check(spec, &CheckOptions::default()).unwrap();
    assert!(
        matches!(r.status(names::S9), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
    let c = r.counterexample(names::S9).unwrap();
    assert!(c.replay.as_ref().unwrap().broken.contains(&Invariant::S9));
}
