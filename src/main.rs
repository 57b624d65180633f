//! The `kvsim` command line: parse, call a library function, print. No logic here.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvsim_engine::bugs::BugSet;
use kvsim_sim::{run_scenario, Backend, RunOptions};
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
        /// Stream the run's trace (the documented schema) to this file as it runs, in
        /// constant memory, for `kvsim audit` or any other checker.
        #[arg(long, value_name = "FILE")]
        trace_json: Option<PathBuf>,
        /// Run a scenario whose estimated cost exceeds the budget.
        #[arg(long)]
        allow_expensive: bool,
    },
    /// The default suite (what `cargo run --release` runs); each row is announced on
    /// stderr as it starts.
    Suite {
        /// Do not announce rows.
        #[arg(long)]
        quiet: bool,
    },
    /// Run many seeds of a scenario in parallel and summarise (exit 1 on a violation).
    Sweep(kvsim::cmd_sim::SweepArgs),
    /// Replay one seed with its full trace; optionally shrink it or write JSON.
    Replay(kvsim::cmd_sim::ReplayArgs),
    /// Merge the JSON summaries of a sweep's shards.
    Merge(kvsim::cmd_sim::MergeArgs),
    /// Exhaust a model of the handoff with stateright (the engine's own nodes).
    Check(kvsim::cmd_check::CheckArgs),
    /// Hunt every historical bug switch with both tools; write target/reports/bugs.{md,svg}.
    Bugs(kvsim::cmd_bugs::BugsArgs),
    /// The minimum safe lease of vLLM's pull for a scenario: sweep seeds at each
    /// candidate lease and print the failing seeds and the shortest clean one.
    LeaseFloor(kvsim::cmd_lease::LeaseFloorArgs),
    /// Judge a run from its trace files alone (any engine that writes the schema).
    Audit(kvsim::cmd_audit::AuditArgs),
    /// Serve a scenario's topology for real: threads, TCP, a monotonic clock.
    Serve(kvsim::serve::ServeArgs),
    /// Load a running server's client endpoint and print requests/s and latency.
    BenchClient(kvsim::serve::BenchArgs),
    /// Requests/s, p50/p99 latency and time to first token of an HTTP `/generate`
    /// (kvsim's front, a worker, or SGLang's router) over kept-alive connections.
    BenchHttp(kvsim::serve::BenchHttpArgs),
    /// The transfer path's throughput against a plain TCP copy of the same bytes.
    BenchTransfer(kvsim::serve::BenchTransferArgs),
    /// The write-ups' pre-flight gate against running servers (SGLang's or kvsim
    /// serve's HTTP front), numbers by hand, or a scenario: exit 0 pass, 1 fail, 2 unread.
    Preflight(kvsim_ops::preflight::PreflightArgs),
    /// Canary-marker load against SGLang's /generate: exit 1 on a foreign marker or an
    /// over-length prompt answered 200.
    Canary(kvsim_ops::canary::CanaryArgs),
    /// A canary load against a running server: exit 1 when a reply leaks.
    CanaryClient(kvsim_ops::canary::LineCanaryArgs),
    /// List the bug switches, models, invariants, protocol paths or scenarios, one line each.
    List {
        /// bugs, models, invariants, paths or scenarios.
        what: String,
        /// Where `list scenarios` looks.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
    },
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

