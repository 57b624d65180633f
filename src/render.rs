//! What `kvsim run` prints for one outcome, as a string (so tests snapshot exactly
//! what a person sees). Wall-clock figures are printed by the caller, never here, so
//! the text is a pure function of the run. Also the `kvsim list` tables, and
//! [`pasteable`], which turns the `kvsim ...` commands printed for a person into
//! `cargo run --release -- ...` when no `kvsim` is on the PATH.

use kvsim_engine::bugs::Bug;
use kvsim_engine::invariant::Invariant;
use kvsim_models::ModelSpec;
use kvsim_sim::reach::ReachPath;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{report, RunOutcome};
use std::fmt::Write;
use std::path::Path;

/// The subcommands whose printed command lines [`pasteable`] rewrites.
const SUBCOMMANDS: [&str; 7] = ["run", "replay", "sweep", "merge", "check", "bugs", "list"];

/// Is an executable `kvsim` on the PATH?
pub fn kvsim_on_path() -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            let exe = dir.join(format!("kvsim{}", std::env::consts::EXE_SUFFIX));
            exe.is_file()
        })
    })
}

/// `text` with its `kvsim SUBCOMMAND ...` command lines runnable as pasted: kept when
/// `on_path`, else spelled `cargo run --release -- SUBCOMMAND ...` (run from the
/// repository; `cargo install --path .` puts `kvsim` on the PATH).
pub fn pasteable_with(text: &str, on_path: bool) -> String {
    if on_path {
        return text.to_string();
    }
    let mut out = text.to_string();
    for sub in SUBCOMMANDS {
        out = out.replace(
            &format!("kvsim {sub} "),
            &format!("cargo run --release -- {sub} "),
        );
    }
    out
}

/// [`pasteable_with`] for this process's PATH.
pub fn pasteable(text: &str) -> String {
    pasteable_with(text, kvsim_on_path())
}

/// One line per bug switch: its name and what it re-introduces.
fn bug_line(b: Bug) -> &'static str {
    match b {
        Bug::GateChecksFinishedOnly => "SGLang #30233: a rejected over-length prompt walks through the handoff (breaks S5)",
        Bug::NoLengthAgreement => "decode accepts a transfer without checking tokens and pages against its reservation (S4, then S3)",
        Bug::SuccessOverwritesAbort => "SGLang #33507: transfer success wipes a pending abort (S6)",
        Bug::DecodeReleaseImmediate => "decode frees an aborted request's pages while writes are in flight (S2, then S3)",
        Bug::PrefillReleaseBeforeDrain => "SGLang #38961: prefill frees source pages while its sends still read them (S2)",
        Bug::FailedSendReportsDrained => "#43719 class: one failed write reports the room drained early (S9)",
        Bug::AckIgnoresGeneration => "a drain ack for an earlier use of a room releases the current quarantine (S9)",
        Bug::RouterCancelsOneHalf => "SGLang #9726: a client disconnect aborts prefill but never tells decode (L1/L4)",
        Bug::DoubleFreeOnFinish => "#15734 class: a second release path frees a finished request's pages again (S8)",
        Bug::AdmitBeyondPool => "SGLang #29249: admission checks the context only; a prompt over the pool waits forever (L5)",
        Bug::FailOpenOnRecvError => "vLLM #52234: a KV receive failure is answered 200 with stale pages (S3/S6)",
        Bug::SkipPreflight => "the GLM-5.3 configuration: a node starts with a pool below its context (pre-flight)",
        Bug::AbortAfterSuccess => "the router aborts the other half after a half succeeded: safe, but fault-free requests fail (model checker: an error answer has a cause)",
        Bug::ChunkIndexByPosition => "SGLang #30545: after a prefill prefix hit, chunks identified by grid index land at wrong offsets in the room's own pages (S4, S3 by position)",
        Bug::DuplicateRoomJoinsLive => "SGLang #40125 / Mooncake #1400: a start for a live room from another request takes the room's bootstrap state over (S10, S4)",
        Bug::RetryReusesRoom => "kthena #1423 / SGLang #34570 class: sglang-router replays a retry in the room of the attempt it gave up, which may still be live (S7)",
        Bug::FirstFailedHandleFrees => "vLLM #56104: the first failed per-rank READ handle fails the request and frees its pages while sibling handles still land (S2)",
        Bug::FailedSliceCountedTwice => "Mooncake #1865: a failed handle is counted again for a sibling, so the count completes early and the pages are freed while the sibling lands (S2)",
        Bug::RejectedScatterReturnsOk => "Mooncake #3000: a handle whose fragments were all rejected returns OK with nothing written; decode runs on a slice never read (S3)",
        Bug::FailedHandleSkipped => "vLLM #50754: a failed handle is logged and skipped, so the count of handles never completes and the request never ends (L1)",
        Bug::LeaseIgnoresHeartbeat => "vLLM #20139 (#21570, #25897): prefill's block timeout runs from the finish and heartbeats never renew it; a backed-up decode reads freed blocks (S2)",
        Bug::ReadErrorLeavesPending => "vLLM #55181: a NIXL transfer exception leaves the request with no terminal state; its pages are never let go (L3)",
        Bug::PrefillDropsFailedPageList => "issue 37 class 6 (kvsim before f4fe9ff): prefill drops the page list of a room it failed; decode holds its pages until its own waiting timeout (L1-L4 within the liveness bound)",
    }
}

