//! The bug-detection matrix: every historical bug switch, hunted by both tools.
//!
//! For each switch alone (and the incident pair together) the simulator sweeps the
//! scenario that exercises it, stopping at the first violation, and the model checker
//! searches the standard models in turn until one breaks. The defended engine must
//! show nothing in either. A second table turns each defense off alone, and the
//! page-tag check on and off under each switch, to show which defense is load-bearing.
//!
//! This module runs things and collects numbers; `matrix_report.rs` formats them.

use crate::matrix_report::{DefenseRow, Matrix, MatrixRow, McCell, SimCell};
use crate::LabError;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::Defenses;
use kvsim_models::{check, CheckOptions, ModelSpec, Verdict};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};
use std::time::Instant;

/// Scenario files compiled in, so the matrix runs from any directory.
pub const SCENARIOS: &[(&str, &str)] = &[
    (
        "scenarios/mixed-faults.toml",
        include_str!("../../scenarios/mixed-faults.toml"),
    ),
    (
        "scenarios/abort-storm.toml",
        include_str!("../../scenarios/abort-storm.toml"),
    ),
    (
        "scenarios/disconnect-mid-transfer.toml",
        include_str!("../../scenarios/disconnect-mid-transfer.toml"),
    ),
    (
        "scenarios/transfer-failures.toml",
        include_str!("../../scenarios/transfer-failures.toml"),
    ),
    (
        "scenarios/partition.toml",
        include_str!("../../scenarios/partition.toml"),
    ),
    (
        "scenarios/client-disconnects.toml",
        include_str!("../../scenarios/client-disconnects.toml"),
    ),
    (
        "scenarios/glm53-incident.toml",
        include_str!("../../scenarios/glm53-incident.toml"),
    ),
    (
        "scenarios/glm53-truncate.toml",
        include_str!("../../scenarios/glm53-truncate.toml"),
    ),
    (
        "scenarios/data-faults.toml",
        include_str!("../../scenarios/data-faults.toml"),
    ),
    (
        "scenarios/prefix-hit.toml",
        include_str!("../../scenarios/prefix-hit.toml"),
    ),
    (
        "scenarios/client-rooms.toml",
        include_str!("../../scenarios/client-rooms.toml"),
    ),
    (
        "scenarios/multi-rank.toml",
        include_str!("../../scenarios/multi-rank.toml"),
    ),
    (
        "scenarios/vllm-pull.toml",
        include_str!("../../scenarios/vllm-pull.toml"),
    ),
    (
        "scenarios/failed-room.toml",
        include_str!("../../scenarios/failed-room.toml"),
    ),
];

/// The switches of rooms with several sender ranks (issue 37, class 1): the count of
/// a pull's per-rank READ handles (`nodes/decode/handles.rs`).
pub const RANK_SWITCHES: [Bug; 4] = [
    Bug::FirstFailedHandleFrees,
    Bug::FailedSliceCountedTwice,
    Bug::RejectedScatterReturnsOk,
    Bug::FailedHandleSkipped,
];

/// Is `bugs` one of the [`RANK_SWITCHES`] alone?
fn rank_switch(bugs: BugSet) -> bool {
    RANK_SWITCHES.iter().any(|b| bugs == BugSet::NONE.with(*b))
}

/// The switches of vLLM's pull protocol (its NIXL connector's prefill and decode
/// nodes): hunted in `scenarios/vllm-pull.toml` and the `vllm-*` models.
pub const VLLM_SWITCHES: [Bug; 2] = [Bug::LeaseIgnoresHeartbeat, Bug::ReadErrorLeavesPending];

fn is_vllm_switch(bugs: BugSet) -> bool {
    VLLM_SWITCHES.iter().any(|b| bugs == BugSet::NONE.with(*b))
}

