//! Every scenario file: the defended engine runs it clean and reaches every path the
//! file declares in `reach`, and the bug switch its header names is caught.
//! Data-driven: one row per (scenario, bugs, invariant).

mod common;

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{run_sweep, SeedRange, Shard, SweepOptions, SweepSummary};

fn sweep_of(sc: &Scenario, path: &str, seeds: u64, bugs: Option<BugSet>) -> SweepSummary {
    sweep_shard(sc, path, seeds, bugs, Shard::WHOLE)
}

fn sweep_shard(
    sc: &Scenario,
    path: &str,
    seeds: u64,
    bugs: Option<BugSet>,
    shard: Shard,
) -> SweepSummary {
    run_sweep(
        sc,
        path,
        &SweepOptions {
            seeds: SeedRange {
                start: 0,
                end: seeds,
            },
            shard,
            bugs,
            ..SweepOptions::default()
        },
    )
    .unwrap()
}

fn sweep(path: &str, seeds: u64, bugs: Option<BugSet>) -> SweepSummary {
    sweep_of(&common::scenario(path), path, seeds, bugs)
}

/// Seeds per scenario in the clean sweep: the incident pair is one fixed run.
fn clean_seeds(path: &str) -> u64 {
    if path.contains("glm53") {
        1
    } else {
        50
    }
}

/// Each scenario declares the paths it exists to reach (`reach`), and the clean
/// sweep reaches every one of them: a scenario whose faults stopped triggering its
/// path would otherwise pass vacuously.
#[test]
fn every_scenario_runs_clean_on_the_defended_engine_and_reaches_what_it_declares() {
    for (path, _) in common::ALL {
        let sc = common::scenario(path);
        assert!(!sc.reach.is_empty(), "{path} declares no `reach`");
        let s = sweep_of(&sc, path, clean_seeds(path), None);
        assert!(s.clean(), "{}", s.render());
        assert!(s.judges_reach(), "{}", s.render());
        assert_eq!(s.reach_failure(), None, "{path}:\n{}", s.render());
        for p in &sc.reach {
            assert!(s.coverage.reach[p] > 0, "{path}: {p}");
        }
    }
}

/// Every file in scenarios/ is one of [`common::ALL`] (so the test above judges it).
#[test]
fn every_scenario_file_is_judged() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".toml"))
        .map(|n| format!("scenarios/{n}"))
        .collect();
    files.sort();
    let mut known: Vec<String> = common::ALL.iter().map(|(p, _)| p.to_string()).collect();
    known.sort();
    assert_eq!(files, known);
}

/// A scenario that declares a path its faults cannot reach fails its sweep: on a
/// clean network with no crash, `crash-mid-request` and `drain-gave-up` are reached
/// by no seed. A shard alone does not judge; the merge of every shard does.
#[test]
fn a_declared_path_no_seed_reaches_fails_the_sweep() {
    const PATH: &str = "scenarios/client-disconnects.toml";
    let sc = common::scenario_with(PATH, |sc| {
        sc.reach.push("crash-mid-request".into());
        sc.reach.push("drain-gave-up".into());
    });
    let s = sweep_of(&sc, PATH, 4, None);
    assert!(s.clean(), "{}", s.render());
    assert_eq!(s.unreached_paths(), ["crash-mid-request", "drain-gave-up"]);
    let why = s.reach_failure().expect("the sweep fails on reachability");
    assert!(
        why.contains(
            "`crash-mid-request`, `drain-gave-up` were reached by no seed of the 4 seeds run"
        ),
        "{why}"
    );
    let line = s.render();
    assert!(
        line.contains("NOT REACHED: crash-mid-request, drain-gave-up"),
        "{line}"
    );
    // The declared paths the faults do reach are counted, not failed.
    assert!(s.coverage.reach["abort-mid-transfer"] > 0, "{line}");
    // A shard alone does not judge; the merge of both shards does, the same way.
    let shard = |k| sweep_shard(&sc, PATH, 4, None, Shard { k, n: 2 });
    let (one, two) = (shard(1), shard(2));
    assert!(!one.judges_reach() && one.unreached_paths().is_empty());
    assert!(one.render().contains("not judged"), "{}", one.render());
    let merged = SweepSummary::merge(&[one, two]).unwrap();
    assert!(merged.judges_reach());
    assert_eq!(merged.coverage.reach, s.coverage.reach);
    assert_eq!(merged.unreached_paths(), s.unreached_paths());
    // A sweep stopped early does not judge either.
    let first = run_sweep(
        &sc,
        PATH,
        &SweepOptions {
            seeds: SeedRange { start: 0, end: 4 },
            time_budget: Some(std::time::Duration::ZERO),
            ..SweepOptions::default()
        },
    )
    .unwrap();
    assert!(first.stopped.is_some(), "{}", first.render());
    assert_eq!(first.reach_failure(), None);
}

