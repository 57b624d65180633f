//! The default suite's rows for the deployments beside SGLang's plain push under
//! kvsim's router: vLLM's pull protocol under `vllm-router`, SGLang's worker mode
//! (each node behind its worker front under the `sglang-router` policy), KV over
//! NIXL, and rooms with several sender ranks. Each row sweeps the deployment's
//! scenario on the defended engine (clean, every declared path reached) and
//! model-checks it, and shows that the tools see a bug there.

use crate::suite_row::Row;
use anyhow::Result;
use kvsim_engine::bugs::BugSet;
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, CheckReport, ModelSpec};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions, SweepSummary};
use std::time::Instant;

/// vLLM's pull protocol under vllm-router (leases, heartbeats, READs, faults).
pub const VLLM_PULL: &str = include_str!("../scenarios/vllm-pull.toml");

/// Nodes behind SGLang worker fronts under the sglang-router policy, with faults.
pub const WORKER_MODE: &str = include_str!("../scenarios/worker-mode.toml");

/// KV over NIXL: stale metadata landing in a restarted decode, stopped peers.
pub const NIXL: &str = include_str!("../scenarios/nixl.toml");

/// vLLM's pull with three sender ranks a room (issue 37, class 1).
pub const MULTI_RANK: &str = include_str!("../scenarios/multi-rank.toml");

/// Sweep seeds `0..seeds` of a compiled-in scenario, stopping at the first failure
/// when `stop_at_first`.
fn sweep(
    text: &str,
    path: &str,
    seeds: u64,
    bugs: Option<BugSet>,
    stop_at_first: bool,
) -> Result<SweepSummary> {
    sweep_of(
        &Scenario::parse(text, path)?,
        path,
        seeds,
        bugs,
        stop_at_first,
    )
}

/// [`sweep`] of a scenario already parsed (and perhaps changed).
fn sweep_of(
    sc: &Scenario,
    path: &str,
    seeds: u64,
    bugs: Option<BugSet>,
    stop_at_first: bool,
) -> Result<SweepSummary> {
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        bugs,
        stop_at_first,
        ..Default::default()
    };
    Ok(run_sweep(sc, path, &opts)?)
}

/// Exhaust a standard model on two threads.
fn model(spec: ModelSpec) -> Result<CheckReport> {
    let options = CheckOptions {
        threads: 2,
        ..CheckOptions::default()
    };
    Ok(check(spec, &options)?)
}

/// "clean" or the failing seeds and first violations, with an unreached declared path.
fn verdict(s: &SweepSummary) -> String {
    let mut out = if s.clean() {
        "clean".to_string()
    } else {
        format!("{} failing seeds: {:?}", s.failing_seeds, s.violations)
    };
    if let Some(why) = s.reach_failure() {
        out.push_str(&format!(" ({why})"));
    }
    out
}

/// A model's verdict in a few words: its state count and whether it is clean.
fn model_words(m: &CheckReport) -> String {
    format!(
        "{} states, {}",
        m.unique,
        if m.violated() { "VIOLATED" } else { "clean" }
    )
}