/// Which scenario hunts which switch (the one whose faults reach its code path).
pub fn scenario_for(bugs: BugSet) -> &'static str {
    let only = |b: Bug| bugs == BugSet::NONE.with(b);
    if is_vllm_switch(bugs) {
        "scenarios/vllm-pull.toml"
    } else if only(Bug::SuccessOverwritesAbort) || only(Bug::RetryReusesRoom) {
        "scenarios/abort-storm.toml"
    } else if only(Bug::DecodeReleaseImmediate) || only(Bug::PrefillReleaseBeforeDrain) {
        "scenarios/disconnect-mid-transfer.toml"
    } else if only(Bug::FailedSendReportsDrained) {
        "scenarios/transfer-failures.toml"
    } else if only(Bug::AckIgnoresGeneration) {
        "scenarios/partition.toml"
    } else if only(Bug::RouterCancelsOneHalf) {
        "scenarios/client-disconnects.toml"
    } else if only(Bug::SkipPreflight) {
        "scenarios/glm53-incident.toml"
    } else if only(Bug::ChunkIndexByPosition) {
        // Only a prefix hit off the chunk grid skews a chunk's index.
        "scenarios/prefix-hit.toml"
    } else if only(Bug::DuplicateRoomJoinsLive) {
        "scenarios/client-rooms.toml"
    } else if rank_switch(bugs) {
        // Only a room with several ranks has sibling handles to count.
        "scenarios/multi-rank.toml"
    } else if only(Bug::PrefillDropsFailedPageList) {
        // Only behind the real gateway is decode left to hear of it from prefill.
        "scenarios/failed-room.toml"
    } else if only(Bug::NoLengthAgreement) {
        // Alone, the length check has nothing to catch unless something else makes the
        // halves disagree: prompt truncation at asymmetric limits does.
        "scenarios/glm53-truncate.toml"
    } else {
        "scenarios/mixed-faults.toml"
    }
}

/// The scenario a switch is swept in ([`scenario_for`]), as the sim column runs it.
/// `ack-ignores-generation` needs a room number reused while its earlier use still
/// waits for a drain ack: the careful router reuses the number it just freed (LIFO);
/// `sglang-router` draws a random free room (the real gateway's 63-bit rooms never
/// reuse one), where it is found on far fewer seeds. It is swept under the careful
/// router; `partition.toml` draws both for everything else. `retry-reuses-room` is a
/// switch of `sglang-router`'s retries (the careful router makes one attempt): it is
/// swept under that router.
pub fn load_for(bugs: BugSet) -> Result<Scenario, LabError> {
    let mut sc = load(scenario_for(bugs))?;
    if bugs == BugSet::NONE.with(Bug::AckIgnoresGeneration) {
        sc.routers = vec![kvsim_engine::RouterPolicy::Careful];
    }
    if bugs == BugSet::NONE.with(Bug::RetryReusesRoom) {
        sc.routers = vec![kvsim_engine::RouterPolicy::SglangRouter];
    }
    Ok(sc)
}

/// Why the models cannot reach `lease-ignores-heartbeat`: a heartbeat changes when a
/// lease runs out, not whether it may; the models' timers carry no time, so a renewed
/// and an unrenewed lease fire in the same orders (`vllm-lease-race` shows the
/// premature expiry itself, on the defended engine too).
const NO_LEASE_CLOCK: &str = "a heartbeat changes when a lease runs out, not whether: model timers carry no time (vllm-lease-race shows the premature expiry itself)";

/// Why the simulator cannot catch a switch, if it cannot by design.
pub fn sim_not_applicable(bugs: BugSet) -> Option<&'static str> {
    if bugs == BugSet::NONE.with(Bug::AbortAfterSuccess) {
        Some("safe (an abort always is): only availability suffers, and judging an error answer needs the model's fault book (a trace records no lost, duplicated or reordered message, no early timer)")
    } else {
        None
    }
}

/// Why the model checker cannot catch a switch, if it cannot by design.
pub fn mc_not_applicable(bugs: BugSet) -> Option<&'static str> {
    let only = |b: Bug| bugs == BugSet::NONE.with(b);
    if only(Bug::RouterCancelsOneHalf) {
        Some("liveness over time: decode's own waiting timer (300 s upstream) rescues it, and model timers carry no time")
    } else if only(Bug::SkipPreflight) {
        Some("a start-up config rule, not a runtime transition")
    } else if only(Bug::LeaseIgnoresHeartbeat) {
        Some(NO_LEASE_CLOCK)
    } else {
        None
    }
}

