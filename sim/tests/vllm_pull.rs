//! vLLM's pull protocol in the simulator (`scenarios/vllm-pull.toml`): with a lease
//! that outlasts the scenario's delays the defended pair runs clean (the scenario
//! sweep in `scenarios.rs` judges it); with a lease shorter than the time a READ can
//! take to reach prefill (the aws-samples/aws-do-eks#84 shape: prefill frees the
//! blocks while decode still means to read them, and the reply is 200), the oracle
//! finds it: S2 at the READ served after its lease expired (the leases checker).

mod common;

use kvsim_engine::invariant::Invariant;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};

#[test]
fn a_lease_shorter_than_the_reads_latency_is_found_as_s2() {
    let path = "scenarios/vllm-pull.toml";
    let sc = common::scenario_with(path, |sc| {
        sc.engine.timeouts.lease_ns = 20_000_000;
    });
    let opts = SweepOptions {
        seeds: SeedRange { start: 0, end: 20 },
        ..SweepOptions::default()
    };
    let s = run_sweep(&sc, path, &opts).unwrap();
    assert!(
        s.violations.contains_key(&Invariant::S2.to_string()),
        "{}",
        s.render()
    );
}
