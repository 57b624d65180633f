//! Human-readable output of a run: event descriptions, the full trace, the
//! per-request table, the verdict, and the failure report (seed, scenario, swarm
//! draw, first violated invariant, a causal trace cut down to the requests, rooms and
//! pages involved, and the command that replays it). Formatting only; nothing here
//! decides anything.

use crate::log::{tags, Entry, MsgView, Record};
use crate::oracle::Finding;
use crate::scenario::{canary_owner, PlannedRequest};
use crate::world::ClientReply;
use crate::RunOutcome;
use kvsim_engine::ids::{NodeId, PageId, RequestId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// One engine event as a sentence fragment.
pub fn describe_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        Admitted { node, room, side, prompt_len } => format!("{node} admits {room} ({side:?}, prompt {prompt_len})"),
        Rejected { node, room, side, status, reason } => format!("{node} rejects {room} ({side:?}) with {status}: {reason}"),
        RejectedLegacy { node, room, prompt_len } => format!(
            "{node} rejects {room} the legacy way: prompt of {prompt_len} swapped for a 1-token placeholder, error parked in to_finish"
        ),
        Truncated { node, room, from, to } => {
            format!("{node} truncates the prompt of {room} from {from} to {to} tokens (allow_auto_truncate)")
        }
        PagesReserved { node, room, pages } => format!("{node} reserves [{}] for {room}", tags(pages)),
        PagesReleased { node, room, pages, how } => format!("{node} releases [{}] of {room} ({how:?})", tags(pages)),
        Quarantined { node, room, pages } => format!("{node} quarantines [{}] of {room}", tags(pages)),
        QuarantineReleased { node, room, pages, acked } => {
            format!("{node} releases quarantined [{}] of {room} on the ack for {acked}", tags(pages))
        }
        KvSent { node, room, chunk, src, dst } => {
            format!("{node} sends chunk {chunk} of {room}: [{}] -> [{}]", tags(src), tags(dst))
        }
        KvLanded { node, room, chunk, dst } => format!("{node} lands chunk {chunk} of {room} in [{}]", tags(dst)),
        KvRefused { node, room, chunk, tag, reason } => {
            format!("{node} refuses chunk {chunk} of {room}: page {tag} {reason}")
        }
        TransferAccepted { node, room, prompt_len, reserved_pages, sent_tokens, sent_pages, fully_written } => format!(
            "{node} accepts the transfer of {room}: expects {prompt_len} tokens in {reserved_pages} pages, prefill sent {sent_tokens} tokens in {sent_pages} pages, all written: {fully_written}"
        ),
        TransferFailed { node, room, reason } => format!("{node} fails the transfer of {room}: {reason}"),
        Running { node, room, side } => format!("{node} runs {room} ({side:?})"),
        Attend { node, room, step, query_pos, seq_len, pages } => format!(
            "{node} step {step} of {room} attends over {seq_len} tokens in [{}], query position {query_pos}",
            tags(pages)
        ),
        TagMismatch { node, room, tag, current } => {
            format!("{node} page-tag check fails {room}: page {tag} is not its own (page now at {current})")
        }
        AbortNoted { node, room, side } => format!("{node} sees the abort of {room} ({side:?})"),
        Responded { node, room, side, status } => format!("{node} answers {room} ({side:?}) with {status}"),
        RouterResponse { node, req, room, status, tokens } => {
            let room = room.map_or(String::new(), |r| format!(" ({r})"));
            format!("{node} answers the client for {req}{room}: {status}, {tokens} tokens")
        }
        RoomCleared { node, room } => format!("{node} clears {room}"),
        DrainAcked { node, room } => format!("{node} acks the drain of {room}"),
        Fatal { node, reason } => format!("{node} STOPS: {reason}"),
    }
}

/// Nanoseconds as seconds with microsecond precision.
pub fn secs(ns: u64) -> String {
    format!(
        "{}.{:06}s",
        ns / 1_000_000_000,
        (ns % 1_000_000_000) / 1_000
    )
}

/// One log entry as a line of text with its time and event number.
pub fn render_entry(e: &Entry) -> String {
    format!("[{} #{:>6}] {}", secs(e.at_ns), e.event, e.text())
}

/// The full trace as text, one line per entry (normal sends and timer bookkeeping are
/// left to the JSON trace).
pub fn render_trace(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries.iter().filter(|e| e.shown_in_text()) {
        out.push_str(&render_entry(e));
        out.push('\n');
    }
    out
}

