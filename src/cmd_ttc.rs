//! `kvsim bugs --time-to-counterexample`: for every bug switch, the wall time a user
//! waits from a cold start until the simulator prints the switch's first failing seed
//! (`kvsim sweep --until-failure`) and until the model checker prints a
//! counterexample (`kvsim check --until-first`), the median of several runs.
//!
//! Each run is a new process of this same binary, so start-up, scenario parsing and a
//! cold transition cache are in every figure, as they are for a user. The switches,
//! their scenarios and their models are the bug matrix's (`kvsim_lab::matrix`); the
//! compiled-in scenario files are written out once, unchanged, for the sweeps to read.

use anyhow::{bail, Context, Result};
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_lab::matrix::{self, Budget};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The goals the table is judged against (seconds, 2 cores).
const SIM_GOAL_S: f64 = 1.0;
const MC_GOAL_S: f64 = 10.0;

/// What to time and where to write it.
pub struct TtcPlan {
    pub runs: usize,
    pub seeds: u64,
    pub budget: Budget,
    /// Switch names (or row labels) to time; every switch when empty.
    pub only: Vec<String>,
    pub out: PathBuf,
    pub command: String,
}

/// The medians of one tool for one switch.
struct Timed {
    /// Wall seconds of each run, sorted.
    secs: Vec<f64>,
    /// What the tool found (the same every run: both tools are deterministic).
    found: Option<String>,
}

impl Timed {
    fn median(&self) -> f64 {
        self.secs[self.secs.len() / 2]
    }

    fn cell(&self) -> String {
        let (lo, hi) = (self.secs[0], self.secs[self.secs.len() - 1]);
        format!("{:.2} s ({lo:.2}-{hi:.2})", self.median())
    }
}

/// One row: a switch (or the incident pair) and what each tool took.
struct Row {
    label: String,
    sim: std::result::Result<Timed, String>,
    mc: std::result::Result<Timed, String>,
}

/// Time every switch (or those `--only` names) and print and write the table.
pub fn run(plan: &TtcPlan) -> Result<()> {
    assert!(plan.runs > 0, "at least one run per cell");
    let exe = std::env::current_exe().context("finding this kvsim binary")?;
    let scenario_dir = plan.out.join("ttc-scenarios");
    let mut rows = Vec::new();
    for (label, bugs, baseline) in matrix::configurations() {
        if baseline || !selected(&plan.only, &label) {
            continue;
        }
        eprintln!("  timing: {label}");
        let sim = match matrix::sim_not_applicable(bugs).or(preflight_only(bugs)) {
            Some(why) => Err(why.to_string()),
            None => Ok(time_sim(&exe, &scenario_dir, bugs, plan)?),
        };
        let mc = match matrix::mc_not_applicable(bugs) {
            Some(why) => Err(why.to_string()),
            None => Ok(time_mc(&exe, bugs, plan)?),
        };
        rows.push(Row { label, sim, mc });
    }
    if rows.is_empty() {
        bail!(
            "--only {}: names no switch (`kvsim list bugs` lists them)",
            plan.only.join(",")
        );
    }
    let md = render(&rows, plan);
    print!("{md}");
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    let path = plan.out.join("ttc.md");
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn selected(only: &[String], label: &str) -> bool {
    only.is_empty() || only.iter().any(|o| o == label)
}

/// `skip-preflight` is a start-up rule: the matrix checks it by starting the unsafe
/// pool, not by a sweep, so there is no seed to wait for.
fn preflight_only(bugs: BugSet) -> Option<&'static str> {
    bugs.has(Bug::SkipPreflight)
        .then_some("a start-up config rule: the pre-flight check refuses the pool at once")
}

