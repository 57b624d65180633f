//! Reachability is recorded from a run's entries as they are emitted, without a
//! trace: the same paths a traced run records, and the same paths a tracker reads
//! back from that run's trace alone (each path has one definition, over the trace).

mod common;

use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::reach::{ReachPath, ReachSet, ReachTracker};
use kvsim_sim::{run_plan, run_plan_unhashed, Backend};

#[test]
fn a_runs_paths_read_back_from_its_trace_are_the_paths_it_recorded() {
    let mut union: Vec<ReachPath> = Vec::new();
    for (path, seeds) in [
        ("scenarios/mixed-faults.toml", 0..3),
        ("scenarios/partition.toml", 0..2),
        ("scenarios/abort-storm.toml", 0..2),
        ("scenarios/transfer-failures.toml", 0..2),
        ("scenarios/disconnect-mid-transfer.toml", 0..1),
    ] {
        let sc = common::scenario(path);
        for seed in seeds {
            let plan = Plan::build(&sc, seed, None, &Reduction::default()).unwrap();
            let traced = run_plan(&plan, Backend::Symbolic, true);
            let recorded = traced.stats.coverage.reach;
            assert_eq!(
                run_plan_unhashed(&plan).stats.coverage.reach,
                recorded,
                "{path} seed {seed}: tracing changed what the run reached"
            );
            let mut t = ReachTracker::default();
            for e in &traced.trace {
                t.entry(e);
            }
            assert_eq!(t.reached(), recorded, "{path} seed {seed}");
            for p in recorded.iter() {
                if !union.contains(&p) {
                    union.push(p);
                }
            }
        }
    }
    // Not vacuous: the paths that span several entries are among those compared.
    for p in [
        ReachPath::DrainAfterTimeout,
        ReachPath::TransferTimeout,
        ReachPath::AbortMidTransfer,
        ReachPath::CrashMidRequest,
    ] {
        assert!(union.contains(&p), "{p} never reached: {union:?}");
    }
    assert!(ReachSet::default().is_empty());
}
