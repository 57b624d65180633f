//! What `kvsim run` prints for one outcome, as a string (so tests snapshot exactly
//! what a person sees). Wall-clock figures are printed by the caller, never here, so
//! the text is a pure function of the run.

use kvsim_sim::{report, RunOutcome};
use std::fmt::Write;

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
    if out.clean() {
        s.push_str(
            "verdict: CLEAN (no invariant violated, no reply echoed another request's tokens)\n",
        );
    } else {
        let names: Vec<String> = out.broken().iter().map(|i| i.to_string()).collect();
        let _ = writeln!(s, "verdict: VIOLATED {}", names.join(", "));
        s.push_str(&report::render_findings(&out.findings));
        let _ = writeln!(s, "replay: {}", replay_command(scenario_path, out));
    }
    s
}
