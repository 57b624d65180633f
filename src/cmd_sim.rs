//! The simulator's subcommands (`sweep`, `replay`, `merge`): arguments, one library
//! call each, printing. The logic lives in `kvsim_sim` (sweep, replay, shrink,
//! report). Exit codes: 0 clean, 1 a violation (or a nondeterministic seed), 2 bad
//! usage or an unreadable input (clap's own errors exit 2 as well), 3 a merge that
//! does not cover every seed of its range, 4 a sweep (or a merge) that ran every seed
//! of its range, clean, in which no seed reached a path its scenario declares in
//! `reach`, 130 a sweep interrupted by Ctrl-C.

use anyhow::{Context, Result};
use clap::Args;
use kvsim_engine::bugs::BugSet;
use kvsim_sim::plan::Reduction;
use kvsim_sim::replay::{self, ReplayOptions};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{self, SeedRange, Shard, SweepOptions, SweepSummary};
use kvsim_sim::{report, shrink, Backend};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `kvsim sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// A scenario file (TOML).
    pub scenario: PathBuf,
    /// Seeds to run: A..B (B exclusive), A..=B, or one seed [default: 0..1000, or
    /// every seed from 0 with --until-failure or --time-budget].
    #[arg(long)]
    pub seeds: Option<String>,
    /// Stream seeds until the first failure; print its seed and replay command first.
    #[arg(long)]
    pub until_failure: bool,
    /// Stream seeds for this long (`30s`, `5m`, `2h`, `500ms`), then summarise.
    #[arg(long, value_name = "D")]
    pub time_budget: Option<String>,
    /// Worker threads (default: one per core; at most 1024).
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
    /// Run a scenario whose estimated cost per seed exceeds the budget.
    #[arg(long)]
    pub allow_expensive: bool,
    /// Also audit every seed's trace alone (`kvsim audit`'s oracle, fed the trace's
    /// header and entries in memory instead of their text): a seed whose audit verdict
    /// differs from the run's, finding for finding, fails.
    #[arg(long)]
    pub audit: bool,
    /// `[faults]` settings laid over the scenario's, as TOML (repeatable): for
    /// example `--faults 'pause = { count = 2, max_ms = 300 }'` or `--faults
    /// clock_skew_permille=200`. A failure's replay command repeats them.
    #[arg(long = "faults", value_name = "TOML")]
    pub faults: Vec<String>,
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
    /// Search for a smaller run that violates the same invariant and show it first
    /// (its first violation and causal trace), then the seed as drawn without its
    /// full trace (`--full-trace` adds it). `--trace-json` then writes the shrunk
    /// run's trace.
    #[arg(long)]
    pub shrink: bool,
    /// With `--shrink`: also print the full trace of the seed as drawn.
    #[arg(long)]
    pub full_trace: bool,
    /// Run twice and compare the traces.
    #[arg(long)]
    pub check_determinism: bool,
    /// Write the run's timeline to FILE as one self-contained HTML page: a lane per
    /// node and per tenant, messages and KV writes as arrows, faults, each room use's
    /// pages over time, the first violation marked in red (detections in amber).
    /// With `--shrink`, the shrunk run's. Open it in any browser (docs/guide/timeline.md).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print only the report, not the full trace (the default with `--shrink`).
    #[arg(long, conflicts_with = "full_trace")]
    pub brief: bool,
    /// KV backend: symbolic (white-box oracles) or host (real f32 arithmetic).
    #[arg(long, default_value = "symbolic")]
    pub gpu: String,
    /// Run a scenario whose estimated cost exceeds the budget.
    #[arg(long)]
    pub allow_expensive: bool,
    /// `[faults]` settings laid over the scenario's, as TOML (repeatable): for
    /// example `--faults 'pause = { count = 2, max_ms = 300 }'` or `--faults
    /// clock_skew_permille=200`. A failure's replay command repeats them.
    #[arg(long = "faults", value_name = "TOML")]
    pub faults: Vec<String>,
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

