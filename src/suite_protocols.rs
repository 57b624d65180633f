//! The default suite's rows for the deployments beside SGLang's plain push under
//! kvsim's router: vLLM's pull protocol under `vllm-router`, and SGLang's worker mode
//! (each node behind its worker front under the `sglang-router` policy). Each row
//! sweeps the deployment's scenario on the defended engine (clean, every declared path
//! reached) and model-checks it, and shows that the tools see a bug there.

use crate::suite::Row;
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

/// Sweep seeds `0..seeds` of a compiled-in scenario, stopping at the first failure
/// when `stop_at_first`.
fn sweep(
    text: &str,
    path: &str,
    seeds: u64,
    bugs: Option<BugSet>,
    stop_at_first: bool,
) -> Result<SweepSummary> {
    let sc = Scenario::parse(text, path)?;
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        bugs,
        stop_at_first,
        ..Default::default()
    };
    Ok(run_sweep(&sc, path, &opts)?)
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

/// SGLang worker mode: 100 seeds of `worker-mode.toml` clean on the defended engine,
/// the incident's bugs caught within 20 seeds behind the fronts, and the model
/// `worker-front` exhausted clean.
pub fn worker_mode() -> Result<Row> {
    let t = Instant::now();
    let path = "scenarios/worker-mode.toml";
    let s = sweep(WORKER_MODE, path, 100, None, false)?;
    let bugged = sweep(WORKER_MODE, path, 20, Some(BugSet::INCIDENT), true)?;
    let m = model(ModelSpec::worker_front())?;
    let first = bugged.failures.first();
    let caught = first.is_some_and(|f| f.seed < 20);
    let ok = s.clean()
        && s.seeds_run == 100
        && s.reach_failure().is_none()
        && caught
        && m.complete
        && !m.violated();
    Ok(Row {
        check: "SGLang worker mode behind fronts (sweep worker-mode.toml, model worker-front)"
            .into(),
        expected: "clean; the incident's bugs caught behind the fronts".into(),
        observed: format!(
            "sweep: {} seeds, {}; incident bugs: {}; model worker-front: {}",
            s.seeds_run,
            verdict(&s),
            first.map_or_else(
                || format!("no violation in {} seeds", bugged.seeds_run),
                |f| format!("seed {} breaks {}", f.seed, f.invariant)
            ),
            model_words(&m)
        ),
        ok,
        wall_s: t.elapsed().as_secs_f64(),
    })
}
