//! The `nixl-race` model: KV over NIXL (the measured row of NIXL 1.5.1 over UCX/TCP,
//! `engine/src/transport.rs`): a crash and a pause of either node at any point, a
//! write through a restarted decode's earlier page list landing in its memory, a
//! write to a stopped decode waiting for it. Exhausted clean, its state count pinned
//! (docs/COUNTS.md); the same model over one-sided RDMA has another count (there the
//! stale write fails back and a stopped decode takes writes), and a bug switch is
//! found in it.

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::world::KvTransport;
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, CheckReport, ModelSpec};

const NIXL_RACE: usize = 54_790;
const NIXL_RACE_OVER_RDMA: usize = 31_489;

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

fn assert_clean(r: &CheckReport) {
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
}

#[test]
fn nixl_race_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::nixl_race());
    assert_clean(&r);
    assert!(matches!(
        r.status(names::FROZEN_TIMEOUT),
        Some(Verdict::Reached { .. })
    ));
    assert_eq!(
        r.unique, NIXL_RACE,
        "state count changed: re-check, then re-pin (docs/COUNTS.md)"
    );
    let mut rdma = ModelSpec::nixl_race();
    rdma.engine.transport = KvTransport::OneSided;
    let r = run(rdma);
    assert_clean(&r);
    assert_eq!(r.unique, NIXL_RACE_OVER_RDMA, "the same bounds over RDMA");
}

/// Prefill releases its source pages before the drain (`prefill-release-before-drain`):
/// found over NIXL, S2 (a write still reads a freed source page), and the
/// counterexample replays on the engine's hand-stepped driver over NIXL.
#[test]
fn a_bug_switch_is_found_over_nixl_and_replays() {
    let bugs = BugSet::parse("prefill-release-before-drain").unwrap();
    let r = run(ModelSpec::nixl_race().with_bugs(bugs));
    assert!(
        matches!(r.status(names::S2), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
    let c = r.counterexample(names::S2).unwrap();
    assert!(c.replay.as_ref().unwrap().broken.contains(&Invariant::S2));
}
