//! Human-readable output of a run: event descriptions, the per-request table and the
//! verdict. Formatting only; nothing here decides anything.

use crate::oracle::Finding;
use crate::scenario::{canary_owner, PlannedRequest};
use crate::world::{ClientReply, TraceLine};
use kvsim_engine::ids::{PageTag, RequestId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use std::collections::BTreeMap;
use std::fmt::Write;

fn tags(t: &[PageTag]) -> String {
    if t.len() <= 4 {
        t.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    } else {
        format!(
            "{},{},..,{} ({} pages)",
            t[0],
            t[1],
            t[t.len() - 1],
            t.len()
        )
    }
}

/// One engine event as a sentence fragment.
pub fn describe_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        Admitted { node, room, side, prompt_len } => format!("{node} admits {room} ({side:?}, prompt {prompt_len})"),
        Rejected { node, room, side, status, reason } => format!("{node} rejects {room} ({side:?}) with {status}: {reason}"),
        RejectedLegacy { node, room, prompt_len } => format!(
            "{node} rejects {room} the legacy way: prompt of {prompt_len} swapped for a 1-token placeholder, error parked in to_finish"
        ),
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

/// A trace as text, one line per entry.
pub fn render_trace(lines: &[TraceLine]) -> String {
    let mut out = String::new();
    for l in lines {
        let _ = writeln!(out, "[{} #{:>6}] {}", secs(l.at_ns), l.event, l.text);
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