/// `kvsim list WHAT`: bugs, models, invariants, paths (the protocol paths a
/// scenario may declare in `reach`) or scenarios (from `scenarios_dir`), one per line
/// with a one-line description.
pub fn list(what: &str, scenarios_dir: &Path) -> Result<String, String> {
    let mut s = String::new();
    match what {
        "bugs" => {
            for b in Bug::ALL {
                let _ = writeln!(s, "{:<30} {}", b.name(), bug_line(b));
            }
        }
        "paths" => {
            for p in ReachPath::ALL {
                let _ = writeln!(s, "{:<22} {}", p.name(), p.meaning());
            }
        }
        "invariants" => {
            for i in Invariant::ALL {
                let _ = writeln!(s, "{:<4} {}", i.to_string(), i.statement());
            }
        }
        "models" => {
            for name in ModelSpec::NAMES {
                let about = ModelSpec::standard(name)
                    .map(|m| m.about.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_default();
                let _ = writeln!(s, "{name:<20} {about}");
            }
        }
        "scenarios" => {
            let mut files: Vec<_> = std::fs::read_dir(scenarios_dir)
                .map_err(|e| format!("cannot list {}: {e}", scenarios_dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            files.sort();
            for f in files {
                let line = match Scenario::load(&f) {
                    Ok(sc) => sc
                        .description
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                    Err(e) => format!("(does not load: {e})"),
                };
                let _ = writeln!(s, "{:<42} {line}", f.display());
            }
        }
        other => {
            return Err(format!(
                "unknown list `{other}` (known: bugs, models, invariants, paths, scenarios)"
            ))
        }
    }
    Ok(s)
}

/// The replay command for an outcome.
pub fn replay_command(scenario_path: &str, out: &RunOutcome) -> String {
    let bugs = if out.bugs.is_empty() {
        String::new()
    } else {
        format!(" --bugs {}", out.bugs)
    };
    format!(
        "kvsim run {scenario_path} --seed {}{bugs} --trace",
        out.seed
    )
}

/// Header, optional trace, per-request table, verdict, findings and replay command.
pub fn outcome(out: &RunOutcome, scenario_path: &str, with_trace: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} (seed {}, bugs: {})",
        out.scenario, out.seed, out.bugs
    );
    if with_trace {
        s.push_str(&report::render_trace(&out.trace));
    }
    s.push_str(&report::render_requests(&out.requests, &out.replies));
    let _ = writeln!(
        s,
        "{} events, {} simulated",
        out.events,
        report::secs(out.sim_ns)
    );
    let _ = writeln!(s, "verdict: {}", kvsim_sim::replay::verdict(out));
    if !out.findings.is_empty() {
        s.push_str(&report::render_findings(&out.findings));
    }
    if !out.clean() {
        let _ = writeln!(s, "replay: {}", replay_command(scenario_path, out));
    }
    s
}
