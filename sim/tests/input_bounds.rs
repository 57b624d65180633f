//! Scenario input the loader must refuse with the field and its bound, never a
//! panic or an allocation the machine cannot hold (issue 14): every duration at
//! u64::MAX, sizes at and beyond the engine's limits, pools at the validator's own
//! maximum, runs of hours, runs that check nothing. A value at its bound still
//! builds a plan and runs without overflow.

use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::{Scenario, ScenarioError, MAX_TIME_MS};
use kvsim_sim::sweep::{SeedRange, Shard, SweepSummary};
use kvsim_sim::{run_plan, Backend};
use std::collections::BTreeMap;

const BASE: &str = r#"
name = "bounds"
[topology]
prefill_pool_pages = [64]
decode_pool_pages = [64]
[[requests]]
tenant = 1
prompt_len = 100
max_new_tokens = 2
"#;

/// `BASE` with `extra` TOML inserted at the top (before any table), or appended.
fn with(top: &str, tail: &str) -> String {
    format!("{top}\n{BASE}\n{tail}")
}

fn err(text: &str) -> String {
    match Scenario::parse(text, "t.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const MAX: u64 = u64::MAX;

/// Every time field of a scenario, as TOML that sets it to `v`, and the name the
/// error must give.
fn time_fields(v: u64) -> Vec<(String, &'static str)> {
    let engine = |k: &str| format!("[engine]\n{k} = {v}");
    let mut out = vec![
        (engine("timeouts.bootstrap_ns"), "timeouts.bootstrap_ns"),
        (engine("timeouts.waiting_ns"), "timeouts.waiting_ns"),
        (engine("timeouts.drain_retry_ns"), "timeouts.drain_retry_ns"),
        (engine("timeouts.request_ns"), "timeouts.request_ns"),
        (
            engine("latencies.prefill_forward_ns"),
            "latencies.prefill_forward_ns",
        ),
        (
            engine("latencies.decode_step_ns"),
            "latencies.decode_step_ns",
        ),
    ];
    for (table, key, name) in [
        ("network", "latency_us", "network.latency_us"),
        (
            "faults",
            "delay = { permille = 10, max_ms = V }",
            "faults.delay.max_ms",
        ),
        ("faults", "reorder_jitter_us", "faults.reorder_jitter_us"),
        (
            "faults",
            "partition = { count = 1, max_ms = V }",
            "faults.partition.max_ms",
        ),
        (
            "faults",
            "slow_write = { permille = 10, max_ms = V }",
            "faults.slow_write.max_ms",
        ),
        (
            "faults",
            "late_write = { permille = 10, max_ms = V }",
            "faults.late_write.max_ms",
        ),
        (
            "faults",
            "crash = { count = 1, max_ms = V }",
            "faults.crash.max_ms",
        ),
        (
            "faults",
            "short_timeouts_min_ms",
            "faults.short_timeouts_min_ms",
        ),
        ("phases", "safety_ms", "phases.safety_ms"),
        ("phases", "liveness_ms", "phases.liveness_ms"),
        ("run", "max_time_ms", "run.max_time_ms"),
        ("workload", "arrival_ms", "workload.arrival_ms"),
    ] {
        let line = if key.contains('V') {
            key.replace('V', &v.to_string())
        } else {
            format!("{key} = {v}")
        };
        out.push((format!("[{table}]\n{line}"), name));
    }
    out
}

#[test]
fn every_time_field_at_u64_max_is_refused_by_name() {
    let fields = time_fields(MAX);
    assert!(fields.len() >= 18);
    for (toml, name) in fields {
        let e = err(&with("", &toml));
        assert!(e.contains(name), "{name}: {e}");
        assert!(e.contains("at most"), "{name}: {e}");
    }
    // The per-request times, and their sum over the copies of a request.
    for (line, name) in [
        ("at_us", "requests[0].at_us"),
        ("every_us", "requests[0].every_us"),
        ("cancel_after_us", "requests[0].cancel_after_us"),
        ("cancel_delay_us", "requests[0].cancel_delay_us"),
    ] {
        let e = err(&format!("{BASE}{line} = {MAX}\n"));
        assert!(e.contains(name), "{name}: {e}");
    }
    let e = err(&format!(
        "{BASE}repeat = 60000\nevery_us = {}\n",
        MAX_TIME_MS
    ));
    assert!(e.contains("requests[0].every_us"), "{e}");
}

#[test]
fn every_time_field_at_its_bound_builds_and_runs() {
    // Durations at the bound: plans and runs do their arithmetic without overflow.
    let ms = MAX_TIME_MS;
    let text = format!(
        r#"
name = "at-bound"
[engine.timeouts]
bootstrap_ns = {ns}
waiting_ns = {ns}
drain_retry_ns = {ns}
request_ns = {ns}
[engine.latencies]
prefill_forward_ns = {ns}
decode_step_ns = {ns}
[network]
latency_us = {us}
[workload]
requests = 4
arrival_ms = {ms}
[faults]
delay = {{ permille = 1000, max_ms = {ms} }}
reorder_jitter_us = {us}
partition = {{ count = 2, max_ms = {ms} }}
slow_write = {{ permille = 1000, max_ms = {ms} }}
late_write = {{ permille = 1000, max_ms = {ms} }}
crash = {{ count = 2, max_ms = {ms} }}
short_timeouts_min_ms = {ms}
[swarm]
[phases]
safety_ms = {ms}
liveness_ms = {ms}
[run]
max_time_ms = {ms}
max_events = 20000
"#,
        ns = ms * 1_000_000,
        us = ms * 1000,
    );
    let sc = Scenario::parse(&text, "t.toml").expect("at the bound is accepted");
    for seed in 0..8 {
        let plan = Plan::build(&sc, seed, None, &Reduction::default()).expect("plan");
        let out = run_plan(&plan, Backend::Symbolic, false);
        assert!(out.events <= 20_000 + 1);
    }
}

#[test]
fn sizes_beyond_what_the_machine_holds_are_refused_with_the_number() {
    // The router's room table (a 240 GB allocation before).
    let e = err(&with("", "[engine]\nmax_rooms = 4294967295"));
    assert!(e.contains("max_rooms") && e.contains("65536"), "{e}");
    for (k, name) in [
        ("max_queue", "max_queue"),
        ("max_batch", "max_batch"),
        ("chunk_pages", "chunk_pages"),
        ("max_new_tokens_limit", "max_new_tokens_limit"),
        ("timeouts.drain_retries", "drain_retries"),
    ] {
        let e = err(&with("", &format!("[engine]\n{k} = 4294967295")));
        assert!(e.contains(name) && e.contains("at most"), "{k}: {e}");
    }
    // Pools at the validator's own per-pool maximum: the KV memory is computed and
    // refused with its size.
    let big = BASE.replace("[64]", "[16777216]");
    let e = err(&big);
    assert!(
        e.contains("MiB of KV memory") && e.contains("budget"),
        "{e}"
    );
    // A swarm that could draw such a pool, or an oversized room table.
    let sw = "name = \"s\"\n[workload]\nrequests = 1\n[swarm]\n";
    let e = err(&format!(
        "{sw}pool_pages = [1, 16777216]\ndecode_nodes = [1, 64]\n"
    ));
    assert!(e.contains("MiB of KV memory"), "{e}");
    let e = err(&format!("{sw}max_rooms = [4, 4294967295]\n"));
    assert!(e.contains("swarm.max_rooms"), "{e}");
    // The host backend's pages are larger: a pool the symbolic backend holds can be
    // refused for it.
    let host = Scenario::parse(&BASE.replace("[64]", "[400000]"), "t.toml").expect("symbolic fits");
    assert!(host.check_memory(false).is_ok());
    assert!(matches!(
        host.check_memory(true),
        Err(ScenarioError::TooMuchMemory { .. })
    ));
}

#[test]
fn hours_of_work_are_named_before_the_run() {
    let text = BASE
        .replace("prompt_len = 100", "prompt_len = 16777216\nrepeat = 65000")
        .replace("[64]", "[262144]");
    let sc = Scenario::parse(&text, "t.toml").expect("every field in range");
    let e = sc.check_cost().unwrap_err().to_string();
    assert!(
        e.contains("--allow-expensive") && e.contains("65000 requests"),
        "{e}"
    );
    let cheap = Scenario::parse(BASE, "t.toml").expect("base");
    assert!(cheap.check_cost().is_ok());
}

#[test]
fn runs_that_check_nothing_and_misnamed_fields() {
    // No request at all.
    let e = err("name = \"t\"\n[workload]\nrequests = 0\n[swarm]\n");
    assert!(e.contains("no request"), "{e}");
    // No simulated time: bad input, not a liveness violation.
    let e = err(&with("", "[run]\nmax_time_ms = 0"));
    assert!(e.contains("run.max_time_ms"), "{e}");
    // A listed topology under a swarm would be silently ignored.
    let e = err(&format!("{BASE}[swarm]\n"));
    assert!(e.contains("topology"), "{e}");
    // The field of a zero pool, by its name in the file.
    let e = err(&BASE.replace("decode_pool_pages = [64]", "decode_pool_pages = [64, 0]"));
    assert!(e.contains("topology.decode_pool_pages[1]"), "{e}");
    // A config error is said once, not again as its own source.
    let sc = Scenario::parse(&with("", "[engine]\nchunk_pages = 0"), "t.toml").unwrap_err();
    assert!(std::error::Error::source(&sc).is_none());
    assert_eq!(
        sc.to_string().matches("must be at least").count(),
        1,
        "{sc}"
    );
}

#[test]
fn merged_counters_saturate() {
    let part = |k: u32| SweepSummary {
        scenario: "t".into(),
        path: "t.toml".into(),
        bugs: "none".into(),
        seeds: SeedRange { start: 0, end: 4 },
        shards: vec![Shard { k, n: 2 }],
        seeds_planned: 2,
        seeds_run: 2,
        sim_ns: u64::MAX,
        events: u64::MAX,
        wall_s: 1.0,
        jobs: 1,
        failing_seeds: 1,
        violations: BTreeMap::from([("S3".to_string(), u64::MAX)]),
        failures: Vec::new(),
        detected_seeds: 1,
        detections: BTreeMap::from([("S4".to_string(), u64::MAX)]),
        detected: Vec::new(),
        nondeterministic: Vec::new(),
        audit_mismatches: Vec::new(),
        audited: 0,
        stopped: None,
        resume_from: None,
        coverage: Default::default(),
    };
    let m = SweepSummary::merge(&[part(1), part(2)]).expect("merges");
    assert_eq!(m.events, u64::MAX);
    assert_eq!(m.sim_ns, u64::MAX);
    assert_eq!(m.violations["S3"], u64::MAX);
    assert_eq!(m.detections["S4"], u64::MAX);
    let _ = m.render();
}

#[test]
fn extra_range_elements_are_refused_not_ignored() {
    for (table, key) in [
        ("workload", "prompt_len = [1, 512, 9]"),
        ("workload", "max_new_tokens = [1, 2, 3]"),
        ("swarm", "prefill_nodes = [1, 2, 3]"),
        ("swarm", "decode_nodes = [1]"),
        ("swarm", "pool_pages = [64, 128, 256]"),
        ("swarm", "chunk_pages = [1, 2, 3]"),
        ("swarm", "max_inflight_chunks = [1, 2, 3]"),
        ("swarm", "max_rooms = [4, 8, 16]"),
        ("swarm", "max_batch = [1, 2, 3]"),
    ] {
        let mut text = String::from("name = \"t\"\n[workload]\nrequests = 2\n");
        if table == "workload" {
            text.push_str(key);
            text.push_str("\n[swarm]\n");
        } else {
            text.push_str("[swarm]\n");
            text.push_str(key);
            text.push('\n');
        }
        let e = err(&text);
        assert!(e.contains("expected exactly 2 values"), "{key}: {e}");
    }
}

/// The router policy is validated where it is read: an unknown name is refused naming
/// the field and the policies there are, a policy listed twice in `routers` is refused
/// naming `routers`, and a listed policy is what the seeds draw.
#[test]
fn a_router_policy_is_a_known_name_and_routers_lists_each_once() {
    let e = err(&with("", "[engine]\nrouter = \"nginx\""));
    assert!(
        e.contains("router") && e.contains("careful") && e.contains("sglang-router"),
        "{e}"
    );
    let e = err(&with("routers = [\"careful\", \"nope\"]", ""));
    assert!(e.contains("routers") && e.contains("sglang-router"), "{e}");
    let e = err(&with("routers = [\"careful\", \"careful\"]", ""));
    assert!(e.contains("`routers`") && e.contains("twice"), "{e}");
    let fits = "[engine]\ncontext_len = 2048";
    let sc = Scenario::parse(&with("routers = [\"sglang-router\"]", fits), "t.toml").unwrap();
    for seed in 0..4 {
        let plan = Plan::build(&sc, seed, None, &Reduction::default()).unwrap();
        assert_eq!(plan.engine.router, kvsim_engine::RouterPolicy::SglangRouter);
    }
    let both = Scenario::parse(
        &with("routers = [\"careful\", \"sglang-router\"]", fits),
        "t.toml",
    )
    .unwrap();
    let drawn: std::collections::BTreeSet<_> = (0..16)
        .map(|s| {
            Plan::build(&both, s, None, &Reduction::default())
                .unwrap()
                .engine
                .router
        })
        .collect();
    assert_eq!(drawn.len(), 2, "the seeds draw both");
}

/// `reach` names paths of the closed vocabulary (`kvsim list paths`), each once: an
/// unknown name is refused naming the field and listing the known names, a name
/// listed twice is refused naming it, and a known list parses.
#[test]
fn reach_lists_known_paths_each_once() {
    let e = err(&with("reach = [\"quarantine\", \"drain-late\"]", ""));
    assert!(
        e.contains("scenario field `reach[1]`") && e.contains("unknown path `drain-late`"),
        "{e}"
    );
    for p in kvsim_sim::reach::ReachPath::ALL {
        assert!(e.contains(p.name()), "the error lists `{p}`: {e}");
    }
    let e = err(&with("reach = [\"quarantine\", \"quarantine\"]", ""));
    assert!(
        e.contains("`reach[1]`") && e.contains("lists `quarantine` twice"),
        "{e}"
    );
    let e = err(&with("reach = \"quarantine\"", ""));
    assert!(e.contains("reach"), "{e}");
    let sc = Scenario::parse(
        &with("reach = [\"drain-after-timeout\", \"retry-new-room\"]", ""),
        "t.toml",
    )
    .unwrap();
    assert_eq!(sc.reach, ["drain-after-timeout", "retry-new-room"]);
    assert!(Scenario::parse(&with("", ""), "t.toml")
        .unwrap()
        .reach
        .is_empty());
}
