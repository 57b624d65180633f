//! `kvsim check`: exhaust a standard model with stateright, print the verdict.
//!
//! Parse, call [`kvsim_models::check`], print. Exit status: 0 when every `always`
//! property holds and every expected path was reached, 1 on a counterexample (printed
//! as a readable sequence of engine events, then replayed through the simulator), 2 on
//! a usage error.

use anyhow::{bail, Context, Result};
use clap::Args;
use kvsim_engine::bugs::BugSet;
use kvsim_models::two_phase::{self, TwoPhaseRun};
use kvsim_models::{
    check_with_progress, CheckOptions, CheckReport, MemoMode, ModelSpec, Progress, Verdict,
};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The model to check: handoff, abort-race, timeout-race, crash-race (the standard
    /// models), data-fault, timer-refire, stale-control (the fault-kind models),
    /// their `-small` reduced bounds (`kvsim list models`), or `all` (the four
    /// standard models one after another).
    #[arg(long, default_value = "handoff")]
    pub model: String,
    /// Bug switches to enable, comma-separated.
    #[arg(long, value_name = "LIST")]
    pub bugs: Option<String>,
    /// Checker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Explore paths of at most D steps.
    #[arg(long, value_name = "D")]
    pub depth: Option<usize>,
    /// Search depth-first (faster, less memory; counterexamples not shortest).
    #[arg(long)]
    pub dfs: bool,
    /// Symmetry reduction over interchangeable clients (implies --dfs).
    #[arg(long)]
    pub symmetry: bool,
    /// Compute every node transition with the engine instead of reusing one computed
    /// before in another interleaving (slower; same states and verdicts).
    #[arg(long)]
    pub no_memo: bool,
    /// Stop at the first counterexample (the time a user waits for one): the search
    /// is then not exhaustive. `kvsim bugs --time-to-counterexample` times this.
    #[arg(long)]
    pub until_first: bool,
    /// Serve stateright's Explorer on this loopback address instead of checking.
    #[arg(long, value_name = "ADDR")]
    pub explore: Option<String>,
    /// Print only the summary (no counterexample traces, no progress lines).
    #[arg(long)]
    pub quiet: bool,
    /// Milliseconds between progress lines on stderr (states, unique states/s,
    /// queue depth).
    #[arg(long, value_name = "MS", default_value_t = 2000, hide = true)]
    pub progress_ms: u64,
    /// Benchmark: run the check N times, print each run's rate, then the report of
    /// the median run and the median, best and worst rates.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeat: usize,
    /// Benchmark: after each run, check stateright's own two-phase commit example
    /// (8 resource managers) with the same search and threads, and print its rate and
    /// the ratio of this model's rate to it.
    #[arg(long = "vs-2pc")]
    pub vs_2pc: bool,
    /// Write the first counterexample's timeline to FILE as one self-contained HTML
    /// page: the counterexample replayed through the simulator's nodes and oracle, a
    /// lane per node and the client's tenant, messages and KV writes as arrows, each
    /// room use's pages, the first violation marked in red. Its axis counts schedule
    /// steps (the model has no clock). Nothing is written when no property fails
    /// (docs/guide/timeline.md).
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
}

/// The most checker threads `check` starts.
pub const MAX_THREADS: usize = 256;

