//! The default suite: what `cargo run --release` runs with no arguments.
//!
//! A short, meaningful pass of each capability, ending in one summary table. Each row
//! states what it expects and whether the run met it; the suite fails (exit 1) if any
//! row does not.

use anyhow::Result;
use kvsim_engine::bugs::BugSet;
use kvsim_engine::ids::TenantId;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Status;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{report, run_scenario, RunOptions, RunOutcome};
use std::process::ExitCode;
use std::time::Instant;

/// The incident scenario, compiled in so the suite runs from any directory.
pub const GLM53_INCIDENT: &str = include_str!("../scenarios/glm53-incident.toml");

/// The default sweep scenario (every fault kind under swarm testing).
pub const MIXED_FAULTS: &str = include_str!("../scenarios/mixed-faults.toml");

/// Stalled nodes and skewed clocks under swarm testing.
pub const STALLS: &str = include_str!("../scenarios/stalls.toml");

pub use crate::suite_row::Row;

/// The incident with the historical bugs: tenant 2 gets 200 carrying tenant 1's
/// canary tokens, and the oracles name S5, S4 and S3.
pub fn incident_with_bugs() -> Result<(Row, RunOutcome)> {
    let sc = Scenario::parse(GLM53_INCIDENT, "scenarios/glm53-incident.toml")?;
    let t = Instant::now();
    let out = run_scenario(
        &sc,
        &RunOptions {
            bugs: Some(BugSet::INCIDENT),
            ..Default::default()
        },
    )?;
    let wall_s = t.elapsed().as_secs_f64();
    let broken = out.broken();
    let leaked_from_1 = out.leaks.iter().any(|l| {
        let tenant = |r| out.requests.iter().find(|p| p.req == r).map(|p| p.tenant.0);
        tenant(l.victim_of) == Some(2) && tenant(l.owner) == Some(1)
    });
    let ok = out.status_of(TenantId(2)) == Some(Status::OK)
        && leaked_from_1
        && [Invariant::S5, Invariant::S4, Invariant::S3]
            .iter()
            .all(|i| broken.contains(i));
    let observed = format!(
        "tenant 2: {}, {} leaked tokens, violated {}",
        out.status_of(TenantId(2))
            .map_or("no answer".into(), |s| s.to_string()),
        out.leaks.len(),
        broken
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let row = Row {
        check: "incident, bugs gate-checks-finished-only + no-length-agreement".into(),
        expected: "tenant 2 gets 200 echoing tenant 1; S5, S4, S3 caught".into(),
        observed,
        ok,
        wall_s,
    };
    Ok((row, out))
}

/// The incident against the defended engine: tenant 2 gets 400, nothing leaks.
pub fn incident_defended() -> Result<(Row, RunOutcome)> {
    let sc = Scenario::parse(GLM53_INCIDENT, "scenarios/glm53-incident.toml")?;
    let t = Instant::now();
    let out = run_scenario(&sc, &RunOptions::default())?;
    let wall_s = t.elapsed().as_secs_f64();
    let ok = out.clean()
        && out.status_of(TenantId(2)) == Some(Status::BAD_REQUEST)
        && out.status_of(TenantId(1)) == Some(Status::OK);
    let observed = format!(
        "tenant 1: {}, tenant 2: {}, {}",
        out.status_of(TenantId(1))
            .map_or("no answer".into(), |s| s.to_string()),
        out.status_of(TenantId(2))
            .map_or("no answer".into(), |s| s.to_string()),
        if out.clean() {
            "clean".to_string()
        } else {
            format!("violated {:?}", out.broken())
        }
    );
    let row = Row {
        check: "incident, defended engine".into(),
        expected: "tenant 2 gets 400, tenant 1 gets 200, clean".into(),
        observed,
        ok,
        wall_s,
    };
    Ok((row, out))
}

/// The same configuration without `allow_unsafe_pool`: the pre-flight refuses it.
pub fn preflight_refuses() -> Result<Row> {
    let mut sc = Scenario::parse(GLM53_INCIDENT, "scenarios/glm53-incident.toml")?;
    sc.engine.allow_unsafe_pool = false;
    let t = Instant::now();
    let res = run_scenario(&sc, &RunOptions::default());
    let wall_s = t.elapsed().as_secs_f64();
    let (ok, observed) = match res {
        Ok(_) => (false, "the engine started".to_string()),
        Err(e) => {
            let msg = e.to_string();
            (msg.contains("681280") && msg.contains("1048576"), msg)
        }
    };
    Ok(Row {
        check: "pre-flight on the incident config".into(),
        expected: "refuses to start, naming 681280 and 1048576".into(),
        observed,
        ok,
        wall_s,
    })
}

fn mixed_faults_sweep(
    seeds: u64,
    bugs: Option<BugSet>,
    stop_at_first: bool,
) -> Result<kvsim_sim::sweep::SweepSummary> {
    let path = "scenarios/mixed-faults.toml";
    let sc = Scenario::parse(MIXED_FAULTS, path)?;
    let opts = kvsim_sim::sweep::SweepOptions {
        seeds: kvsim_sim::sweep::SeedRange {
            start: 0,
            end: seeds,
        },
        bugs,
        stop_at_first,
        ..Default::default()
    };
    Ok(kvsim_sim::sweep::run_sweep(&sc, path, &opts)?)
}

/// A short sweep of `mixed-faults` on the defended engine: every fault kind under
/// swarm testing, 500 seeds of 64 requests, no violation, every path the scenario
/// declares in `reach` reached.
pub fn sweep_defended() -> Result<Row> {
    let s = mixed_faults_sweep(500, None, false)?;
    let unreached = s.reach_failure();
    Ok(Row {
        check: "sweep mixed-faults, 500 seeds, defended engine".into(),
        expected: "clean".into(),
        observed: format!(
            "{} seeds, {} events, {} simulated, {}{}; {:.0} seeds/s, sim {:.0}x real time",
            s.seeds_run,
            s.events,
            report::secs(s.sim_ns),
            if s.clean() {
                "clean".to_string()
            } else {
                format!("{} failing seeds: {:?}", s.failing_seeds, s.violations)
            },
            unreached
                .as_deref()
                .map_or_else(String::new, |why| format!("; {why}")),
            s.seeds_per_s(),
            s.sim_ratio()
        ),
        ok: s.clean() && s.seeds_run == 500 && unreached.is_none(),
        wall_s: s.wall_s,
    })
}

/// The same sweep with the incident's bug switches: a violation within 50 seeds,
/// with the command that replays it.
pub fn sweep_incident() -> Result<Row> {
    let s = mixed_faults_sweep(50, Some(BugSet::INCIDENT), true)?;
    let first = s.failures.first();
    Ok(Row {
        check: "sweep mixed-faults, incident bugs".into(),
        expected: "a violation within 50 seeds".into(),
        observed: match first {
            Some(f) => format!(
                "seed {} breaks {} after {} seeds; {}",
                f.seed, f.invariant, s.seeds_run, f.replay
            ),
            None => format!("no violation in {} seeds", s.seeds_run),
        },
        ok: first.is_some_and(|f| f.seed < 50),
        wall_s: s.wall_s,
    })
}

/// `kvsim audit` sees what the simulator sees: 100 seeds of `mixed-faults` and the
/// incident with its bugs, each exported as a trace and judged from that trace alone,
/// get the run's verdict finding for finding (the incident's S5, S4, S3 included).
pub fn audit_agrees() -> Result<Row> {
    let path = "scenarios/mixed-faults.toml";
    let sc = Scenario::parse(MIXED_FAULTS, path)?;
    let t = Instant::now();
    let s = kvsim_sim::sweep::run_sweep(
        &sc,
        path,
        &kvsim_sim::sweep::SweepOptions {
            seeds: kvsim_sim::sweep::SeedRange { start: 0, end: 100 },
            audit: true,
            ..Default::default()
        },
    )?;
    let inc = Scenario::parse(GLM53_INCIDENT, "scenarios/glm53-incident.toml")?;
    let plan = kvsim_sim::plan::Plan::build(
        &inc,
        inc.seed,
        Some(BugSet::INCIDENT),
        &kvsim_sim::plan::Reduction::default(),
    )?;
    let (out, agreed) = kvsim_sim::run_and_audit(&plan, kvsim_sim::Backend::Symbolic);
    let incident_found = [Invariant::S5, Invariant::S4, Invariant::S3]
        .iter()
        .all(|i| out.broken().contains(i));
    let ok = s.audited == 100 && s.audit_mismatches.is_empty() && agreed.is_ok() && incident_found;
    Ok(Row {
        check: "audit: traces judged alone (kvsim audit)".into(),
        expected: "the same verdict as the run, finding for finding".into(),
        observed: format!(
            "{} mixed-faults traces agree{}; incident trace: {} ({})",
            s.audited - s.audit_mismatches.len() as u64,
            if s.audit_mismatches.is_empty() {
                String::new()
            } else {
                format!(", MISMATCH on seeds {:?}", s.audit_mismatches)
            },
            match &agreed {
                Ok(()) => "agrees".to_string(),
                Err(e) => format!("DIFFERS: {e}"),
            },
            out.broken()
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        ok,
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// The model checker on the full `handoff` standard model (1.79 M states, a few
/// seconds in release on two threads): exhaustive and clean on the defended engine,
/// and with the incident's bug pair on its reduced bounds it finds S5, S4 and S3, the
/// S3 counterexample (shortest: one thread, breadth-first) replaying through the
/// simulator.
pub fn model_check_handoff() -> Result<Row> {
    use kvsim_models::{check, names, CheckOptions, ModelSpec};
    let t = Instant::now();
    let clean = check(
        ModelSpec::handoff(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )?;
    let buggy = check(
        ModelSpec::handoff_small().with_bugs(BugSet::INCIDENT),
        &CheckOptions::default(),
    )?;
    let wall_s = t.elapsed().as_secs_f64();
    let s3 = buggy.counterexample(names::S3);
    let replayed = s3
        .and_then(|c| c.replay.as_ref().ok())
        .map(|r| r.broken.clone())
        .unwrap_or_default();
    let ok = clean.complete
        && !clean.violated()
        && s3.is_some_and(|c| c.steps.len() <= 25)
        && [Invariant::S5, Invariant::S4, Invariant::S3]
            .iter()
            .all(|i| replayed.contains(i));
    let observed = format!(
        "defended: {} states ({:.0}/s), {}; bugs: S3 in {} steps, replay violates {}",
        clean.unique,
        clean.states_per_sec(),
        if clean.violated() {
            "VIOLATED"
        } else {
            "clean"
        },
        s3.map_or("-".into(), |c| c.steps.len().to_string()),
        replayed
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(Row {
        check: "model check handoff (stateright, engine nodes)".into(),
        expected: "clean when defended; incident bugs: S3 counterexample <= 25 steps".into(),
        observed,
        ok,
        wall_s,
    })
}

/// Stalls and skewed clocks: 300 seeds of `stalls.toml` on the defended engine
/// (clean, pauses struck, every declared path reached) and the `pause-race` model
/// exhausted clean, where a pause alone lets decode's waiting timer fire while prefill
/// is frozen mid-transfer.
pub fn stalls() -> Result<Row> {
    use kvsim_models::{check, names, CheckOptions, ModelSpec};
    let t = Instant::now();
    let path = "scenarios/stalls.toml";
    let sc = Scenario::parse(STALLS, path)?;
    let opts = kvsim_sim::sweep::SweepOptions {
        seeds: kvsim_sim::sweep::SeedRange { start: 0, end: 300 },
        ..Default::default()
    };
    let s = kvsim_sim::sweep::run_sweep(&sc, path, &opts)?;
    let options = CheckOptions {
        threads: 2,
        ..CheckOptions::default()
    };
    let m = check(ModelSpec::pause_race(), &options)?;
    let raced = matches!(
        m.status(names::FROZEN_TIMEOUT),
        Some(kvsim_models::check::Verdict::Reached { .. })
    );
    let paused = s
        .coverage
        .reach
        .get("pause-mid-request")
        .copied()
        .unwrap_or(0);
    let ok = s.clean()
        && s.reach_failure().is_none()
        && paused > 0
        && m.complete
        && !m.violated()
        && raced;
    let observed = format!(
        "sweep: {} seeds, {}, a node frozen mid-request in {} of them; model pause-race: {} states, {}",
        s.seeds_run,
        if s.clean() { "clean" } else { "VIOLATED" },
        paused,
        m.unique,
        if m.violated() { "VIOLATED" } else { "clean" }
    );
    Ok(Row {
        check: "stalled nodes and skewed clocks (sweep stalls.toml, model pause-race)".into(),
        expected: "clean; a timeout fires while a node is frozen".into(),
        observed,
        ok,
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// The bug matrix, quick pass: every historical switch hunted by the simulator (100
/// seeds each) and the reduced models; each must be caught, the defended engine not.
pub fn bug_matrix_quick() -> Result<Row> {
    let t = Instant::now();
    let m = kvsim_lab::matrix::run(
        &kvsim_lab::matrix::Budget::quick(100),
        "kvsim bugs --quick --seeds 100",
        |_| {},
    )?;
    let wall_s = t.elapsed().as_secs_f64();
    let switches = m.rows.iter().filter(|r| !r.baseline).count();
    let caught = m.rows.iter().filter(|r| !r.baseline && r.ok()).count();
    let both = m
        .rows
        .iter()
        .filter(|r| !r.baseline && r.sim_caught() && r.mc_caught())
        .count();
    let baseline_clean = m.rows.iter().filter(|r| r.baseline).all(|r| r.ok());
    Ok(Row {
        check: format!(
            "bug matrix (quick): {} switches + incident pair",
            kvsim_engine::bugs::Bug::ALL.len()
        ),
        expected: "every switch caught, defended engine clean".into(),
        observed: format!(
            "{caught}/{switches} caught ({both} by both tools), defended engine {}; full: kvsim bugs",
            if baseline_clean { "clean" } else { "FLAGGED" }
        ),
        ok: caught == switches && baseline_clean,
        wall_s,
    })
}

/// The defense-isolation matrix (5 seeds per cell): each defense alone stops the
/// hazards it exists to stop, no configuration that only adds defenses looks worse,
/// and the defended engine is clean under every data fault (`lab/src/isolation.rs`).
pub fn isolation_matrix() -> Result<Row> {
    let t = Instant::now();
    let m = kvsim_lab::isolation::run(5, |_| {})?;
    let wall_s = t.elapsed().as_secs_f64();
    let expected = kvsim_lab::isolation::expected().len()
        * kvsim_lab::isolation::TRANSPORTS.len()
        * m.routers().len();
    let misses = m.misses().len();
    let breaches = m.monotonicity_breaches().len();
    let data_clean = kvsim_lab::isolation::hazards()
        .into_iter()
        .filter(|h| matches!(h, kvsim_lab::isolation::Hazard::Data(_)))
        .all(|h| {
            kvsim_lab::isolation::TRANSPORTS.iter().all(|t| {
                m.routers().into_iter().all(|r| {
                    m.get_in(*t, r, "all defenses", h)
                        .is_some_and(|c| c.invariants.is_empty())
                })
            })
        });
    Ok(Row {
        check: "defense isolation: each defense alone, data faults, every transport, both routers"
            .into(),
        expected: "every expected stop holds, none looks worse, defended clean".into(),
        observed: format!(
            "{}/{expected} stops held, {breaches} monotonicity breaches, defended engine {} under data faults; full: kvsim bugs",
            expected - misses,
            if data_clean { "clean" } else { "FLAGGED" }
        ),
        ok: misses == 0 && breaches == 0 && data_clean,
        wall_s,
    })
}

/// Print rows as one table.
pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let w = rows.iter().map(|r| r.check.len()).max().unwrap_or(5).max(5);
    out.push_str(&format!(
        "{:<w$}  {:<4}  {:>7}  observed\n",
        "check", "ok", "wall"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<w$}  {:<4}  {:>6.2}s  {}\n",
            r.check,
            if r.ok { "PASS" } else { "FAIL" },
            r.wall_s,
            r.observed
        ));
    }
    out
}

/// Say on stderr that a row starts (unless `quiet`), then run it.
fn start<T>(quiet: bool, what: &str, row: impl FnOnce() -> Result<T>) -> Result<T> {
    if !quiet {
        eprintln!("-- running: {what}");
    }
    row()
}

/// Run the whole default suite, print it, and exit 1 if any row failed. Each row is
/// announced on stderr as it starts unless `quiet`.
pub fn run_default_suite(quiet: bool) -> Result<ExitCode> {
    println!("kvsim default suite\n");
    let mut rows = Vec::new();

    println!("== The GLM-5.3 incident with the historical bugs ==");
    let (row, out) = start(
        quiet,
        "the incident with the historical bugs",
        incident_with_bugs,
    )?;
    print!("{}", report::render_requests(&out.requests, &out.replies));
    println!("first findings:");
    print!(
        "{}",
        report::render_findings(&out.findings[..out.findings.len().min(4)])
    );
    println!();
    rows.push(row);

    println!("== The same scenario on the defended engine ==");
    let (row, out) = start(
        quiet,
        "the incident on the defended engine",
        incident_defended,
    )?;
    print!("{}", report::render_requests(&out.requests, &out.replies));
    println!();
    rows.push(row);

    rows.push(start(quiet, "pre-flight", preflight_refuses)?);
    rows.push(start(quiet, "sweep, defended engine", sweep_defended)?);
    rows.push(start(quiet, "sweep, incident bugs", sweep_incident)?);
    rows.push(start(quiet, "audit of exported traces", audit_agrees)?);
    rows.push(start(
        quiet,
        "model check of the handoff",
        model_check_handoff,
    )?);
    rows.push(start(quiet, "stalls and skewed clocks", stalls)?);
    rows.push(start(
        quiet,
        "vLLM pull under vllm-router",
        crate::suite_protocols::vllm_pull,
    )?);
    rows.push(start(
        quiet,
        "SGLang worker mode",
        crate::suite_protocols::worker_mode,
    )?);
    rows.push(start(quiet, "KV over NIXL", crate::suite_protocols::nixl)?);
    rows.push(start(
        quiet,
        "rooms with several ranks",
        crate::suite_protocols::multi_rank,
    )?);
    rows.push(start(quiet, "bug matrix (quick)", bug_matrix_quick)?);
    rows.push(start(quiet, "defense isolation", isolation_matrix)?);

    println!("== Summary ==");
    print!("{}", render(&rows));
    let failed = rows.iter().filter(|r| !r.ok).count();
    println!("\n{} passed, {} failed", rows.len() - failed, failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