/// The reply of one request as a short token list naming each canary's owner.
pub fn render_tokens(req: RequestId, tokens: &[u32]) -> String {
    let parts: Vec<String> = tokens
        .iter()
        .map(|&t| match canary_owner(t) {
            Some(o) if o == req => format!("{t:#x}"),
            Some(o) => format!("{t:#x}<{o}!>"),
            None => format!("{t:#x}"),
        })
        .collect();
    parts.join(" ")
}

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

/// The findings, first one first.
pub fn render_findings(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let _ = writeln!(out, "  [{} #{}] {}", secs(f.at_ns), f.event, f.violation);
    }
    out
}

/// The distinct invariants of a list of findings, in order of first appearance.
pub fn distinct(findings: &[Finding]) -> Vec<Invariant> {
    let mut out = Vec::new();
    for f in findings {
        if !out.contains(&f.violation.invariant) {
            out.push(f.violation.invariant);
        }
    }
    out
}

/// What a causal trace is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Focus {
    pub rooms: BTreeSet<RoomKey>,
    pub requests: BTreeSet<RequestId>,
    pub pages: BTreeSet<(NodeId, PageId)>,
}

/// The requests, rooms and pages a finding involves, read from the log: the finding's
/// room and the rooms it names, the pages it names, and for each such page the last
/// other room that used it before the violation (the earlier owner whose KV or late
/// write is usually the story).
pub fn focus_of(
    entries: &[Entry],
    finding: &Finding,
    room_requests: &BTreeMap<RoomKey, RequestId>,
) -> Focus {
    let mut f = Focus::default();
    f.rooms.extend(finding.room);
    f.rooms.extend(finding.related.iter().copied());
    f.pages.extend(finding.pages.iter().copied());
    let upto: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.event <= finding.event)
        .collect();
    let named = f.pages.clone();
    for page in &named {
        let last_other = upto.iter().rev().find_map(|e| {
            if !e.pages().contains(page) {
                return None;
            }
            e.rooms().into_iter().find(|r| !f.rooms.contains(r))
        });
        if let Some(r) = last_other {
            if f.rooms.len() < 4 {
                f.rooms.insert(r);
            }
        }
    }
    for r in &f.rooms {
        if let Some(q) = room_requests.get(r) {
            f.requests.insert(*q);
        }
    }
    f
}

/// What an entry is, for spotting repetition in a causal trace: the entries of the
/// steady parts (decode steps, streamed tokens, chunks, retries and their timers)
/// have a key; one-off steps (admission, reservation, release, answers) do not and
/// are never collapsed.
fn repeat_key(e: &Entry) -> Option<(&'static str, Option<RoomKey>)> {
    let room = e.rooms().first().copied();
    let kind = match &e.rec {
        Record::Deliver { msg, .. } | Record::Drop { msg, .. } | Record::Send { msg, .. } => {
            match msg {
                MsgView::TokenOut { .. } => "TokenOut",
                MsgView::KvWrite { .. } => "KvWrite",
                MsgView::WriteDone { .. } => "WriteDone",
                MsgView::DrainRequest { .. } => "DrainRequest",
                MsgView::DrainAck { .. } => "DrainAck",
                MsgView::Abort { .. } => "Abort",
                MsgView::PrefillFinished { .. } => "PrefillFinished",
                MsgView::DecodeFinished { .. } => "DecodeFinished",
                _ => return None,
            }
        }
        Record::Engine(TraceEvent::Attend { .. }) => "Attend",
        Record::Engine(TraceEvent::KvLanded { .. }) => "KvLanded",
        Record::Engine(TraceEvent::KvSent { .. }) => "KvSent",
        Record::Engine(TraceEvent::DrainAcked { .. }) => "DrainAcked",
        Record::Engine(TraceEvent::AbortNoted { .. }) => "AbortNoted",
        Record::TimerFire { .. } => "TimerFire",
        Record::WriteFailed { .. } => "WriteFailed",
        _ => return None,
    };
    Some((kind, room))
}

