//! The simulator's subcommands (`sweep`, `replay`, `merge`): arguments, one library
//! call each, printing. The logic lives in `kvsim_sim` (sweep, replay, shrink,
//! report). Exit codes: 0 clean, 1 a violation (or a nondeterministic seed), 2 bad
//! usage or an unreadable input (clap's own errors exit 2 as well).

use anyhow::{Context, Result};
use clap::Args;
use kvsim_engine::bugs::BugSet;
use kvsim_sim::plan::Reduction;
use kvsim_sim::replay::{self, ReplayOptions};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{self, SeedRange, Shard, SweepOptions, SweepSummary};
use kvsim_sim::{report, shrink, Backend};
use std::path::PathBuf;
use std::process::ExitCode;

/// `kvsim sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// A scenario file (TOML).
    pub scenario: PathBuf,
    /// Seeds to run: A..B (B exclusive), A..=B, or one seed.
    #[arg(long, default_value = "0..1000")]
    pub seeds: String,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run only shard K of N (1-based): seeds A+K-1, A+K-1+N, ...
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Bug switches to enable, comma-separated (replaces the scenario's list).
    #[arg(long, value_name = "LIST")]
    pub bugs: Option<String>,
    /// Also write the summary as JSON (shards' files merge with `kvsim merge`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Run every seed twice and compare the trace hashes.
    #[arg(long)]
    pub check_determinism: bool,
    /// Stop at the first failing seed.
    #[arg(long)]
    pub first: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// `kvsim replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A scenario file (TOML).
    pub scenario: PathBuf,
    #[arg(long)]
    pub seed: u64,
    /// Bug switches to enable, comma-separated (replaces the scenario's list).
    #[arg(long, value_name = "LIST")]
    pub bugs: Option<String>,
    /// Replay a shrunk run: `keep=0,3;off=loss,crash;safety-ms=1200`.
    #[arg(long, value_name = "SPEC")]
    pub reduce: Option<String>,
    /// Write every event of the run as JSON, one object per line (docs/TRACE.md).
    #[arg(long, value_name = "FILE")]
    pub trace_json: Option<PathBuf>,
    /// Search for a smaller run that violates the same invariant, and print it.
    #[arg(long)]
    pub shrink: bool,
    /// Run twice and compare the traces.
    #[arg(long)]
    pub check_determinism: bool,
    /// Print only the report, not the full trace.
    #[arg(long)]
    pub brief: bool,
    /// KV backend: symbolic (white-box oracles) or host (real f32 arithmetic).
    #[arg(long, default_value = "symbolic")]
    pub gpu: String,
}

/// `kvsim merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Sweep summaries (`kvsim sweep --json`) of shards of one sweep.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write the merged summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

fn load(path: &std::path::Path) -> Result<Scenario> {
    Scenario::load(path).with_context(|| format!("loading {}", path.display()))
}

fn bugs(list: Option<&str>) -> Result<Option<BugSet>> {
    list.map(|l| BugSet::parse(l).map_err(anyhow::Error::from))
        .transpose()
}

fn verdict(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn write_json(path: &std::path::Path, s: &SweepSummary) -> Result<()> {
    let text = serde_json::to_string_pretty(s)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

pub fn sweep(a: &SweepArgs) -> Result<ExitCode> {
    let sc = load(&a.scenario)?;
    let opts = SweepOptions {
        seeds: SeedRange::parse(&a.seeds)?,
        shard: a
            .shard
            .as_deref()
            .map(Shard::parse)
            .transpose()?
            .unwrap_or(Shard::WHOLE),
        jobs: match a.jobs {
            Some(0) => return Err(sweep::UsageError::Jobs.into()),
            j => j,
        },
        bugs: bugs(a.bugs.as_deref())?,
        progress: !a.quiet,
        check_determinism: a.check_determinism,
        stop_at_first: a.first,
        ..SweepOptions::default()
    };
    let path = a.scenario.display().to_string();
    let summary = sweep::run_sweep(&sc, &path, &opts)?;
    print!("{}", summary.render());
    if let Some(j) = &a.json {
        write_json(j, &summary)?;
    }
    Ok(verdict(summary.clean()))
}

pub fn replay(a: &ReplayArgs) -> Result<ExitCode> {
    let sc = load(&a.scenario)?;
    let path = a.scenario.display().to_string();
    let opts = ReplayOptions {
        seed: a.seed,
        bugs: bugs(a.bugs.as_deref())?,
        reduction: a
            .reduce
            .as_deref()
            .map(Reduction::parse)
            .transpose()?
            .unwrap_or_default(),
        backend: match a.gpu.as_str() {
            "symbolic" => Backend::Symbolic,
            "host" => Backend::Host,
            other => anyhow::bail!("unknown --gpu `{other}` (known: symbolic, host)"),
        },
        full_trace: !a.brief,
    };
    let r = replay::replay(&sc, &path, &opts, a.check_determinism)?;
    print!("{}", r.text);
    if let Some(j) = &a.trace_json {
        replay::write_trace_json(&r.outcome.header, &r.outcome.trace, j)
            .with_context(|| format!("writing {}", j.display()))?;
        println!(
            "trace: {} events written to {}",
            r.outcome.trace.len(),
            j.display()
        );
    }
    let mut clean = r.outcome.clean() && r.deterministic != Some(false);
    if a.shrink && !r.outcome.clean() {
        println!("\n== shrinking ==");
        match shrink::shrink(&sc, a.seed, opts.bugs, None, 2_000)? {
            None => println!("the seed does not fail; nothing to shrink"),
            Some(s) => {
                println!("{}", s.summary());
                if let Some(rep) = report::failure_report(&s.outcome, &path) {
                    print!("{rep}");
                }
                clean = false;
            }
        }
    }
    Ok(verdict(clean))
}

pub fn merge(a: &MergeArgs) -> Result<ExitCode> {
    let mut parts = Vec::new();
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let s: SweepSummary = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sweep summary", f.display()))?;
        parts.push(s);
    }
    let merged = SweepSummary::merge(&parts)?;
    print!("{}", merged.render());
    if let Some(j) = &a.json {
        write_json(j, &merged)?;
    }
    Ok(verdict(merged.clean()))
}
