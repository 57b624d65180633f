//! The bug-detection matrix as tests: every historical bug switch is caught, the
//! defended engine is not flagged, within budgets small enough for the default
//! `cargo test`. The full budgets are `kvsim bugs` (see docs/guide/find-a-bug.md).

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_lab::matrix::{self, Budget};

/// Seeds per switch for the simulator (the slowest switch, `ack-ignores-generation`
/// on `partition`, first fails at seed 76).
const SEEDS: u64 = 300;

#[test]
fn every_switch_is_caught_by_the_simulator_within_its_budget() {
    for (label, bugs, baseline) in matrix::configurations() {
        if baseline {
            continue;
        }
        let cell = matrix::sim_cell(bugs, SEEDS, |_| {}).unwrap();
        if let Some(why) = matrix::sim_not_applicable(bugs) {
            // A named exception must really be one.
            assert!(
                cell.invariant.is_none(),
                "{label} is now caught by the simulator ({:?}): drop its exception ({why})",
                cell.invariant
            );
            continue;
        }
        assert!(
            cell.invariant.is_some(),
            "{label} escaped the simulator: {} seeds of {}",
            cell.seeds_run,
            cell.scenario
        );
    }
}

/// Safety switches the reduced models cannot reach, each with the reason. Everything
/// else must be caught by the model checker.
fn model_checker_exception(bugs: BugSet) -> Option<&'static str> {
    let only = |b: Bug| bugs == BugSet::NONE.with(b);
    if let Some(why) = matrix::mc_not_applicable(bugs) {
        Some(why)
    } else if only(Bug::NoLengthAgreement) {
        Some("needs a length mismatch from elsewhere; every model prompt fits every node, so nothing truncates (the simulator's glm53-truncate does)")
    } else {
        None
    }
}

#[test]
fn every_safety_switch_is_caught_by_the_model_checker() {
    // The quick models, plus abort-race at full bounds for the one switch that needs
    // a failed write among several in flight.
    let budget = Budget {
        models: vec!["handoff-small", "abort-race-small", "abort-race"],
        ..Budget::quick(0)
    };
    for (label, bugs, baseline) in matrix::configurations() {
        if baseline {
            continue;
        }
        let cell = matrix::mc_cell(bugs, &budget).unwrap();
        match model_checker_exception(bugs) {
            Some(why) => {
                // A named exception must really be one: if the checker starts catching
                // it, the reason above is stale.
                if let Ok(c) = &cell {
                    assert!(
                        c.invariant.is_none(),
                        "{label} is now caught by {}: drop its exception ({why})",
                        c.model
                    );
                }
            }
            None => {
                let c = cell.as_ref().unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(
                    c.invariant.is_some(),
                    "{label} escaped the model checker ({} states)",
                    c.states
                );
                assert!(
                    c.counterexample_len.is_some_and(|n| n <= 40),
                    "{label}: {:?}",
                    c.counterexample_len
                );
            }
        }
    }
}

#[test]
fn the_default_engine_passes_the_same_budgets() {
    let sim = matrix::sim_cell(BugSet::NONE, SEEDS, |_| {}).unwrap();
    assert_eq!(
        sim.invariant, None,
        "the defended engine failed seed {:?}",
        sim.first_seed
    );
    assert_eq!(sim.seeds_run, SEEDS);
    let mc = matrix::mc_cell(BugSet::NONE, &Budget::quick(0))
        .unwrap()
        .unwrap();
    assert_eq!(
        mc.invariant, None,
        "the defended engine broke {:?} in {}",
        mc.invariant, mc.model
    );
    assert!(
        mc.states > 30_000,
        "the reduced models explored only {} states",
        mc.states
    );
}

#[test]
fn the_quick_matrix_is_all_caught_and_renders() {
    let m = matrix::run(&Budget::quick(100), "test", |_| {}).unwrap();
    for r in &m.rows {
        assert!(r.ok(), "{} not ok: {:?} / {:?}", r.label, r.sim, r.mc);
    }
    let md = kvsim_lab::matrix_report::markdown(&m);
    assert!(md.contains("| incident pair (gate + length) |"), "{md}");
    let svg = kvsim_lab::matrix_report::svg(&m).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("ack-ignores-generation"),
        "{}",
        &svg[..200.min(svg.len())]
    );
}
