//! Determinism, replay, shrinking and the failure report.
//!
//! A run is a pure function of (scenario, seed, bug switches, reduction): the same
//! seed gives the same trace byte for byte, tracing does not perturb it, a failing
//! seed replays to the same first violation, and the report a person reads is pinned
//! by a snapshot.

mod common;

use kvsim_engine::bugs::BugSet;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::replay::{self, ReplayOptions};
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};
use kvsim_sim::{report, run_plan, shrink, Backend};

const PATH: &str = "scenarios/mixed-faults.toml";

fn traced(seed: u64, bugs: Option<BugSet>) -> kvsim_sim::RunOutcome {
    let sc = common::scenario(PATH);
    let plan = Plan::build(&sc, seed, bugs, &Reduction::default()).unwrap();
    run_plan(&plan, Backend::Symbolic, true)
}

fn json_lines(out: &kvsim_sim::RunOutcome) -> String {
    out.trace
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect()
}

#[test]
fn same_seed_same_trace_byte_for_byte() {
    for seed in [0, 7, 1234] {
        let a = traced(seed, None);
        let b = traced(seed, None);
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(
            report::render_trace(&a.trace),
            report::render_trace(&b.trace)
        );
        assert_eq!(json_lines(&a), json_lines(&b), "seed {seed}");
        assert!(a.trace.len() > 100);
        // A sweep runs without a trace; that must not change the run.
        let sc = common::scenario(PATH);
        let plan = Plan::build(&sc, seed, None, &Reduction::default()).unwrap();
        let untraced = run_plan(&plan, Backend::Symbolic, false);
        assert_eq!(untraced.trace_hash, a.trace_hash, "seed {seed}");
        assert_eq!(untraced.events, a.events);
        assert!(untraced.trace.is_empty());
        // Nor does keeping no trace hash (a sweep's seed that finds nothing).
        let unhashed = kvsim_sim::run_plan_unhashed(&plan);
        assert!(a.trace_hash.is_some() && unhashed.trace_hash.is_none());
        assert_eq!(unhashed.events, a.events, "seed {seed}");
        assert_eq!(unhashed.findings, a.findings, "seed {seed}");
        assert_eq!(unhashed.replies, a.replies, "seed {seed}");
        assert_eq!(unhashed.stats, a.stats, "seed {seed}");
    }
    // Different seeds draw different runs.
    assert_ne!(traced(1, None).trace_hash, traced(2, None).trace_hash);
}

#[test]
fn a_failing_seed_replays_to_the_same_first_violation() {
    let sc = common::scenario(PATH);
    let s = run_sweep(
        &sc,
        PATH,
        &SweepOptions {
            seeds: SeedRange { start: 0, end: 20 },
            bugs: Some(BugSet::INCIDENT),
            jobs: Some(2),
            ..SweepOptions::default()
        },
    )
    .unwrap();
    assert!(s.failing_seeds > 0);
    for f in &s.failures {
        let r = replay::replay(
            &sc,
            PATH,
            &ReplayOptions {
                seed: f.seed,
                bugs: Some(BugSet::INCIDENT),
                reduction: Reduction::default(),
                backend: Backend::Symbolic,
                full_trace: false,
            },
            true,
        )
        .unwrap();
        let first = r.outcome.first().expect("the replay fails too");
        assert_eq!(first.violation.invariant.to_string(), f.invariant);
        assert_eq!(first.violation.detail, f.detail);
        assert_eq!(first.at_ns, f.at_ns);
        assert_eq!(report::trace_hash(r.outcome.trace_hash), f.trace_hash);
        assert_eq!(r.deterministic, Some(true));
        assert!(r.text.contains(&f.replay), "{}", r.text);
    }
}

/// The report of the first failing seed of the incident sweep, pinned. It must stay
/// short enough to read: the draw, the first violation, a causal trace of tens of
/// lines, and the command that replays it.
#[test]
fn failure_report_snapshot() {
    let out = traced(0, Some(BugSet::INCIDENT));
    let text = report::failure_report(&out, PATH).expect("seed 0 fails with the incident bugs");
    let lines = text.lines().count();
    assert!((15..=90).contains(&lines), "{lines} lines:\n{text}");
    assert!(text.contains("kvsim replay scenarios/mixed-faults.toml --seed 0 --bugs"));
    insta::assert_snapshot!("incident_seed0_report", text);
}

