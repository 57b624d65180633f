//! Rooms with several sender ranks in the model checker (issue 37, class 1):
//! `vllm-ranks` is `vllm-pull` with two READ handles a room, one per remote prefill
//! rank, counted before the transfer ends. The defended pair exhausts it clean with a
//! pinned state count; each class-1 switch breaks the invariant its harm breaks, and
//! its counterexample replays on the engine's own nodes to the same invariant.

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_models::check::{invariant_of, Verdict};
use kvsim_models::{check, names, CheckOptions, CheckReport, ModelSpec};

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

const VLLM_RANKS: usize = 270;

#[test]
fn vllm_ranks_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::vllm_ranks());
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
    assert_eq!(
        r.unique, VLLM_RANKS,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

/// The invariants whose counterexamples replay to the same invariant.
#[track_caller]
fn replayed(r: &CheckReport) -> Vec<Invariant> {
    let mut broken = Vec::new();
    for c in &r.counterexamples {
        let Some(inv) = invariant_of(c.property) else {
            continue;
        };
        let out = c.replay.as_ref().expect("every counterexample replays");
        assert!(
            out.broken.contains(&inv),
            "{inv} replays to {:?}",
            out.broken
        );
        broken.push(inv);
    }
    broken
}

/// Each switch, the model property it breaks, and what its counterexample replays to
/// on the engine's own nodes and oracle. In a model of two handles the two that end
/// the count early (`first-failed-handle-frees`: the first failure ends it;
/// `failed-slice-counted-twice`: the failure is counted for the sibling too) take the
/// same path: a failed handle releases the aborted room's quarantine while its sibling
/// READ is in flight (S9). `rejected-scatter-returns-ok` accepts a transfer whose page
/// was never read (S4; the read of it is S3, detected by the page tags).
/// `failed-handle-skipped` never completes the count: the quarantine never ends (the
/// quiescence property, replayed as L3 and L4).
#[test]
fn each_class_one_switch_is_found_and_replays() {
    let cases: [(&str, &str, &[Invariant]); 4] = [
        ("first-failed-handle-frees", names::S9, &[Invariant::S9]),
        ("failed-slice-counted-twice", names::S9, &[Invariant::S9]),
        ("rejected-scatter-returns-ok", names::S4, &[Invariant::S4]),
        (
            "failed-handle-skipped",
            names::QUIESCENCE,
            &[Invariant::L3, Invariant::L4],
        ),
    ];
    for (bug, property, replays_to) in cases {
        let spec = ModelSpec::vllm_ranks().with_bugs(BugSet::parse(bug).unwrap());
        let r = run(spec);
        assert!(
            matches!(r.status(property), Some(Verdict::Violated { .. })),
            "{bug}: {property}\n{}",
            r.render()
        );
        replayed(&r);
        let c = r.counterexample(property).unwrap();
        let out = c.replay.as_ref().expect("the counterexample replays");
        for inv in replays_to {
            assert!(
                out.broken.contains(inv),
                "{bug}: replays to {:?}",
                out.broken
            );
        }
    }
}
