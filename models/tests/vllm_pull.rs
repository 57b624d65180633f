//! vLLM's pull protocol (its NIXL connector under `vllm-router`) in the model checker:
//! `vllm-pull` exhausts its space clean with a pinned state count; `vllm-lease-race`,
//! where the lease may run out while the READ is on its way, finds S2 (the READ
//! served after its lease expired: the leases checker) and its counterexample replays
//! on the engine's own nodes.

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