#[test]
fn shrinking_keeps_the_invariant_and_replays() {
    let sc = common::scenario(PATH);
    let s = shrink::shrink(&sc, 0, Some(BugSet::INCIDENT), None, 400)
        .unwrap()
        .expect("seed 0 fails");
    println!("{}", s.summary());
    let plan = &s.outcome.plan;
    assert!(plan.requests.len() < s.requests_before, "{}", s.summary());
    assert!(plan.requests.len() <= 4, "{}", s.summary());
    assert!(s
        .outcome
        .findings
        .iter()
        .any(|f| f.violation.invariant == s.target));
    // The reduction round-trips through its command-line form and replays the same run.
    let spec = s.reduction.to_string();
    let again = Reduction::parse(&spec).unwrap();
    assert_eq!(again, s.reduction);
    let replayed = run_plan(
        &Plan::build(&sc, 0, Some(BugSet::INCIDENT), &again).unwrap(),
        Backend::Symbolic,
        false,
    );
    assert_eq!(replayed.trace_hash, s.outcome.trace_hash);
    let rep = report::failure_report(&s.outcome, PATH).unwrap();
    assert!(rep.contains("--reduce '"), "{rep}");
}

#[test]
fn trace_json_is_one_object_per_line() {
    let out = traced(3, None);
    let dir = std::env::temp_dir().join(format!("kvsim-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    replay::write_trace_json(&out.header, &out.trace, &path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    let mut last = 0u64;
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "header");
    assert_eq!(first["schema_version"], kvsim_oracle::SCHEMA_VERSION);
    for line in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let at = v["at_ns"].as_u64().unwrap();
        assert!(at >= last, "time never goes back");
        last = at;
        assert!(v["seq"].is_u64());
        let ty = v["type"].as_str().unwrap().to_string();
        // No key appears twice (serde_json keeps the last one silently).
        let keys = line.matches("\":").count();
        assert_eq!(keys, count_keys(&v), "{line}");
        if ty == "engine" {
            kinds.insert(format!("engine:{}", v["event"].as_str().unwrap_or("?")));
        }
        kinds.insert(ty);
    }
    assert_eq!(text.lines().count(), out.trace.len() + 1);
    for k in [
        "submit",
        "send",
        "deliver",
        "timer_set",
        "timer_fire",
        "engine",
        "response",
    ] {
        assert!(kinds.contains(k), "no `{k}` entries: {kinds:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Keys in a JSON value, nested objects included.
fn count_keys(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(m) => m.len() + m.values().map(count_keys).sum::<usize>(),
        serde_json::Value::Array(a) => a.iter().map(count_keys).sum(),
        _ => 0,
    }
}

/// A use-after-free told as a story: a client aborts mid-transfer, decode frees its
/// pages at once (`decode-release-immediate`), and a chunk still on the wire arrives.
#[test]
fn use_after_free_report_snapshot() {
    let path = "scenarios/disconnect-mid-transfer.toml";
    let sc = common::scenario(path);
    let bugs = BugSet::parse("decode-release-immediate").unwrap();
    let plan = Plan::build(&sc, 0, Some(bugs), &Reduction::default()).unwrap();
    let out = run_plan(&plan, Backend::Symbolic, true);
    let text = report::failure_report(&out, path).expect("seed 0 fails");
    assert!(text.contains("S2 (no write after free"), "{text}");
    insta::assert_snapshot!("use_after_free_seed0_report", text);
}

/// `sweep --audit` runs its seeds unhashed, as the plain sweep does: the records it
/// keeps carry the same trace hashes (filled in by the kept seeds' second run), and a
/// seed's hash is never missing from a kept record.
#[test]
fn an_audited_sweep_keeps_the_same_records_and_hashes() {
    let sc = common::scenario(PATH);
    let sweep = |audit: bool| {
        run_sweep(
            &sc,
            PATH,
            &SweepOptions {
                seeds: SeedRange { start: 0, end: 12 },
                bugs: Some(BugSet::INCIDENT),
                jobs: Some(1),
                audit,
                ..SweepOptions::default()
            },
        )
        .unwrap()
    };
    let (plain, audited) = (sweep(false), sweep(true));
    assert_eq!(audited.audited, 12, "every seed audited");
    assert!(audited.audit_mismatches.is_empty());
    assert!(!plain.failures.is_empty(), "the incident bugs are found");
    let hashes = |s: &kvsim_sim::sweep::SweepSummary| {
        s.failures
            .iter()
            .map(|f| (f.seed, f.trace_hash.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(hashes(&plain), hashes(&audited));
    assert!(audited.failures.iter().all(|f| !f.trace_hash.is_empty()));
}
