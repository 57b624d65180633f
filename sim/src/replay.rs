//! Replay: one seed of a scenario, traced, as text and as JSON.
//!
//! A replay re-runs exactly the run a sweep ran (same scenario, seed, bug switches
//! and, for a shrunk run, the same reduction) with the event log on, and renders the
//! swarm draw, the full trace, the per-request table, the verdict and, when an
//! invariant broke, the failure report. `--trace-json` writes every log entry as one
//! JSON object per line (schema: `docs/TRACE.md`).

use crate::plan::{Plan, Reduction};
use crate::report;
use crate::scenario::{Scenario, ScenarioError};
use crate::{run_plan, Backend, RunOutcome};
use kvsim_engine::bugs::BugSet;
use kvsim_oracle::schema::{entry_line, header_line, Entry, RunHeader};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub seed: u64,
    pub bugs: Option<BugSet>,
    pub reduction: Reduction,
    pub backend: Backend,
    /// Print the full trace (not only the failure report).
    pub full_trace: bool,
}

/// A replayed run and its rendering.
pub struct Replay {
    pub outcome: RunOutcome,
    pub text: String,
    /// The run was repeated and both traces agreed (when asked for).
    pub deterministic: Option<bool>,
}

/// Replay one run. `path` names the scenario file in the replay command.
pub fn replay(
    sc: &Scenario,
    path: &str,
    opts: &ReplayOptions,
    check_determinism: bool,
) -> Result<Replay, ScenarioError> {
    let plan = Plan::build(sc, opts.seed, opts.bugs, &opts.reduction)?;
    let out = run_plan(&plan, opts.backend, true);
    let deterministic = check_determinism.then(|| {
        let again = run_plan(&plan, opts.backend, true);
        again.trace_hash == out.trace_hash && again.trace == out.trace
    });
    let text = render(&out, path, opts.full_trace, deterministic);
    Ok(Replay {
        outcome: out,
        text,
        deterministic,
    })
}

/// The text of a replay: draw, full trace, requests, verdict, failure report.
pub fn render(
    out: &RunOutcome,
    path: &str,
    full_trace: bool,
    deterministic: Option<bool>,
) -> String {
    let mut s = String::new();
    s.push_str(&out.plan.describe());
    if full_trace {
        let _ = writeln!(s, "== full trace ==");
        s.push_str(&report::render_trace(&out.trace));
    }
    let _ = writeln!(s, "== requests ==");
    s.push_str(&report::render_requests(&out.requests, &out.replies));
    let st = &out.stats;
    let pauses = match st.pauses {
        0 => String::new(),
        n => format!(", {n} pauses"),
    };
    let _ = writeln!(
        s,
        "{} events, {} simulated; faults: {} control messages lost, {} duplicated, {} dropped; {} of {} KV writes failed, {} late, {} flushed, {} with a data fault; {} crashes{pauses}; {} client cancels; trace hash {}",
        out.events,
        report::secs(out.sim_ns),
        st.lost,
        st.duplicated,
        st.dropped,
        st.writes_failed,
        st.writes,
        st.writes_late,
        st.writes_flushed,
        st.data_faults,
        st.crashes,
        st.cancels,
        report::trace_hash(out.trace_hash)
    );
    if let Some(d) = deterministic {
        let _ = writeln!(
            s,
            "determinism: {}",
            if d {
                "ran twice, same trace byte for byte"
            } else {
                "FAILED: two runs of the same seed differ"
            }
        );
    }
    let _ = writeln!(s, "verdict: {}", verdict(out));
    if let Some(r) = report::failure_report(out, path) {
        s.push_str(&r);
    }
    s
}

/// One line: `CLEAN`, or `VIOLATED S5, S3`, and the detections a defense made.
pub fn verdict(out: &RunOutcome) -> String {
    let names = |v: Vec<kvsim_engine::invariant::Invariant>| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let detected = out.detected();
    let det = if detected.is_empty() {
        String::new()
    } else {
        format!(
            "; DETECTED {} (a defense refused it, nothing leaked)",
            names(detected)
        )
    };
    if out.clean() {
        format!("CLEAN (no invariant violated, no reply echoed another request's tokens){det}")
    } else {
        format!("VIOLATED {}{det}", names(out.broken()))
    }
}

/// Write a run's trace as JSON lines: the header, then one entry per line.
pub fn write_trace_json(header: &RunHeader, entries: &[Entry], path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut w = std::io::BufWriter::new(file);
    writeln!(w, "{}", header_line(header))?;
    for e in entries {
        writeln!(w, "{}", entry_line(e))?;
    }
    w.flush()
}