/// vLLM's pull under vllm-router: 500 seeds of `vllm-pull.toml` clean with every
/// declared path reached (a lease expiring among them); the model `vllm-pull` exhausted
/// clean; `vllm-lease-race` (the lease runs out while the READ is on its way,
/// aws-samples/aws-do-eks#84) found by the leases checker as S2.
pub fn vllm_pull() -> Result<Row> {
    let t = Instant::now();
    let s = sweep(VLLM_PULL, "scenarios/vllm-pull.toml", 500, None, false)?;
    let clean = model(ModelSpec::vllm_pull())?;
    let race = model(ModelSpec::vllm_lease_race())?;
    let found = matches!(race.status(names::S2), Some(Verdict::Violated { .. }));
    let ok = s.clean()
        && s.seeds_run == 500
        && s.reach_failure().is_none()
        && clean.complete
        && !clean.violated()
        && found;
    Ok(Row {
        check:
            "vLLM pull under vllm-router (sweep vllm-pull.toml, models vllm-pull, vllm-lease-race)"
                .into(),
        expected: "clean; a READ after its lease expired is found (S2)".into(),
        observed: format!(
            "sweep: {} seeds, {}; model vllm-pull: {}; vllm-lease-race: {}",
            s.seeds_run,
            verdict(&s),
            model_words(&clean),
            if found { "S2 found" } else { "S2 NOT found" }
        ),
        ok,
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// What a deployment's row ran: a clean sweep of `seeds` seeds, a sweep that must
/// find a violation (`caught`, named `caught_as`), and a model that must be clean.
struct Judged {
    clean: SweepSummary,
    seeds: u64,
    caught_as: &'static str,
    caught: SweepSummary,
    model_name: &'static str,
    model: CheckReport,
}

/// The row of `j`: ok when the clean sweep ran every seed clean with every declared
/// path reached, the other sweep found a violation and the model is exhausted clean.
fn judged_row(check: &str, expected: &str, j: &Judged, t: Instant) -> Row {
    let first = j.caught.failures.first();
    let ok = j.clean.clean()
        && j.clean.seeds_run == j.seeds
        && j.clean.reach_failure().is_none()
        && first.is_some()
        && j.model.complete
        && !j.model.violated();
    Row {
        check: check.into(),
        expected: expected.into(),
        observed: format!(
            "sweep: {} seeds, {}; {}: {}; model {}: {}",
            j.clean.seeds_run,
            verdict(&j.clean),
            j.caught_as,
            first.map_or_else(
                || format!("no violation in {} seeds", j.caught.seeds_run),
                |f| format!("seed {} breaks {}", f.seed, f.invariant)
            ),
            j.model_name,
            model_words(&j.model)
        ),
        ok,
        wall_s: t.elapsed().as_secs_f64(),
    }
}

/// SGLang worker mode: 100 seeds of `worker-mode.toml` clean on the defended engine,
/// the incident's bugs caught within 20 seeds behind the fronts, and the model
/// `worker-front` exhausted clean.
pub fn worker_mode() -> Result<Row> {
    let t = Instant::now();
    let path = "scenarios/worker-mode.toml";
    let j = Judged {
        clean: sweep(WORKER_MODE, path, 100, None, false)?,
        seeds: 100,
        caught_as: "incident bugs",
        caught: sweep(WORKER_MODE, path, 20, Some(BugSet::INCIDENT), true)?,
        model_name: "worker-front",
        model: model(ModelSpec::worker_front())?,
    };
    Ok(judged_row(
        "SGLang worker mode behind fronts (sweep worker-mode.toml, model worker-front)",
        "clean; the incident's bugs caught behind the fronts",
        &j,
        t,
    ))
}

/// KV over NIXL (nixl-cu12 1.5.1's measured row: no landing gate, writes wait for a
/// stopped receiver, a write through stale metadata lands): 200 seeds of `nixl.toml`
/// clean with every declared path reached (a stale landing among them), the model
/// `nixl-race` exhausted clean, and with the page tags (4a) off a stale landing is
/// read within 50 seeds: the defense that stands where NIXL lands what RDMA refuses.
pub fn nixl() -> Result<Row> {
    let t = Instant::now();
    let path = "scenarios/nixl.toml";
    let mut untagged = Scenario::parse(NIXL, path)?;
    untagged.engine.defenses.page_tags = false;
    let j = Judged {
        clean: sweep(NIXL, path, 200, None, false)?,
        seeds: 200,
        caught_as: "page tags off",
        caught: sweep_of(&untagged, path, 50, None, true)?,
        model_name: "nixl-race",
        model: model(ModelSpec::nixl_race())?,
    };
    Ok(judged_row(
        "KV over NIXL (sweep nixl.toml, model nixl-race)",
        "clean; with page tags off a stale landing is read",
        &j,
        t,
    ))
}

/// Rooms with several sender ranks under vLLM's pull (issue 37, class 1): 200 seeds
/// of `multi-rank.toml` clean with every declared path reached, the model
/// `vllm-ranks` exhausted clean, and vLLM #56104's first-failed-handle-frees caught
/// within 20 seeds.
pub fn multi_rank() -> Result<Row> {
    let t = Instant::now();
    let path = "scenarios/multi-rank.toml";
    let bug = BugSet::NONE.with(kvsim_engine::bugs::Bug::FirstFailedHandleFrees);
    let j = Judged {
        clean: sweep(MULTI_RANK, path, 200, None, false)?,
        seeds: 200,
        caught_as: "first-failed-handle-frees",
        caught: sweep(MULTI_RANK, path, 20, Some(bug), true)?,
        model_name: "vllm-ranks",
        model: model(ModelSpec::vllm_ranks())?,
    };
    Ok(judged_row(
        "rooms with several ranks (sweep multi-rank.toml, model vllm-ranks)",
        "clean; vLLM #56104's early free caught",
        &j,
        t,
    ))
}