pub fn load(path: &str) -> Result<Scenario, LabError> {
    let text = scenario_text(path).ok_or_else(|| LabError::NoScenario(path.to_string()))?;
    Ok(Scenario::parse(text, path)?)
}

/// How hard to look.
#[derive(Clone, Debug)]
pub struct Budget {
    pub seeds: u64,
    /// Standard models to search, in order (the first violation ends the search).
    pub models: Vec<&'static str>,
    pub threads: usize,
    /// Also build the defenses table.
    pub defenses: bool,
}

impl Budget {
    /// What `kvsim bugs` runs by default.
    pub fn full(seeds: u64) -> Budget {
        Budget {
            seeds,
            models: vec!["handoff", "abort-race", "timeout-race", "crash-race"],
            threads: 2,
            defenses: true,
        }
    }
    /// The reduced pass of the default suite and `cargo test`.
    pub fn quick(seeds: u64) -> Budget {
        Budget {
            seeds,
            models: vec!["handoff-small", "abort-race-small", "crash-race-small"],
            threads: 1,
            defenses: false,
        }
    }
}

/// The sim column: sweep until the first violation (or the budget).
pub fn sim_cell(
    bugs: BugSet,
    seeds: u64,
    tweak: impl Fn(&mut Scenario),
) -> Result<SimCell, LabError> {
    let path = scenario_for(bugs);
    let mut sc = load_for(bugs)?;
    tweak(&mut sc);
    let t = Instant::now();
    if bugs.has(Bug::SkipPreflight) {
        return Ok(preflight_cell(sc, bugs, path, t));
    }
    // A scenario with an explicit workload runs the same way under every seed.
    let seeds = if path.contains("glm53") { 1 } else { seeds };
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        bugs: Some(bugs),
        stop_at_first: !bugs.is_empty(),
        stop_on_detection: true,
        ..SweepOptions::default()
    };
    let s = run_sweep(&sc, path, &opts)?;
    let baseline = defended_baseline(&sc, path, bugs, &opts)?;
    let first = s
        .failures
        .iter()
        .chain(&s.detected)
        .filter_map(|f| {
            f.invariants
                .iter()
                .find(|i| !baseline.contains(i))
                .map(|i| (f.seed, i.clone()))
        })
        .min_by_key(|(seed, _)| *seed);
    let scenario = match sc.routers.as_slice() {
        [only] => format!("{path} ({} router)", only.name()),
        _ => path.to_string(),
    };
    Ok(SimCell {
        scenario,
        seeds_run: first.as_ref().map_or(s.seeds_run, |(seed, _)| seed + 1),
        first_seed: first.as_ref().map(|(seed, _)| *seed),
        invariant: first.map(|(_, i)| i),
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// `skip-preflight`: the pre-flight rule is checked where it lives: start the
/// incident's unsafe pool without asking for it. The defended engine must refuse to
/// start.
fn preflight_cell(mut sc: Scenario, bugs: BugSet, path: &str, t: Instant) -> SimCell {
    sc.engine.allow_unsafe_pool = false;
    sc.engine.bugs = bugs;
    let started = kvsim_sim::run_scenario(&sc, &kvsim_sim::RunOptions::default()).is_ok();
    SimCell {
        scenario: format!("{path} (allow_unsafe_pool = false)"),
        seeds_run: 1,
        first_seed: started.then_some(sc.seed),
        invariant: started.then(|| "pre-flight".to_string()),
        wall_s: t.elapsed().as_secs_f64(),
    }
}

/// The invariants the defended engine already reports on a truncate scenario (the
/// engine refusing a mismatch it cannot prevent): a switch is credited only with what
/// the defended engine does not show. Empty elsewhere.
fn defended_baseline(
    sc: &Scenario,
    path: &str,
    bugs: BugSet,
    opts: &SweepOptions,
) -> Result<Vec<String>, LabError> {
    if bugs.is_empty() || !path.contains("truncate") {
        return Ok(Vec::new());
    }
    let base = SweepOptions {
        bugs: Some(BugSet::NONE),
        stop_at_first: false,
        ..opts.clone()
    };
    let b = run_sweep(sc, path, &base)?;
    Ok(b.failures
        .iter()
        .chain(&b.detected)
        .flat_map(|f| f.invariants.clone())
        .collect())
}

/// The standard models searched for a switch, in order: `models` with the abort-race
/// ones first for a switch on the abort, drain or failed-transfer paths (their faults
/// reach its code), as given otherwise; a switch of `sglang-router`'s retries is
/// searched in `retry-race-small` first, the model of that router (the others run the
/// careful router, which never retries); a switch of vLLM's nodes only in the vLLM
/// models (the only ones that run them).
pub fn model_order(bugs: BugSet, models: &[&'static str]) -> Vec<&'static str> {
    if is_vllm_switch(bugs) {
        // Only the vLLM models run vLLM's nodes.
        return vec!["vllm-pull", "vllm-crash"];
    }
    if bugs == BugSet::NONE.with(Bug::RetryReusesRoom) {
        let mut order = vec!["retry-race-small"];
        order.extend(models.iter().filter(|m| **m != "retry-race-small"));
        return order;
    }
    let abort_first = [
        Bug::SuccessOverwritesAbort,
        Bug::DecodeReleaseImmediate,
        Bug::PrefillReleaseBeforeDrain,
        Bug::FailedSendReportsDrained,
        Bug::FailOpenOnRecvError,
        Bug::AckIgnoresGeneration,
        Bug::NoLengthAgreement,
    ]
    .iter()
    .any(|b| bugs == BugSet::NONE.with(*b));
    if bugs == BugSet::NONE.with(Bug::ChunkIndexByPosition) {
        // Only a model with a prefix hit off the chunk grid reaches the skew.
        return vec!["prefix-hit"];
    }
    if rank_switch(bugs) {
        // Only a model with two READ handles a room has a sibling to count.
        return vec!["vllm-ranks"];
    }
    if bugs == BugSet::NONE.with(Bug::DuplicateRoomJoinsLive) {
        // Only a model with another party's start for a live room use reaches it.
        return vec!["client-rooms"];
    }
    if bugs == BugSet::NONE.with(Bug::PrefillDropsFailedPageList) {
        // Only a model whose run ends before decode's waiting timeout can tell that
        // decode waited for it (every other model fires it once nothing else can happen).
        return vec!["failed-room"];
    }
    let mut order = models.to_vec();
    if abort_first {
        order.sort_by_key(|m| !m.starts_with("abort-race"));
    }
    order
}

/// The text of a compiled-in scenario file (see [`SCENARIOS`]).
pub fn scenario_text(path: &str) -> Option<&'static str> {
    SCENARIOS.iter().find(|(p, _)| *p == path).map(|(_, t)| *t)
}

/// The model-checker column: the first standard model that breaks.
pub fn mc_cell(bugs: BugSet, budget: &Budget) -> Result<Result<McCell, String>, LabError> {
    if let Some(why) = mc_not_applicable(bugs) {
        return Ok(Err(why.to_string()));
    }
    let t = Instant::now();
    let mut states = 0u64;
    let order = model_order(bugs, &budget.models);
    for &name in &order {
        let spec = ModelSpec::standard(name)?.with_bugs(bugs);
        let opts = CheckOptions {
            threads: budget.threads,
            ..CheckOptions::default()
        };
        let report = check(spec, &opts)?;
        states += report.unique as u64;
        let violated = report.properties.iter().find_map(|p| match p.verdict {
            Verdict::Violated { steps } => Some((p.name, steps)),
            _ => None,
        });
        if let Some((property, steps)) = violated {
            let invariant = kvsim_models::check::invariant_of(property)
                .map_or_else(|| property.to_string(), |i| i.to_string());
            return Ok(Ok(McCell {
                model: name.to_string(),
                counterexample_len: Some(steps),
                states,
                invariant: Some(invariant),
                wall_s: t.elapsed().as_secs_f64(),
            }));
        }
    }
    Ok(Ok(McCell {
        model: budget.models.join("+"),
        counterexample_len: None,
        states,
        invariant: None,
        wall_s: t.elapsed().as_secs_f64(),
    }))
}

/// The rows to hunt: every switch alone, the incident pair, then the defended engine.
pub fn configurations() -> Vec<(String, BugSet, bool)> {
    let mut rows: Vec<(String, BugSet, bool)> = Bug::ALL
        .iter()
        .map(|b| (b.name().to_string(), BugSet::NONE.with(*b), false))
        .collect();
    rows.push((
        "incident pair (gate + length)".into(),
        BugSet::INCIDENT,
        false,
    ));
    rows.push(("default engine (no bugs)".into(), BugSet::NONE, true));
    rows
}

/// A defense switched off (or, for zero-on-free, on) in a scenario's config.
type DefenseToggle = fn(&mut Defenses);

fn defense_names() -> Vec<(&'static str, DefenseToggle)> {
    vec![
        ("admission check off", |d| d.admission_check = false),
        ("verify on completion off", |d| {
            d.verify_on_completion = false
        }),
        ("deferred release off", |d| d.deferred_release = false),
        ("page tags off", |d| d.page_tags = false),
        ("pre-flight off", |d| d.preflight = false),
        ("router cancels both off", |d| d.router_cancels_both = false),
        ("zero on free on", |d| d.zero_on_free = true),
    ]
}

/// What the harness reports for one configuration: every invariant any seed broke.
fn reported(
    bugs: BugSet,
    seeds: u64,
    tweak: impl Fn(&mut Scenario),
) -> Result<DefenseRow, LabError> {
    let path = scenario_for(bugs);
    let seeds = if path.contains("glm53") { 1 } else { seeds };
    let mut sc = load_for(bugs)?;
    tweak(&mut sc);
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        bugs: Some(bugs),
        keep_failures: usize::MAX,
        ..SweepOptions::default()
    };
    let s = run_sweep(&sc, path, &opts)?;
    let mut inv: Vec<String> = Vec::new();
    for f in s.failures.iter().chain(&s.detected) {
        for i in &f.invariants {
            if !inv.contains(i) {
                inv.push(i.clone());
            }
        }
    }
    inv.sort();
    Ok(DefenseRow {
        config: String::new(),
        bugs: bugs.to_string(),
        scenario: path.to_string(),
        invariants: inv,
        failing_seeds: s.failing_seeds,
        detected_seeds: s.detected_seeds,
        seeds_run: s.seeds_run,
    })
}

/// The defenses table.
pub fn defenses_table(seeds: u64) -> Result<Vec<DefenseRow>, LabError> {
    let mut rows = Vec::new();
    for (name, f) in defense_names() {
        let mut r = reported(BugSet::NONE, seeds, |sc| f(&mut sc.engine.defenses))?;
        r.config = name.to_string();
        rows.push(r);
    }
    for (label, bugs, baseline) in configurations() {
        if baseline || bugs.has(Bug::SkipPreflight) {
            continue;
        }
        rows.extend(tag_rows(&label, bugs, seeds)?);
    }
    Ok(rows)
}

/// The defenses table's two rows for one configuration: the page-tag check on, off.
pub fn tag_rows(label: &str, bugs: BugSet, seeds: u64) -> Result<Vec<DefenseRow>, LabError> {
    let mut rows = Vec::new();
    for tags in [true, false] {
        let mut r = reported(bugs, seeds, |sc| sc.engine.defenses.page_tags = tags)?;
        r.config = format!("page tags {}", if tags { "on" } else { "off" });
        r.bugs = label.to_string();
        rows.push(r);
    }
    Ok(rows)
}

/// Run the whole matrix.
pub fn run(
    budget: &Budget,
    command: &str,
    mut progress: impl FnMut(&str),
) -> Result<Matrix, LabError> {
    let mut rows = Vec::new();
    for (label, bugs, baseline) in configurations() {
        progress(&label);
        let sim = sim_cell(bugs, budget.seeds, |_| {})?;
        let mc = mc_cell(bugs, budget)?;
        rows.push(MatrixRow {
            label,
            sim,
            mc,
            baseline,
        });
    }
    let defenses = if budget.defenses {
        progress("defenses table");
        defenses_table(budget.seeds)?
    } else {
        Vec::new()
    };
    Ok(Matrix {
        rows,
        defenses,
        seed_budget: budget.seeds,
        command: command.to_string(),
    })
}