/// The causal trace of a finding: only the entries up to the violation that touch
/// the focus (its rooms, requests and pages) or are faults, with repetitive stretches
/// (the same few kinds of entry over and over) collapsed, at most `max_lines` lines.
pub fn causal_trace(
    entries: &[Entry],
    finding: &Finding,
    focus: &Focus,
    max_lines: usize,
) -> Vec<String> {
    let relevant = |e: &Entry| -> bool {
        if e.event > finding.event {
            return false;
        }
        if matches!(e.rec, Record::Fault(_)) {
            return true;
        }
        if !e.shown_in_text() {
            return false;
        }
        if matches!(e.rec, Record::Violation { .. }) {
            return e.rec.is_finding(finding);
        }
        e.rooms().iter().any(|r| focus.rooms.contains(r))
            || e.request().is_some_and(|r| focus.requests.contains(&r))
            || e.pages().iter().any(|p| focus.pages.contains(p))
    };
    let picked: Vec<&Entry> = entries.iter().filter(|e| relevant(e)).collect();
    let mut lines = Vec::new();
    let mut i = 0;
    while i < picked.len() {
        // A stretch whose entries all have one of the keys of its first three.
        let head: Vec<_> = picked[i..(i + 3).min(picked.len())]
            .iter()
            .map(|e| repeat_key(e))
            .collect();
        let mut j = i;
        if head.first().is_some_and(Option::is_some) {
            while j < picked.len() {
                let k = repeat_key(picked[j]);
                if k.is_none() || !head.contains(&k) {
                    break;
                }
                j += 1;
            }
        }
        if j - i > 6 {
            for e in &picked[i..i + 3] {
                lines.push(render_entry(e));
            }
            lines.push(format!("    ... {} more like these", j - i - 4));
            lines.push(render_entry(picked[j - 1]));
            i = j;
        } else {
            lines.push(render_entry(picked[i]));
            i += 1;
        }
    }
    if lines.len() > max_lines {
        let head = max_lines / 4;
        let tail = max_lines - head - 1;
        let cut = lines.len() - head - tail;
        let mut out: Vec<String> = lines[..head].to_vec();
        out.push(format!(
            "    ... {cut} lines left out (the full trace has them)"
        ));
        out.extend_from_slice(&lines[lines.len() - tail..]);
        lines = out;
    }
    lines
}

/// The command that replays a run.
pub fn replay_command(path: &str, out: &RunOutcome) -> String {
    let mut cmd = format!("kvsim replay {path} --seed {}", out.seed);
    if !out.bugs.is_empty() {
        let _ = write!(cmd, " --bugs {}", out.bugs);
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
    let first = out.first()?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "FAILURE: {} seed {} (bugs: {})",
        out.scenario, out.seed, out.bugs
    );
    s.push_str(&out.plan.describe());
    let _ = writeln!(
        s,
        "first violation at {} (event #{}):\n  {}",
        secs(first.at_ns),
        first.event,
        first.violation
    );
    let mut counts: BTreeMap<Invariant, usize> = BTreeMap::new();
    for f in &out.findings {
        *counts.entry(f.violation.invariant).or_insert(0) += 1;
    }
    let then: Vec<String> = distinct(&out.findings)
        .into_iter()
        .map(|i| format!("{i} x{}", counts[&i]))
        .collect();
    let _ = writeln!(s, "all findings: {}", then.join(", "));
    // The first finding of each other invariant, in order: how the failure unfolded.
    let mut shown = vec![first.violation.invariant];
    for f in &out.findings {
        if !shown.contains(&f.violation.invariant) {
            shown.push(f.violation.invariant);
            let _ = writeln!(s, "  then [{} #{}] {}", secs(f.at_ns), f.event, f.violation);
        }
    }
    if !out.trace.is_empty() {
        let focus = focus_of(&out.trace, first, &out.room_requests);
        let rooms: Vec<String> = focus.rooms.iter().map(|r| r.to_string()).collect();
        let reqs: Vec<String> = focus.requests.iter().map(|r| r.to_string()).collect();
        let pages: Vec<String> = focus
            .pages
            .iter()
            .map(|(n, p)| format!("{n}:{p}"))
            .collect();
        let _ = writeln!(
            s,
            "causal trace (rooms {}; requests {}{}):",
            if rooms.is_empty() {
                "-".into()
            } else {
                rooms.join(", ")
            },
            if reqs.is_empty() {
                "-".into()
            } else {
                reqs.join(", ")
            },
            if pages.is_empty() {
                String::new()
            } else {
                format!("; pages {}", pages.join(", "))
            }
        );
        for l in causal_trace(&out.trace, first, &focus, 60) {
            let _ = writeln!(s, "  {l}");
        }
    }
    let _ = writeln!(s, "replay (full trace): {}", replay_command(path, out));
    Some(s)
}
