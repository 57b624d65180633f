//! The real topology (issue 39): 2 prefill and 2 decode nodes under the real
//! gateway's policy (`sglang-router`: pairs round robin, no cancel of the other half,
//! retries in new rooms), with three interchangeable requests.
//!
//! The reduction that gets `two-by-two` exhausted is the symmetry over
//! interchangeable requests (`--symmetry`, [`kvsim_models::representative`]); its
//! argument for this topology is in `docs/DECISIONS.md` ("Reductions of the model
//! checker"). Here: the small 2x2 model is pinned and clean, and the reduced and
//! unreduced searches give every property, the liveness ones included (L1-L4 at
//! quiescence, L5, "an error answer has a cause") and every `sometimes`, the same
//! verdict on small 2x2 models, on the defended engine and under bug switches that
//! break it, and every counterexample of either search replays on the 2x2 topology
//! through the simulator's nodes and oracle to its invariant. The full model, with
//! the reduction, is behind `#[ignore]`.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, CheckReport, FaultBounds, ModelSpec};

fn run(spec: ModelSpec, symmetry: bool) -> CheckReport {
    let options = CheckOptions {
        symmetry,
        // Both searches depth-first (stateright reduces symmetry in DFS only), so the
        // counts compare like with like.
        dfs: true,
        ..CheckOptions::default()
    };
    let r = check(spec, &options).expect("the 2x2 specs are valid");
    assert!(r.complete, "not exhaustive");
    r
}

/// The model exhausts its space, every `always` holds, every expected path is reached.
fn assert_clean(r: &CheckReport) {
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
}

/// Each property's name and verdict kind ([`Verdict::kind`]).
fn verdicts(r: &CheckReport) -> Vec<(String, &'static str)> {
    r.properties
        .iter()
        .map(|p| (p.name.to_string(), p.verdict.kind()))
        .collect()
}

/// `two-by-two-small`: three interchangeable requests on the two pairs, no fault.
#[test]
fn two_by_two_small_is_clean_with_a_pinned_state_count() {
    let plain = run(ModelSpec::two_by_two_small(), false);
    assert_clean(&plain);
    assert_eq!(
        plain.unique, TWO_BY_TWO_SMALL,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
    let reduced = run(ModelSpec::two_by_two_small(), true);
    assert_eq!(verdicts(&plain), verdicts(&reduced));
    assert_eq!(
        reduced.unique, TWO_BY_TWO_SMALL_SYMMETRY,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

const TWO_BY_TWO_SMALL: usize = 33_847;
const TWO_BY_TWO_SMALL_SYMMETRY: usize = 5_654;

/// Every counterexample of an invariant replays on the 2x2 topology, through the
/// simulator's nodes and oracle, to that invariant (the reduced search's too: its
/// paths are real paths, not paths between representatives).
fn replays(r: &CheckReport) {
    for c in &r.counterexamples {
        let outcome = c.replay.as_ref().expect("the schedule replays");
        if c.property.starts_with('S') || c.property.starts_with("L5") {
            assert!(
                outcome
                    .broken
                    .iter()
                    .any(|i| c.property.starts_with(&format!("{i} "))),
                "{}: {} replays to {:?}",
                r.spec.name,
                c.property,
                outcome.broken
            );
        }
    }
}

/// Small 2x2 models where the reduction has something to merge: the three requests
/// of `two-by-two-small`, and two interchangeable requests where one KV write may
/// fail, each prompt in two one-page writes (decode fails the transfer while the other
/// write may still be in flight; the router retries the 500 in a new room on the other
/// pair).
fn small_specs() -> Vec<ModelSpec> {
    let mut retried = ModelSpec::two_by_two_small();
    retried.name = "two-by-two-failed-write".into();
    retried.clients.truncate(2);
    retried.engine.chunk_pages = 1;
    retried.faults = FaultBounds {
        write_failures: 1,
        ..FaultBounds::default()
    };
    retried.reaches = vec![names::COMPLETES, names::SPREAD];
    vec![ModelSpec::two_by_two_small(), retried]
}

/// The bug switches the agreement is checked under: each breaks the failed-write
/// model (S2, S9, S3/S6/S10), none the fault-free one (every switch was tried on both;
/// the others break neither: their hazards need an abort, a duplicate, an over-length
/// request or the careful router).
const BUGS: [Bug; 4] = [
    Bug::DecodeReleaseImmediate,
    Bug::PrefillReleaseBeforeDrain,
    Bug::FailedSendReportsDrained,
    Bug::FailOpenOnRecvError,
];

#[test]
fn symmetry_changes_no_verdict_on_the_real_topology_liveness_included() {
    let mut broken = 0;
    for spec in small_specs() {
        for bugs in std::iter::once(BugSet::NONE).chain(BUGS.map(|b| BugSet::NONE.with(b))) {
            let spec = spec.clone().with_bugs(bugs);
            let (plain, reduced) = (run(spec.clone(), false), run(spec.clone(), true));
            assert_eq!(
                verdicts(&plain),
                verdicts(&reduced),
                "{} under {bugs:?}",
                spec.name
            );
            assert!(
                reduced.unique < plain.unique,
                "{}: nothing merged",
                spec.name
            );
            if bugs == BugSet::NONE {
                assert_clean(&plain);
            }
            broken += usize::from(plain.violated());
            replays(&plain);
            replays(&reduced);
            eprintln!(
                "{} {bugs:?}: {} states, {} with symmetry, violated {}",
                spec.name,
                plain.unique,
                reduced.unique,
                plain.violated()
            );
        }
    }
    assert!(
        broken >= 4,
        "the switches must break the models: {broken} runs did"
    );
}

/// `two-by-two`, with the reduction: the pinned count, every property holding, every
/// path reached. `cargo test --release -p kvsim-models --test two_by_two -- --ignored`
/// (minutes on 2 cores; the unreduced run is `kvsim check --model two-by-two --dfs`,
/// over ten minutes: docs/PERFORMANCE.md).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn two_by_two_full_is_clean_with_a_pinned_state_count() {
    let options = CheckOptions {
        symmetry: true,
        dfs: true,
        threads: 2,
        ..CheckOptions::default()
    };
    let reduced = check(ModelSpec::two_by_two(), &options).expect("valid");
    assert!(reduced.complete, "not exhaustive");
    assert_clean(&reduced);
    assert_eq!(
        reduced.unique, TWO_BY_TWO_SYMMETRY,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

const TWO_BY_TWO_SYMMETRY: usize = 28_950_573;