/// Lay the `--faults` settings over the scenario's, in order.
fn overlay(sc: &mut Scenario, specs: &[String]) -> Result<()> {
    for spec in specs {
        sc.overlay_faults(spec)
            .with_context(|| format!("--faults `{spec}`"))?;
    }
    Ok(())
}

/// Load a scenario to run: its memory must fit the backend, and its estimated cost
/// the budget unless `allow_expensive`.
pub fn load_to_run(path: &std::path::Path, host: bool, allow_expensive: bool) -> Result<Scenario> {
    let sc = load(path)?;
    let ctx = || format!("{}", path.display());
    sc.check_memory(host).with_context(ctx)?;
    if !allow_expensive {
        sc.check_cost().with_context(ctx)?;
    }
    Ok(sc)
}

fn bugs(list: Option<&str>) -> Result<Option<BugSet>> {
    list.map(|l| BugSet::parse(l).map_err(anyhow::Error::from))
        .transpose()
}

/// The exit status of a clean sweep (or merge) that ran every seed and in which a
/// path the scenario declares (`reach`) was reached by no seed.
pub const EXIT_UNREACHED: u8 = 4;

/// On a judged summary whose declared paths some seed never reached: say so on
/// stderr and give [`EXIT_UNREACHED`].
fn reach_verdict(s: &SweepSummary) -> Option<ExitCode> {
    let why = s.reach_failure()?;
    eprintln!("error: {why}");
    Some(ExitCode::from(EXIT_UNREACHED))
}

fn verdict(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The most worker threads a sweep starts.
pub const MAX_JOBS: usize = 1024;

/// The largest sweep summary `merge` reads, in bytes (a summary keeps at most a few
/// dozen failures; a real one is a few kilobytes).
pub const MAX_SUMMARY_BYTES: u64 = 16 << 20;

/// Parse a duration: a number with a unit `ms`, `s`, `m` or `h` (a bare number is
/// seconds).
pub fn parse_duration(text: &str) -> Result<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        anyhow::anyhow!("--time-budget `{text}`: expected a number with a unit: 500ms, 30s, 5m, 2h")
    })?;
    let secs = |mul: u64| {
        n.checked_mul(mul)
            .filter(|&s| s <= 365 * 24 * 3600)
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| anyhow::anyhow!("--time-budget `{text}`: at most a year"))
    };
    match unit.trim() {
        "ms" => Ok(std::time::Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" | "min" => secs(60),
        "h" => secs(3600),
        other => {
            anyhow::bail!("--time-budget `{text}`: unknown unit `{other}` (known: ms, s, m, h)")
        }
    }
    .and_then(|d| {
        if d.is_zero() {
            anyhow::bail!("--time-budget `{text}`: must be more than zero")
        }
        Ok(d)
    })
}

/// Read a file of at most `limit` bytes (a device or a huge file is refused after
/// `limit` bytes, not read to the end).
pub fn read_limited(path: &std::path::Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > limit {
        anyhow::bail!(
            "{} is larger than {limit} bytes, the most this command reads",
            path.display()
        );
    }
    String::from_utf8(buf).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// A flag raised by the first Ctrl-C (the sweep then summarises what it ran); a
/// second Ctrl-C exits at once with status 130.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    // Without a handler (one already set) Ctrl-C keeps its default: exit at once.
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("interrupted: finishing the seeds in flight, then summarising (Ctrl-C again to quit now)");
    });
    flag
}

