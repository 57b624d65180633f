//! Symmetry reduction agrees with the full search. `--symmetry` keeps one state per
//! permutation of interchangeable clients (`model::representative`: clients of one
//! group have identical specs and get their request ids in submission order, so
//! sorting them is a renaming the engine cannot observe; pages and rooms are not
//! permuted, since renaming them is not an automorphism of the allocator). A sound
//! reduction changes no verdict: on a small model with two interchangeable requests
//! and faults, every property, the liveness ones included (L1-L4 at quiescence, L5,
//! "an error answer has a cause") and every `sometimes`, gets the same verdict with
//! and without it, on the defended engine and under bug switches that break it.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_models::{check, names, CheckOptions, CheckReport, ClientSpec, FaultBounds, ModelSpec};

/// Two interchangeable 3-token requests on abort-race's pools (decode holds one at a
/// time), each prompt in one write, one premature timeout and one lost message.
fn spec() -> ModelSpec {
    let mut s = ModelSpec::abort_race_small();
    s.name = "two-identical-faulty".into();
    s.clients = vec![ClientSpec::normal(1, 3), ClientSpec::normal(1, 3)];
    s.faults = FaultBounds {
        early_timeouts: 1,
        losses: 1,
        ..FaultBounds::default()
    };
    s.reaches = vec![names::COMPLETES, names::LATE_ACK];
    s
}

/// Each property's name and verdict kind (`Verdict::kind`).
fn verdicts(r: &CheckReport) -> Vec<(String, &'static str)> {
    r.properties
        .iter()
        .map(|p| (p.name.to_string(), p.verdict.kind()))
        .collect()
}

fn both(spec: &ModelSpec) -> (CheckReport, CheckReport) {
    let plain = check(spec.clone(), &CheckOptions::default()).unwrap();
    let options = CheckOptions {
        symmetry: true,
        ..CheckOptions::default()
    };
    let reduced = check(spec.clone(), &options).unwrap();
    assert!(plain.complete && reduced.complete);
    (plain, reduced)
}

#[test]
fn symmetry_changes_no_verdict_liveness_included() {
    let (plain, reduced) = both(&spec());
    assert!(!plain.violated(), "{}", plain.render());
    assert_eq!(verdicts(&plain), verdicts(&reduced));
    assert!(
        reduced.unique < plain.unique,
        "{} vs {}",
        reduced.unique,
        plain.unique
    );
    eprintln!(
        "{}: {} states, {} with symmetry",
        plain.spec.name, plain.unique, reduced.unique
    );
    let mut broken = 0;
    for bug in [
        Bug::DecodeReleaseImmediate,
        Bug::SuccessOverwritesAbort,
        Bug::DoubleFreeOnFinish,
        Bug::AbortAfterSuccess,
    ] {
        let (p, r) = both(&spec().with_bugs(BugSet::NONE.with(bug)));
        assert_eq!(verdicts(&p), verdicts(&r), "{bug:?}");
        broken += usize::from(p.violated());
    }
    assert!(
        broken >= 3,
        "the switches must break the model: {broken} did"
    );
}
