//! Rooms with several sender ranks (`scenarios/multi-rank.toml`, issue 37 class 1):
//! vLLM's pull with one READ handle per remote prefill rank and a count of handles
//! that ends the transfer. The defended pair runs the scenario clean (judged with
//! every scenario in `scenarios.rs`); each class-1 switch is found within 500 seeds,
//! by the invariant its harm breaks first.

mod common;

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions, SweepSummary};

const PATH: &str = "scenarios/multi-rank.toml";

fn sweep(seeds: u64, bugs: BugSet) -> SweepSummary {
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        bugs: Some(bugs),
        ..SweepOptions::default()
    };
    run_sweep(&common::scenario(PATH), PATH, &opts).unwrap()
}

/// (switch, the invariant it breaks, found within this many seeds). The two that free
/// a room's pages while a sibling handle is in flight break S9 first (the page is
/// handed to another room while a READ is still aimed at it), then S2 where the
/// sibling lands; the one that takes a failed handle for OK breaks S4 (decode accepts
/// a transfer whose slice was never written; its read of those slots is S3, stopped by
/// the page tags); the one that skips a failed handle never completes the room's
/// count, so the aborted room's quarantine never ends (L3, and L4).
const FOUND: &[(&str, Invariant, u64)] = &[
    ("first-failed-handle-frees", Invariant::S9, 500),
    ("failed-slice-counted-twice", Invariant::S9, 500),
    ("rejected-scatter-returns-ok", Invariant::S4, 500),
    ("failed-handle-skipped", Invariant::L3, 500),
];

#[test]
fn each_class_one_switch_is_found_within_500_seeds() {
    for &(bugs, invariant, within) in FOUND {
        let s = sweep(within, BugSet::parse(bugs).unwrap());
        assert!(
            s.violations.contains_key(&invariant.to_string()),
            "{bugs}: expected {invariant} violated in some seed below {within}\n{}",
            s.render()
        );
    }
}

#[test]
fn the_defended_pair_runs_the_scenario_clean() {
    let s = sweep(200, BugSet::NONE);
    assert!(s.clean(), "{}", s.render());
}
