//! The `kvsim` command line: parse, call a library function, print. No logic here.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvsim_engine::bugs::BugSet;
use kvsim_sim::report;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_scenario, Backend, RunOptions, RunOutcome};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "kvsim",
    version,
    about = "Find KV-cache ownership bugs in disaggregated inference engines"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario end to end and check every invariant.
    Run {
        /// A scenario file (TOML).
        scenario: PathBuf,
        /// Bug switches to enable, comma-separated (replaces the file's list).
        #[arg(long, value_name = "LIST")]
        bugs: Option<String>,
        /// Seed (overrides the file's).
        #[arg(long)]
        seed: Option<u64>,
        /// KV backend: symbolic (white-box oracles) or host (real f32 arithmetic).
        #[arg(long, default_value = "symbolic")]
        gpu: String,
        /// Print the full event trace.
        #[arg(long)]
        trace: bool,
    },
    /// The default suite (what `cargo run --release` runs).
    Suite,
    /// Exhaust a model of the handoff with stateright (the engine's own nodes).
    Check(kvsim::cmd_check::CheckArgs),
}

fn parse_bugs(list: Option<&str>) -> Result<Option<BugSet>> {
    list.map(|l| BugSet::parse(l).map_err(anyhow::Error::from))
        .transpose()
}

fn backend(name: &str) -> Result<Backend> {
    match name {
        "symbolic" => Ok(Backend::Symbolic),
        "host" => Ok(Backend::Host),
        other => anyhow::bail!("unknown --gpu `{other}` (known: symbolic, host)"),
    }
}

fn load(path: &Path) -> Result<Scenario> {
    Scenario::load(path).with_context(|| format!("loading {}", path.display()))
}

fn print_outcome(out: &RunOutcome, path: &Path, wall_s: f64, show_trace: bool) {
    println!(
        "scenario {} (seed {}, bugs: {})",
        out.scenario, out.seed, out.bugs
    );
    if show_trace {
        print!("{}", report::render_trace(&out.trace));
    }
    print!("{}", report::render_requests(&out.requests, &out.replies));
    println!(
        "{} events, {} simulated, {:.3}s wall",
        out.events,
        report::secs(out.sim_ns),
        wall_s
    );
    if out.clean() {
        println!(
            "verdict: CLEAN (no invariant violated, no reply echoed another request's tokens)"
        );
    } else {
        let names: Vec<String> = out.broken().iter().map(|i| i.to_string()).collect();
        println!("verdict: VIOLATED {}", names.join(", "));
        print!("{}", report::render_findings(&out.findings));
        let bugs = if out.bugs.is_empty() {
            String::new()
        } else {
            format!(" --bugs {}", out.bugs)
        };
        println!(
            "replay: kvsim run {} --seed {}{} --trace",
            path.display(),
            out.seed,
            bugs
        );
    }
}

fn cmd_run(
    path: &Path,
    bugs: Option<&str>,
    seed: Option<u64>,
    gpu: &str,
    trace: bool,
) -> Result<ExitCode> {
    let sc = load(path)?;
    let opts = RunOptions {
        seed,
        bugs: parse_bugs(bugs)?,
        backend: backend(gpu)?,
        trace: true,
    };
    let t = Instant::now();
    let out = run_scenario(&sc, &opts)?;
    print_outcome(&out, path, t.elapsed().as_secs_f64(), trace);
    Ok(if out.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Some(Command::Run {
            scenario,
            bugs,
            seed,
            gpu,
            trace,
        }) => cmd_run(&scenario, bugs.as_deref(), seed, &gpu, trace),
        Some(Command::Suite) | None => kvsim::suite::run_default_suite(),
        Some(Command::Check(args)) => kvsim::cmd_check::run(&args),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