/// The `--bugs` list of a configuration.
fn bug_list(bugs: BugSet) -> String {
    Bug::ALL
        .iter()
        .filter(|b| bugs.has(**b))
        .map(|b| b.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// The sweep's arguments for `bugs` (its scenario written under `dir`).
fn sim_args(dir: &Path, bugs: BugSet, seeds: u64) -> Result<(Vec<String>, String)> {
    let path = matrix::scenario_for(bugs);
    let text = matrix::scenario_text(path)
        .with_context(|| format!("{path} is not compiled in (kvsim_lab::matrix::SCENARIOS)"))?;
    let file = dir.join(
        Path::new(path)
            .file_name()
            .context("a scenario file name")?,
    );
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    let args = vec![
        "sweep".to_string(),
        file.display().to_string(),
        "--bugs".into(),
        bug_list(bugs),
        "--until-failure".into(),
        "--seeds".into(),
        format!("0..{seeds}"),
        "--quiet".into(),
    ];
    let shown = format!(
        "kvsim sweep {path} --bugs {} --until-failure --seeds 0..{seeds}",
        bug_list(bugs)
    );
    Ok((args, shown))
}

/// `plan.runs` sweeps until the first failing seed.
fn time_sim(exe: &Path, dir: &Path, bugs: BugSet, plan: &TtcPlan) -> Result<Timed> {
    let (args, shown) = sim_args(dir, bugs, plan.seeds)?;
    let mut secs = Vec::with_capacity(plan.runs);
    let mut found = None;
    for _ in 0..plan.runs {
        let (s, stdout) = time_once(exe, &args, &shown)?;
        secs.push(s);
        found = stdout
            .lines()
            .find_map(|l| l.strip_prefix("FAIL seed "))
            .map(|rest| format!("seed {}", rest.split(" (").next().unwrap_or(rest)));
    }
    secs.sort_by(f64::total_cmp);
    Ok(Timed {
        secs,
        found: found.or_else(|| Some(format!("none in {} seeds", plan.seeds))),
    })
}

/// `plan.runs` times: the models in the matrix's order, each until its first
/// counterexample, until one prints one (the time of every model tried counts).
fn time_mc(exe: &Path, bugs: BugSet, plan: &TtcPlan) -> Result<Timed> {
    let order = matrix::model_order(bugs, &plan.budget.models);
    let mut secs = Vec::with_capacity(plan.runs);
    let mut found = None;
    for _ in 0..plan.runs {
        let mut total = 0.0;
        found = None;
        for model in &order {
            let args: Vec<String> = [
                "check",
                "--model",
                model,
                "--until-first",
                "--quiet",
                "--threads",
                &plan.budget.threads.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(["--bugs".to_string(), bug_list(bugs)])
            .collect();
            let shown = format!("kvsim {}", args.join(" "));
            let (s, stdout) = time_once(exe, &args, &shown)?;
            total += s;
            if let Some(line) = stdout
                .lines()
                .find(|l| l.trim_start().starts_with("VIOLATED"))
            {
                found = Some(format!("{model}: {}", violated_text(line)));
                break;
            }
        }
        secs.push(total);
    }
    secs.sort_by(f64::total_cmp);
    Ok(Timed {
        secs,
        found: found.or_else(|| Some(format!("none in {}", order.join(", ")))),
    })
}

/// `VIOLATED    always    S2 no write after free (20-step counterexample)` ->
/// `S2 no write after free (20-step counterexample)`.
fn violated_text(line: &str) -> String {
    let rest = line
        .trim_start()
        .trim_start_matches("VIOLATED")
        .trim_start();
    rest.trim_start_matches("always").trim().to_string()
}

/// Run `exe args` once; its wall seconds and stdout. Exit 0 (nothing found) and 1 (a
/// violation) are answers; anything else is an error.
fn time_once(exe: &Path, args: &[String], shown: &str) -> Result<(f64, String)> {
    let t = Instant::now();
    let out = Command::new(exe)
        .args(args)
        .output()
        .with_context(|| format!("running {shown}"))?;
    let secs = t.elapsed().as_secs_f64();
    match out.status.code() {
        Some(0 | 1) => Ok((secs, String::from_utf8_lossy(&out.stdout).into_owned())),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            bail!(
                "{shown}: exited {}; stderr ends: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        }
    }
}

fn render(rows: &[Row], plan: &TtcPlan) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Time to a counterexample\n");
    let _ = writeln!(
        md,
        "Generated by `{}` ({} runs per cell, {} cores here). Each cell is the median \
         wall time of its runs (fastest-slowest in brackets), each a new process of this \
         binary, start-up included: the simulator is `kvsim sweep SCENARIO --bugs B \
         --until-failure --seeds 0..{}` until it exits with the first failing seed; the \
         model checker is `kvsim check --model M --bugs B --until-first --quiet --threads \
         {}` (breadth-first, so the counterexample is a shortest one) over {} in the \
         matrix's order until one prints a counterexample, every model tried counted. \
         Goals: simulator under {SIM_GOAL_S} s, model checker under {MC_GOAL_S} s.\n",
        plan.command,
        plan.runs,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        plan.seeds,
        plan.budget.threads,
        plan.budget.models.join(", "),
    );
    md.push_str(
        "| switch | sim: median (range) | sim: found | mc: median (range) | mc: found | goals |\n",
    );
    md.push_str("|---|---|---|---|---|---|\n");
    for r in rows {
        let (sim_t, sim_f) = cells(&r.sim);
        let (mc_t, mc_f) = cells(&r.mc);
        let _ = writeln!(
            md,
            "| {} | {sim_t} | {sim_f} | {mc_t} | {mc_f} | {} |",
            r.label,
            goals(r)
        );
    }
    md
}

fn cells(t: &std::result::Result<Timed, String>) -> (String, String) {
    match t {
        Ok(t) => (t.cell(), t.found.clone().unwrap_or_default()),
        Err(why) => ("n/a".into(), why.clone()),
    }
}

/// Which goals the row misses; a tool that found nothing misses its goal.
fn goals(r: &Row) -> String {
    let misses = |t: &std::result::Result<Timed, String>, goal: f64, tool: &str| match t {
        Ok(t) if t.found.as_deref().is_some_and(|f| f.starts_with("none")) => {
            Some(format!("{tool}: nothing found"))
        }
        Ok(t) if t.median() >= goal => Some(format!("{tool} over {goal} s")),
        _ => None,
    };
    let missed: Vec<String> = [
        misses(&r.sim, SIM_GOAL_S, "sim"),
        misses(&r.mc, MC_GOAL_S, "mc"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missed.is_empty() {
        "met".into()
    } else {
        missed.join("; ")
    }
}