fn write_json(path: &std::path::Path, s: &SweepSummary) -> Result<()> {
    let text = serde_json::to_string_pretty(s)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// `--seeds` (1,000 seeds by default, every seed when streaming) and `--shard`; a
/// shard that holds none of the seeds is refused.
fn seeds_and_shard(a: &SweepArgs) -> Result<(SeedRange, Shard)> {
    let streaming = a.until_failure || a.time_budget.is_some();
    let seeds = match (&a.seeds, streaming) {
        (Some(s), _) => SeedRange::parse(s)?,
        (None, false) => SeedRange {
            start: 0,
            end: 1000,
        },
        (None, true) => SeedRange {
            start: 0,
            end: u64::MAX,
        },
    };
    let shard = a
        .shard
        .as_deref()
        .map(Shard::parse)
        .transpose()?
        .unwrap_or(Shard::WHOLE);
    if shard.count(seeds) == 0 {
        anyhow::bail!(
            "--shard {shard} holds no seed of {seeds} ({} seeds): a shard that runs nothing checks nothing",
            seeds.len()
        );
    }
    Ok((seeds, shard))
}

/// `--jobs`: 1 to [`MAX_JOBS`] worker threads (none given: the sweep's default).
fn jobs(a: &SweepArgs) -> Result<Option<usize>> {
    match a.jobs {
        Some(0) => Err(sweep::UsageError::Jobs.into()),
        Some(j) if j > MAX_JOBS => {
            anyhow::bail!("--jobs {j}: at most {MAX_JOBS} worker threads")
        }
        j => Ok(j),
    }
}

/// A failing seed's line, printed as the sweep finds it, with its replay command.
fn print_failure(f: &sweep::Failure) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "FAIL seed {}: {} ({}) {}\n  replay: {}",
        f.seed,
        f.invariant,
        f.invariants.join(","),
        f.detail,
        crate::render::pasteable(&f.replay)
    );
    let _ = out.flush();
}

pub fn sweep(a: &SweepArgs) -> Result<ExitCode> {
    let (seeds, shard) = seeds_and_shard(a)?;
    let jobs = jobs(a)?;
    let time_budget = a.time_budget.as_deref().map(parse_duration).transpose()?;
    let mut sc = load_to_run(&a.scenario, false, a.allow_expensive)?;
    overlay(&mut sc, &a.faults)?;
    let opts = SweepOptions {
        seeds,
        shard,
        jobs,
        bugs: bugs(a.bugs.as_deref())?,
        progress: !a.quiet,
        check_determinism: a.check_determinism,
        audit: a.audit,
        stop_at_first: a.first || a.until_failure,
        time_budget,
        interrupt: Some(interrupt_flag()),
        ..SweepOptions::default()
    };
    let path = a.scenario.display().to_string();
    // After the Ctrl-C handler is in place: from here an interrupt summarises.
    eprintln!(
        "sweeping {} seeds of {} (shard {}); Ctrl-C stops and summarises",
        shard.count(seeds),
        seeds,
        shard
    );
    let summary = sweep::run_sweep_streaming(&sc, &path, &opts, &mut print_failure)?;
    print!("{}", crate::render::pasteable(&summary.render()));
    if let Some(j) = &a.json {
        write_json(j, &summary)?;
    }
    // A violation is the stronger verdict; a sweep that stopped early does not judge
    // reachability (`judges_reach`).
    Ok(if !summary.clean() {
        ExitCode::from(1)
    } else if summary.stopped.as_deref() == Some("interrupted") {
        ExitCode::from(130)
    } else if let Some(code) = reach_verdict(&summary) {
        code
    } else {
        ExitCode::SUCCESS
    })
}

pub fn replay(a: &ReplayArgs) -> Result<ExitCode> {
    let mut sc = load_to_run(&a.scenario, a.gpu == "host", a.allow_expensive)?;
    overlay(&mut sc, &a.faults)?;
    let path = a.scenario.display().to_string();
    let opts = replay_options(a)?;
    if a.shrink && a.reduce.is_some() {
        anyhow::bail!("--shrink searches its own reduction: drop --reduce");
    }
    // The minimal failing case first: shrink, then show the shrunk run's report.
    let shrunk = if a.shrink {
        shrunk_first(&sc, a.seed, &opts, &path)?
    } else {
        None
    };
    let r = replay::replay(&sc, &path, &opts, a.check_determinism)?;
    print!("{}", crate::render::pasteable(&r.text));
    write_replay_files(a, &path, shrunk.as_ref(), &r)?;
    let clean = r.outcome.clean() && r.deterministic != Some(false) && shrunk.is_none();
    Ok(verdict(clean))
}

