//! Named regression tests: each one a bug the simulator found, with its postmortem.

mod common;

use kvsim_engine::trace::TraceEvent;
use kvsim_oracle::schema::Record;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};
use kvsim_sim::{run_plan, Backend};

/// `partition` with cuts of up to 6 s against a drain-retry budget of 1 s.
fn long_partitions() -> Scenario {
    let text = common::PARTITION
        .replace(
            "partition = { count = 6, max_ms = 800 }",
            "partition = { count = 6, max_ms = 6000 }",
        )
        .replace("drain_retries = 100", "drain_retries = 20");
    assert_ne!(
        text,
        common::PARTITION,
        "the scenario still has the lines replaced"
    );
    Scenario::parse(&text, "partition (long cuts)").unwrap()
}

/// Postmortem (found by the `partition` sweep with cuts longer than the drain-retry
/// budget, 2026-11-29). A decode node whose drain requests went unanswered for
/// `drain_retries` intervals stopped itself, as designed (never release on a
/// timeout: a write may still land), but it also stopped asking. Once the partition
/// healed, the prefill side would have acked at once, yet nobody asked again: the
/// aborted rooms' pages stayed quarantined forever and the pool never filled again
/// (L3, L4 in the liveness phase; seed 0 of this variant, 9 rooms). The fix keeps the
/// loud stop (no new requests; only an ack releases pages) and keeps asking, with the
/// retry count saturated so model-checker states stay finite.
#[test]
fn decode_keeps_asking_for_the_drain_ack_after_it_stops() {
    let sc = long_partitions();
    let s = run_sweep(
        &sc,
        "partition-long",
        &SweepOptions {
            seeds: SeedRange { start: 0, end: 100 },
            ..SweepOptions::default()
        },
    )
    .unwrap();
    assert!(s.clean(), "{}", s.render());
    // Seed 0 takes the path: the node stops, then the ack after the heal releases.
    let plan = Plan::build(&sc, 0, None, &Reduction::default()).unwrap();
    let out = run_plan(&plan, Backend::Symbolic, true);
    let fatal = out
        .trace
        .iter()
        .position(|e| matches!(e.rec, Record::Engine(TraceEvent::Fault { .. })))
        .expect("a decode node stops in seed 0");
    let released_after = out.trace[fatal..]
        .iter()
        .any(|e| matches!(e.rec, Record::Engine(TraceEvent::QuarantineReleased { .. })));
    assert!(
        released_after,
        "the ack after the stop releases the quarantine"
    );
    assert!(out.clean());
}
