//! `kvsim bugs`: argument parsing and file output for the bug-detection matrix.
//! The runs are `kvsim_lab::matrix`; the formatting is `kvsim_lab::matrix_report`.

use anyhow::{Context, Result};
use kvsim_lab::matrix::{self, Budget};
use kvsim_lab::{isolation, matrix_report};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct BugsArgs {
    /// Seed budget per switch for the simulator sweeps.
    #[arg(long, default_value_t = 300)]
    pub seeds: u64,
    /// Also write the matrix as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Where to write bugs.md and bugs.svg (`--out reports` updates the committed ones).
    #[arg(long, default_value = "target/reports")]
    pub out: PathBuf,
    /// Reduced model bounds and no defenses table (what the default suite runs).
    #[arg(long)]
    pub quick: bool,
    /// Model-checker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Instead of the matrix: time each switch from a cold start to its first failing
    /// seed (`kvsim sweep --until-failure`, at most --seeds) and to its first
    /// counterexample (`kvsim check --until-first`), and write target/reports/ttc.md.
    #[arg(long)]
    pub time_to_counterexample: bool,
    /// With --time-to-counterexample: runs per cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// With --time-to-counterexample: only these switches (comma-separated names, or
    /// `incident pair (gate + length)`).
    #[arg(long, value_name = "LIST")]
    pub only: Option<String>,
}

pub fn run(a: &BugsArgs) -> Result<ExitCode> {
    if a.seeds == 0 {
        anyhow::bail!("--seeds must be at least 1: a matrix of no simulator seeds detects nothing");
    }
    if a.threads == 0 || a.threads > crate::cmd_check::MAX_THREADS {
        anyhow::bail!(
            "--threads {}: must be 1 to {}",
            a.threads,
            crate::cmd_check::MAX_THREADS
        );
    }
    let mut budget = if a.quick {
        Budget::quick(a.seeds)
    } else {
        Budget::full(a.seeds)
    };
    budget.threads = a.threads.max(1);
    if a.time_to_counterexample {
        return time_to_counterexample(a, budget);
    }
    let command = if a.quick {
        format!("kvsim bugs --quick --seeds {}", a.seeds)
    } else {
        format!("kvsim bugs --seeds {}", a.seeds)
    };
    let m = matrix::run(&budget, &command, |label| eprintln!("  hunting: {label}"))?;
    let mut md = matrix_report::markdown(&m);
    // Each defense alone against every hazard, and the monotonicity check.
    let iso_seeds = if a.quick { 3 } else { a.seeds.min(20) };
    let iso = isolation::run(iso_seeds, |c| eprintln!("  isolating: {c}"))?;
    md.push_str("\n## Defense isolation\n\n```\n");
    md.push_str(&iso.render());
    md.push_str("```\n");
    print!("{md}");
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let md_path = a.out.join("bugs.md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    let svg = matrix_report::svg(&m).map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    let svg_path = a.out.join("bugs.svg");
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&m)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let mut failed: Vec<&str> = m
        .rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.label.as_str())
        .collect();
    if !iso.misses().is_empty() {
        failed.push("defense isolation: an expected stop leaked");
    }
    if !iso.monotonicity_breaches().is_empty() {
        failed.push("defense isolation: a stronger configuration looked worse");
    }
    eprintln!("wrote {} and {}", md_path.display(), svg_path.display());
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("NOT OK: {}", failed.join(", "));
        Ok(ExitCode::from(1))
    }
}

/// `--time-to-counterexample`: the table of [`crate::cmd_ttc`].
fn time_to_counterexample(a: &BugsArgs, budget: Budget) -> Result<ExitCode> {
    if a.runs == 0 || a.runs > 101 {
        anyhow::bail!(
            "--runs {}: must be 1 to 101 (the median of the runs is reported)",
            a.runs
        );
    }
    let only: Vec<String> = a
        .only
        .as_deref()
        .map(|l| l.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default();
    let mut command = format!(
        "kvsim bugs --time-to-counterexample --runs {} --seeds {} --threads {}",
        a.runs, a.seeds, budget.threads
    );
    if a.quick {
        command.push_str(" --quick");
    }
    if let Some(l) = &a.only {
        command.push_str(&format!(" --only {l}"));
    }
    let plan = crate::cmd_ttc::TtcPlan {
        runs: a.runs,
        seeds: a.seeds,
        budget,
        only,
        out: a.out.clone(),
        command,
    };
    crate::cmd_ttc::run(&plan)?;
    Ok(ExitCode::SUCCESS)
}
