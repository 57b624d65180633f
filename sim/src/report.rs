//! Human-readable output of a run: event descriptions, the full trace, the
//! per-request table, the verdict, and the failure report (seed, scenario, swarm
//! draw, first violated invariant, a causal trace cut down to the requests, rooms and
//! pages involved, and the command that replays it). Formatting only; nothing here
//! decides anything.

pub use crate::outcome::distinct;
use crate::outcome::RunOutcome;
use crate::scenario::PlannedRequest;
use crate::simulator::output::ClientReply;
use kvsim_engine::ids::RequestId;
use kvsim_engine::invariant::Invariant;
use kvsim_oracle::Finding;
use std::collections::BTreeMap;
use std::fmt::Write;

pub use kvsim_oracle::render::{
    causal_trace, describe_event, focus_of, render_entry, render_findings, render_tokens,
    render_trace, secs, Focus,
};

/// The per-request table of a run.
pub fn render_requests(
    requests: &[PlannedRequest],
    replies: &BTreeMap<RequestId, Vec<ClientReply>>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<7} {:<6} {:>10} {:>6}  reply (tokens from another request marked <reqN!>)",
        "request", "tenant", "prompt", "status"
    );
    for r in requests {
        let reply = replies.get(&r.req).and_then(|v| v.first());
        let (status, tokens) = match reply {
            Some(c) => (c.status.to_string(), render_tokens(r.req, &c.tokens)),
            None => ("-".into(), "(no response)".into()),
        };
        let tokens = if tokens.len() > 140 {
            format!("{}...", &tokens[..140])
        } else {
            tokens
        };
        let _ = writeln!(
            out,
            "{:<7} {:<6} {:>10} {:>6}  {}",
            r.req.to_string(),
            r.tenant.to_string(),
            r.prompt_len,
            status,
            tokens
        );
    }
    out
}

/// A run's trace hash as reports print it: 16 hex digits, or `not kept` for a run that
/// kept none ([`crate::run_plan_unhashed`]).
pub fn trace_hash(hash: Option<u64>) -> String {
    hash.map_or_else(|| "not kept".to_string(), |h| format!("{h:016x}"))
}

/// The command that replays a run.
pub fn replay_command(path: &str, out: &RunOutcome) -> String {
    let mut cmd = format!("kvsim replay {path} --seed {}", out.seed);
    if !out.bugs.is_empty() {
        let _ = write!(cmd, " --bugs {}", out.bugs);
    }
    for spec in &out.plan.fault_overlay {
        let _ = write!(cmd, " --faults '{spec}'");
    }
    if !out.plan.reduction.is_empty() {
        let _ = write!(cmd, " --reduce '{}'", out.plan.reduction);
    }
    cmd
}

/// The failure report of a traced run that violated an invariant: seed, scenario,
/// swarm draw, the first violation, the other invariants broken, the causal trace and
/// the replay command. `None` for a clean run.
pub fn failure_report(out: &RunOutcome, path: &str) -> Option<String> {
    let first = out.first().or_else(|| out.first_finding())?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "FAILURE: {} seed {} (bugs: {})",
        out.scenario, out.seed, out.bugs
    );
    s.push_str(&out.plan.describe());
    let _ = writeln!(
        s,
        "first finding at {} (event #{}): {}\n  {}",
        secs(first.at_ns),
        first.event,
        first.verdict(),
        first.violation
    );
    for e in &first.evidence {
        let _ = writeln!(s, "  evidence: {e}");
    }
    write_unfolding(&mut s, out, first);
    if !out.trace.is_empty() {
        write_causal_trace(&mut s, out, first);
    }
    let _ = writeln!(s, "replay (full trace): {}", replay_command(path, out));
    Some(s)
}

/// The findings by invariant, then the first finding of each other invariant, in
/// order: how the failure unfolded.
fn write_unfolding(s: &mut String, out: &RunOutcome, first: &Finding) {
    let mut counts: BTreeMap<Invariant, usize> = BTreeMap::new();
    for f in &out.findings {
        *counts.entry(f.violation.invariant).or_insert(0) += 1;
    }
    let then: Vec<String> = distinct(&out.findings)
        .into_iter()
        .map(|i| format!("{i} x{}", counts[&i]))
        .collect();
    let _ = writeln!(s, "all findings: {}", then.join(", "));
    let mut shown = vec![first.violation.invariant];
    for f in &out.findings {
        if !shown.contains(&f.violation.invariant) {
            shown.push(f.violation.invariant);
            let _ = writeln!(
                s,
                "  then [{} #{}] {}: {}",
                secs(f.at_ns),
                f.event,
                f.verdict(),
                f.violation
            );
        }
    }
}

/// The trace entries of the rooms, requests and pages the first finding involves.
fn write_causal_trace(s: &mut String, out: &RunOutcome, first: &Finding) {
    let focus = focus_of(&out.trace, first, &out.room_requests);
    let listed = |items: Vec<String>| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    let rooms = listed(focus.rooms.iter().map(|r| r.to_string()).collect());
    let reqs = listed(focus.requests.iter().map(|r| r.to_string()).collect());
    let pages: Vec<String> = focus
        .pages
        .iter()
        .map(|(n, p)| format!("{n}:{p}"))
        .collect();
    let pages = if pages.is_empty() {
        String::new()
    } else {
        format!("; pages {}", pages.join(", "))
    };
    let _ = writeln!(s, "causal trace (rooms {rooms}; requests {reqs}{pages}):");
    for l in causal_trace(&out.trace, first, &focus, 60) {
        let _ = writeln!(s, "  {l}");
    }
}