fn cmd_run(
    path: &Path,
    bugs: Option<&str>,
    seed: Option<u64>,
    gpu: &str,
    (trace, trace_json): (bool, Option<&Path>),
    allow_expensive: bool,
) -> Result<ExitCode> {
    let sc = kvsim::cmd_sim::load_to_run(path, gpu == "host", allow_expensive)?;
    let opts = RunOptions {
        seed,
        bugs: parse_bugs(bugs)?,
        backend: backend(gpu)?,
        trace: trace_json.is_none(),
        ..Default::default()
    };
    let t = Instant::now();
    let out = match trace_json {
        None => run_scenario(&sc, &opts)?,
        Some(file) => {
            let plan = kvsim_sim::plan::Plan::build(
                &sc,
                opts.seed.unwrap_or(sc.seed),
                opts.bugs,
                &opts.reduction,
            )?;
            let f = std::fs::File::create(file)
                .with_context(|| format!("cannot create {}", file.display()))?;
            let (sink, error) =
                kvsim_sim::StreamTrace::new(std::io::BufWriter::with_capacity(1 << 20, f));
            let out = kvsim_sim::run_plan_json(&plan, opts.backend, Box::new(sink));
            if let Some(e) = error.borrow_mut().take() {
                anyhow::bail!("writing {}: {e}", file.display());
            }
            out
        }
    };
    let wall_s = t.elapsed().as_secs_f64();
    print!(
        "{}",
        kvsim::render::pasteable(&kvsim::render::outcome(
            &out,
            &path.display().to_string(),
            trace
        ))
    );
    println!("({wall_s:.3}s wall)");
    Ok(if out.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Some(Command::Serve(_))) {
        die_quietly_on_a_closed_pipe();
    }
    let res = match cli.command {
        Some(Command::Run {
            scenario,
            bugs,
            seed,
            gpu,
            trace,
            trace_json,
            allow_expensive,
        }) => cmd_run(
            &scenario,
            bugs.as_deref(),
            seed,
            &gpu,
            (trace, trace_json.as_deref()),
            allow_expensive,
        ),
        Some(Command::Suite { quiet }) => kvsim::suite::run_default_suite(quiet),
        None => kvsim::suite::run_default_suite(false),
        Some(Command::Sweep(a)) => kvsim::cmd_sim::sweep(&a),
        Some(Command::Replay(a)) => kvsim::cmd_sim::replay(&a),
        Some(Command::Merge(a)) => kvsim::cmd_sim::merge(&a),
        Some(Command::Check(args)) => kvsim::cmd_check::run(&args),
        Some(Command::Bugs(args)) => kvsim::cmd_bugs::run(&args),
        Some(Command::Audit(args)) => kvsim::cmd_audit::run(&args),
        Some(Command::LeaseFloor(args)) => kvsim::cmd_lease::run(&args),
        Some(Command::Serve(_)) => serve_in_its_own_binary(),
        Some(Command::BenchClient(args)) => kvsim::serve::bench(&args),
        Some(Command::BenchHttp(args)) => kvsim::serve::bench_http(&args),
        Some(Command::Preflight(args)) => kvsim_ops::preflight::run(&args, &|path| {
            kvsim::cmd_sim::load_to_run(path, false, true)
        }),
        Some(Command::Canary(args)) => kvsim_ops::canary::run(&args),
        Some(Command::CanaryClient(args)) => kvsim_ops::canary::run_line(&args),
        Some(Command::BenchTransfer(args)) => kvsim::serve::bench_transfer(&args),
        Some(Command::List { what, dir }) => kvsim::render::list(&what, &dir)
            .map(|text| {
                print!("{text}");
                ExitCode::SUCCESS
            })
            .map_err(anyhow::Error::msg),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `kvsim serve ARGS`: run the serving binary, `kvsim-server`, found beside this one,
/// with the same arguments (clap has checked them already). It links none of the fault
/// injection this binary carries for the simulator and the models; on Unix it replaces
/// this process, so a signal sent to `kvsim serve` reaches the server itself.
fn serve_in_its_own_binary() -> Result<ExitCode> {
    let me = std::env::current_exe().context("cannot find this executable's path")?;
    let server = me.with_file_name(format!("kvsim-server{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        server.is_file(),
        "kvsim serve runs {}, which is not there: `cargo build --release` (or `cargo \
         install --path .`) builds it beside kvsim",
        server.display()
    );
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect();
    let mut cmd = std::process::Command::new(&server);
    cmd.args(&args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = cmd.exec();
        Err(err).with_context(|| format!("cannot run {}", server.display()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .with_context(|| format!("cannot run {}", server.display()))?;
        Ok(ExitCode::from(
            status.code().unwrap_or(2).clamp(0, 255) as u8
        ))
    }
}

/// `kvsim ... | head` closes the pipe early: a command-line tool should then end
/// quietly, as `cat` does, rather than panic in `println!` (Rust ignores SIGPIPE, so the
/// write fails and `println!` panics on the error). Restore the default disposition.
/// Not for `kvsim serve`, whose peers closing their sockets must never end the process
/// (its sockets' writes fail with an error either way; this only keeps stdout honest).
fn die_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default at the start of `main`,
    // before any thread is spawned, has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