/// What `kvsim replay`'s arguments ask of the replay.
fn replay_options(a: &ReplayArgs) -> Result<ReplayOptions> {
    Ok(ReplayOptions {
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
        // With --shrink the minimal case comes first and the full trace only on
        // request; without it, the full trace unless --brief.
        full_trace: if a.shrink { a.full_trace } else { !a.brief },
    })
}

/// `--shrink`: the seed's minimal failing case, printed with its report before the
/// seed as drawn (`None` when the seed does not fail).
fn shrunk_first(
    sc: &Scenario,
    seed: u64,
    opts: &ReplayOptions,
    path: &str,
) -> Result<Option<shrink::Shrunk>> {
    println!("== minimal failing case ==");
    match shrink::shrink(sc, seed, opts.bugs, None, 2_000)? {
        None => {
            println!("the seed does not fail; nothing to shrink\n");
            Ok(None)
        }
        Some(s) => {
            println!("{}", crate::render::pasteable(&s.summary()));
            if let Some(rep) = report::failure_report(&s.outcome, path) {
                print!("{}", crate::render::pasteable(&rep));
            }
            println!("\n== the seed as drawn ==");
            Ok(Some(s))
        }
    }
}

/// `--trace-json` and `--html`: the shrunk run's when there is one (the smallest to
/// study), else the replay's.
fn write_replay_files(
    a: &ReplayArgs,
    path: &str,
    shrunk: Option<&shrink::Shrunk>,
    r: &replay::Replay,
) -> Result<()> {
    if let Some(j) = &a.trace_json {
        let (what, out) = match shrunk {
            Some(s) => ("the shrunk run's", &s.outcome),
            None => ("the run's", &r.outcome),
        };
        replay::write_trace_json(&out.header, &out.trace, j)
            .with_context(|| format!("writing {}", j.display()))?;
        println!(
            "trace: {what} {} events written to {}",
            out.trace.len(),
            j.display()
        );
    }
    if let Some(file) = &a.html {
        let (out, notes) = match shrunk {
            Some(s) => (
                &s.outcome,
                vec![format!(
                    "the shrunk run of seed {}: {}",
                    a.seed,
                    s.summary()
                )],
            ),
            None => (&r.outcome, Vec::new()),
        };
        let mut t = kvsim_oracle::timeline::Timeline::new(
            &out.header,
            &out.trace,
            &out.findings,
            report::replay_command(path, out),
        );
        t.notes = notes;
        println!("{}", crate::html::write(file, &t)?);
    }
    Ok(())
}

pub fn merge(a: &MergeArgs) -> Result<ExitCode> {
    let mut parts = Vec::new();
    for f in &a.files {
        let text = read_limited(f, MAX_SUMMARY_BYTES)?;
        let s: SweepSummary = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sweep summary", f.display()))?;
        parts.push(s);
    }
    let merged = SweepSummary::merge(&parts)?;
    print!("{}", crate::render::pasteable(&merged.render()));
    println!("  merged          {}", merged.coverage());
    if let Some(j) = &a.json {
        write_json(j, &merged)?;
    }
    // A violation is the stronger verdict; a clean merge that misses seeds is not a
    // pass; a complete one judges the declared paths over all its shards' seeds.
    Ok(if !merged.clean() {
        ExitCode::from(1)
    } else if !merged.complete() {
        eprintln!("error: incomplete sweep: {}", merged.coverage());
        ExitCode::from(3)
    } else if let Some(code) = reach_verdict(&merged) {
        code
    } else {
        ExitCode::SUCCESS
    })
}