/// (scenario, bug switches, the invariant reported first, seeds within which it is).
const FOUND: &[(&str, &str, Invariant, u64)] = &[
    (
        "scenarios/abort-storm.toml",
        "success-overwrites-abort",
        Invariant::S6,
        20,
    ),
    // Judged at its root: decode hands a freed page to the next request while a write
    // aimed at it is still in flight (S9), before that write lands there (S2).
    (
        "scenarios/disconnect-mid-transfer.toml",
        "decode-release-immediate",
        Invariant::S9,
        20,
    ),
    (
        "scenarios/disconnect-mid-transfer.toml",
        "prefill-release-before-drain",
        Invariant::S2,
        20,
    ),
    (
        "scenarios/transfer-failures.toml",
        "failed-send-reports-drained",
        Invariant::S9,
        20,
    ),
    (
        "scenarios/partition.toml",
        "ack-ignores-generation",
        Invariant::S9,
        200,
    ),
    (
        "scenarios/mixed-faults.toml",
        "double-free-on-finish",
        Invariant::S8,
        20,
    ),
    (
        "scenarios/mixed-faults.toml",
        "fail-open-on-recv-error",
        Invariant::S3,
        20,
    ),
    (
        "scenarios/glm53-incident.toml",
        "gate-checks-finished-only,no-length-agreement",
        Invariant::S5,
        1,
    ),
    (
        "scenarios/stalls.toml",
        "prefill-release-before-drain",
        Invariant::S2,
        50,
    ),
    // Verification (defense 2) refuses the transfer whose last pages the skewed
    // chunks never wrote: S4 detected.
    (
        "scenarios/prefix-hit.toml",
        "chunk-index-by-position",
        Invariant::S4,
        20,
    ),
    // vLLM's pull (issue 36 item 3): the timeout that heartbeats never renew (vLLM
    // #20139) lets a late READ be served after the lease (S2, seed 7); a failed READ
    // left with no terminal state (#55181) keeps its pages quarantined for good (L3,
    // seed 4); a failed READ answered 200 (#52234) runs on unwritten pages (S4, then S3).
    (
        "scenarios/vllm-pull.toml",
        "lease-ignores-heartbeat",
        Invariant::S2,
        20,
    ),
    (
        "scenarios/vllm-pull.toml",
        "read-error-leaves-pending",
        Invariant::L3,
        20,
    ),
    (
        "scenarios/vllm-pull.toml",
        "fail-open-on-recv-error",
        Invariant::S4,
        20,
    ),
    // Issue 37, class 6: decode holds a room prefill refused for its 300 s waiting
    // timeout, past the liveness bound (requests unanswered at its end).
    (
        "scenarios/failed-room.toml",
        "prefill-drops-failed-page-list",
        Invariant::L1,
        5,
    ),
    // Behind worker fronts, the incident's placeholder still walks the handoff.
    (
        "scenarios/worker-mode.toml",
        "gate-checks-finished-only,no-length-agreement",
        Invariant::S5,
        20,
    ),
];

#[test]
fn each_scenario_catches_its_bug() {
    for &(path, bugs, invariant, within) in FOUND {
        let s = sweep(path, within, Some(BugSet::parse(bugs).unwrap()));
        // A hazard the defenses stopped counts as found (`S3 detected`).
        let found = s.violations.contains_key(&invariant.to_string())
            || s.detections.contains_key(&invariant.to_string());
        assert!(
            found,
            "{path} with {bugs}: expected {invariant} first in some seed below {within}\n{}",
            s.render()
        );
    }
}