/// Refuse arguments that would check nothing or mislead: a depth bound of 0 (which
/// stateright reads as no bound), no threads or more than [`MAX_THREADS`].
fn validate(args: &CheckArgs) -> Result<()> {
    if args.depth == Some(0) {
        bail!("--depth must be at least 1 (a path of 0 steps checks nothing)");
    }
    if args.threads == 0 || args.threads > MAX_THREADS {
        bail!("--threads {}: must be 1 to {MAX_THREADS}", args.threads);
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if args.html.is_some() && (args.model == "all" || args.explore.is_some()) {
        bail!("--html draws one model's counterexample: name one model with --model, without --explore");
    }
    Ok(())
}

/// `--html FILE`: the first counterexample's timeline, from its replay through the
/// simulator's nodes and oracle.
fn write_html(report: &CheckReport, args: &CheckArgs, file: &std::path::Path) -> Result<()> {
    let Some(c) = report.counterexamples.first() else {
        println!(
            "timeline: no counterexample, so no timeline: {} not written",
            file.display()
        );
        return Ok(());
    };
    let r = match &c.replay {
        Ok(r) => r,
        Err(e) => bail!(
            "--html: the counterexample's replay through the simulator failed ({e}): no timeline to draw"
        ),
    };
    let mut header = r.header.clone();
    header.scenario = Some(format!("model {}", report.spec.name));
    let mut cmd = format!("kvsim check --model {}", args.model);
    if let Some(b) = &args.bugs {
        cmd.push_str(&format!(" --bugs {b}"));
    }
    let mut t = kvsim_oracle::timeline::Timeline::new(&header, &r.trace, &r.findings, cmd);
    t.notes = vec![
        format!(
            "counterexample for \"{}\" ({} steps), replayed through the simulator's nodes and oracle; the axis counts the schedule's steps",
            c.property,
            c.steps.len()
        ),
        format!(
            "schedule: {}",
            c.schedule
                .0
                .iter()
                .enumerate()
                .map(|(i, s)| format!("{}. {s}", i + 1))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    ];
    println!("{}", crate::html::write(file, &t)?);
    Ok(())
}

/// One progress line of a running check.
pub fn progress_line(p: &Progress) -> String {
    format!(
        "progress: {:.1} s, {} states, {} unique ({:.0} unique states/s), queue {}, depth {}",
        p.elapsed.as_secs_f64(),
        p.states,
        p.unique,
        p.unique_per_sec(),
        p.queue.map_or("-".to_string(), |q| q.to_string()),
        p.max_depth
    )
}

pub fn run(args: &CheckArgs) -> Result<ExitCode> {
    validate(args)?;
    if args.model == "all" {
        return run_all(args);
    }
    let mut spec = ModelSpec::standard(&args.model)?;
    if let Some(list) = &args.bugs {
        spec = spec.with_bugs(BugSet::parse(list)?);
    }
    if let Some(addr) = &args.explore {
        return explore(spec, addr, args.threads);
    }
    let report = median_run(&spec, args)?;
    let code = verdict(&report, args.quiet);
    if let Some(file) = &args.html {
        write_html(&report, args, file)?;
    }
    Ok(code)
}

/// `--model all`: the standard models one after another; exit 1 if any fails.
fn run_all(args: &CheckArgs) -> Result<ExitCode> {
    let mut worst = ExitCode::SUCCESS;
    for name in ModelSpec::STANDARD {
        let one = CheckArgs {
            model: name.to_string(),
            ..args.clone()
        };
        if run(&one)? != ExitCode::SUCCESS {
            worst = ExitCode::from(1);
        }
        println!();
    }
    Ok(worst)
}

/// `--explore ADDR`: stateright's Explorer on a loopback address, until Ctrl-C.
fn explore(spec: ModelSpec, addr: &str, threads: usize) -> Result<ExitCode> {
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("--explore expects IP:PORT, got `{addr}`"))?;
    if !addr.ip().is_loopback() {
        bail!("--explore serves only on a loopback address (got {addr})");
    }
    // The Explorer panics inside stateright on a port it cannot bind; try it
    // first and report a clear error instead.
    if let Err(e) = std::net::TcpListener::bind(addr) {
        bail!("--explore: cannot listen on {addr}: {e} (is another Explorer or server using the port? pick another)");
    }
    println!(
        "Explorer for model {} on http://{addr}/ (Ctrl-C to stop)",
        spec.name
    );
    kvsim_models::check::explore(spec, threads, addr)?;
    Ok(ExitCode::SUCCESS)
}

/// The checker's options from the arguments.
fn options(args: &CheckArgs) -> CheckOptions {
    CheckOptions {
        threads: args.threads,
        depth: args.depth,
        dfs: args.dfs,
        symmetry: args.symmetry,
        memo: if args.no_memo {
            MemoMode::Off
        } else {
            MemoMode::On
        },
        until_first: args.until_first,
    }
}

/// Check `spec` `--repeat` times (each run's rate printed when more than one), and the
/// report of the median run, with the median, best and worst rates.
fn median_run(spec: &ModelSpec, args: &CheckArgs) -> Result<CheckReport> {
    let options = options(args);
    let mut runs = Vec::with_capacity(args.repeat);
    let mut yardsticks = Vec::new();
    for i in 0..args.repeat {
        let every = (!args.quiet).then(|| Duration::from_millis(args.progress_ms.max(1)));
        let r = check_with_progress(spec.clone(), &options, every, &mut |p| {
            eprintln!("{}", progress_line(&p))
        })?;
        if args.repeat > 1 {
            println!(
                "run {}/{}: {} unique states in {:.2} s, {:.0} unique states/s",
                i + 1,
                args.repeat,
                r.unique,
                r.elapsed.as_secs_f64(),
                r.states_per_sec()
            );
        }
        runs.push(r);
        if args.vs_2pc {
            yardsticks.push(two_phase_run(args, i));
        }
    }
    if args.vs_2pc {
        print_vs_2pc(&runs, &mut yardsticks);
    }
    runs.sort_by_key(|r| r.elapsed);
    let rates: Vec<f64> = runs.iter().map(|r| r.states_per_sec()).collect();
    let report = runs.swap_remove(runs.len() / 2);
    if args.repeat > 1 {
        println!(
            "rate over {} runs: median {:.0}, best {:.0}, worst {:.0} unique states/s ({} thread(s); per core: median / threads = {:.0})",
            args.repeat,
            report.states_per_sec(),
            rates[0],
            rates[rates.len() - 1],
            args.threads,
            report.states_per_sec() / args.threads.max(1) as f64
        );
    }
    Ok(report)
}

/// One check of stateright's two-phase commit example with this check's search and
/// threads (`--vs-2pc`), its rate printed.
fn two_phase_run(args: &CheckArgs, i: usize) -> TwoPhaseRun {
    let r = two_phase::check_2pc(two_phase::BENCH_RMS, args.threads, args.dfs);
    println!(
        "2pc run {}/{}: stateright's two-phase commit, {} resource managers: {} unique states in {:.2} s, {:.0} unique states/s{}",
        i + 1,
        args.repeat,
        r.rms,
        r.unique,
        r.elapsed.as_secs_f64(),
        r.states_per_sec(),
        if r.consistent { "" } else { " (its \"consistent\" property FAILED)" }
    );
    r
}

/// The two-phase commit yardstick's median rate and this model's median rate against
/// it, run by run and over the runs (each pair ran one after the other).
fn print_vs_2pc(runs: &[CheckReport], yardsticks: &mut [TwoPhaseRun]) {
    let mut ratios: Vec<f64> = runs
        .iter()
        .zip(yardsticks.iter())
        .map(|(r, y)| r.states_per_sec() / y.states_per_sec().max(1e-9))
        .collect();
    ratios.sort_by(f64::total_cmp);
    yardsticks.sort_by_key(|y| y.elapsed);
    let median = &yardsticks[yardsticks.len() / 2];
    println!(
        "vs 2pc: stateright's two-phase commit ({} resource managers, {} unique states) median {:.0} unique states/s; this model / 2pc, pair by pair: median {:.2}, lowest {:.2}, highest {:.2}",
        median.rms,
        median.unique,
        median.states_per_sec(),
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// Print the report (only its summary under `--quiet`) and the verdict line: exit 1 on
/// a violation or an expected path not reached.
fn verdict(report: &CheckReport, quiet: bool) -> ExitCode {
    let text = report.render();
    if quiet {
        let summary = text.split("\ncounterexample").next().unwrap_or(&text);
        print!("{summary}");
    } else {
        print!("{text}");
    }
    let unreached = report.complete
        && report
            .properties
            .iter()
            .any(|p| p.verdict == Verdict::NotReached);
    if report.violated() {
        println!("verdict: VIOLATED");
        ExitCode::from(1)
    } else if unreached {
        println!("verdict: an expected path was NOT reached: the model no longer exercises it");
        ExitCode::from(1)
    } else {
        println!(
            "verdict: {}",
            if report.complete {
                "every property holds on every reachable state"
            } else {
                "no violation within the depth bound"
            }
        );
        ExitCode::SUCCESS
    }
}
