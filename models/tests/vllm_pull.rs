//! vLLM's pull protocol (its NIXL connector under `vllm-router`) in the model checker:
//! `vllm-pull` exhausts its space clean with a pinned state count; `vllm-lease-race`,
//! where the lease may run out while the READ is on its way, finds S2 (the READ
//! served after its lease expired: the leases checker) and its counterexample replays
//! on the engine's own nodes.

use kvsim_engine::bugs::BugSet;
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, CheckReport, ModelSpec};

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

#[test]
fn vllm_pull_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::vllm_pull());
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
    assert_eq!(
        r.unique, VLLM_PULL,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

const VLLM_PULL: usize = 265;

#[test]
fn vllm_lease_race_finds_the_read_after_the_lease_expired() {
    let r = run(ModelSpec::vllm_lease_race());
    assert!(
        matches!(r.status(names::S2), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
}

/// `vllm-crash`: the remote disconnect of vLLM's unit tests. A prefill that crashes
/// while its READ's response is on the wire fails the READ back to decode (the world's
/// crash rule), so the defended pair stays clean, with a pinned count.
#[test]
fn vllm_crash_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::vllm_crash());
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    assert_eq!(
        r.unique, VLLM_CRASH,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

const VLLM_CRASH: usize = 535;

/// The vLLM switches the models reach, each by the invariant it breaks first, and each
/// counterexample replays on the engine's nodes to the same invariant:
/// `fail-open-on-recv-error` (vLLM #52234: a failed READ answered 200, S4 at once and
/// S3 when decode attends) and `read-error-leaves-pending` (vLLM #55181: the failed
/// READ's completion never handled; at quiescence a quarantine waits for good, L1-L4).
#[test]
fn vllm_switches_are_found_and_replay() {
    let expect: [(&str, &str); 3] = [
        ("fail-open-on-recv-error", names::S4),
        ("fail-open-on-recv-error", names::S3),
        ("read-error-leaves-pending", names::QUIESCENCE),
    ];
    for (bug, property) in expect {
        for spec in [ModelSpec::vllm_pull(), ModelSpec::vllm_crash()] {
            let name = spec.name.clone();
            let r = run(spec.with_bugs(BugSet::parse(bug).unwrap()));
            assert!(
                matches!(r.status(property), Some(Verdict::Violated { .. })),
                "{bug} on {name}: {property} not violated\n{}",
                r.render()
            );
            for c in &r.counterexamples {
                let replayed = c.replay.as_ref().expect("every counterexample replays");
                assert!(
                    !replayed.broken.is_empty(),
                    "{bug} on {name}: {} replays clean",
                    c.property
                );
            }
        }
    }
}
