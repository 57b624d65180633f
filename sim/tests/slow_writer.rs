//! The slow writer: a prefill node that stays alive and keeps writing after decode
//! has timed out, asked for the drain until its retry budget ran out, and given up
//! loudly. Its writes still land, into pages decode still keeps quarantined, so the
//! defended engine leaks nothing; without deferred release (or with decode's early
//! release switched on) they land in pages already handed to other requests.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::{NodeFault, TraceEvent};
use kvsim_oracle::schema::Record;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_plan, Backend, RunOutcome};

const BASE: &str = include_str!("../../scenarios/data-faults.toml");

fn run(seed: u64, bugs: BugSet, deferred: bool) -> RunOutcome {
    let mut sc = Scenario::parse(BASE, "scenarios/data-faults.toml").unwrap();
    let f = &mut sc.faults;
    (
        f.corrupt_write_permille,
        f.misdirect_write_permille,
        f.torn_write_permille,
        f.stale_duplicate_write_permille,
    ) = (0, 0, 0, 0);
    // Later than decode's waiting timeout (2 s) plus its drain budget (100 x 50 ms).
    f.slow_writer_ms = 12_000;
    sc.swarm = sc.swarm.take().map(|mut s| {
        s.prefill_nodes = [1, 1];
        s
    });
    sc.engine.defenses.deferred_release = deferred;
    let plan = Plan::build(&sc, seed, Some(bugs), &Reduction::default()).unwrap();
    run_plan(&plan, Backend::Symbolic, true)
}

fn gave_up(out: &RunOutcome) -> bool {
    out.trace.iter().any(|e| {
        matches!(
            &e.rec,
            Record::Engine(TraceEvent::Fault {
                fault: NodeFault::DrainAckMissing { .. },
                ..
            })
        )
    })
}

#[test]
fn the_defended_engine_leaks_nothing_under_a_slow_writer() {
    let mut slow = 0;
    let mut gave = 0;
    for seed in 0..12 {
        let out = run(seed, BugSet::NONE, true);
        slow += u64::from(out.plan.slow_writer.is_some());
        gave += u64::from(gave_up(&out));
        assert!(out.clean(), "seed {seed}: {:?}", out.findings);
    }
    // The fault was on, and decode did run out of its drain budget.
    assert!(
        slow > 0 && gave > 0,
        "slow writer on {slow} seeds, gave up on {gave}"
    );
}

#[test]
fn a_slow_writer_lands_in_reused_pages_without_deferred_release() {
    let mut broken = Vec::new();
    for seed in 0..12 {
        for (bugs, deferred) in [
            (BugSet::NONE, false),
            (BugSet::NONE.with(Bug::DecodeReleaseImmediate), true),
        ] {
            let out = run(seed, bugs, deferred);
            if out.plan.slow_writer.is_some() {
                broken.extend(out.broken());
            }
        }
    }
    assert!(
        broken.contains(&Invariant::S2) || broken.contains(&Invariant::S9),
        "{broken:?}"
    );
}
