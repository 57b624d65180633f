//! Text forms of a trace: one sentence per engine event, one line per entry, and the
//! causal trace of a finding (only the entries that touch the rooms, requests and pages
//! it involves, with repetitive stretches collapsed). `kvsim replay`, `kvsim run` and
//! `kvsim audit` print the same forms. Formatting only; nothing here decides anything.

use crate::oracle::Finding;
use crate::schema::{CancelHow, Entry, FaultEvent, MsgView, Record};
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{fmt_tags, NodeId, PageId, PageTag, RequestId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::{TraceEvent, TransferClaim};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Page tags, shortened when long.
pub fn tags(t: &[PageTag]) -> String {
    fmt_tags(t, 4)
}

/// One engine event as a sentence fragment.
pub fn describe_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        Routed { node, req, tenant, room, prefill, decode, prompt_len, max_new_tokens } => format!(
            "{node} routes {req} ({tenant}, prompt {prompt_len}, {max_new_tokens} new) to {room}: prefill {prefill}, decode {decode}"
        ),
        Admitted { node, room, req, side, prompt_len } => {
            format!("{node} admits {room} for {req} ({side:?}, prompt {prompt_len})")
        }
        Rejected { node, room, side, status, reason } => format!("{node} rejects {room} ({side:?}) with {status}: {reason}"),
        RejectedLegacy { node, room, prompt_len } => format!(
            "{node} rejects {room} the legacy way: prompt of {prompt_len} swapped for a 1-token placeholder, error parked in to_finish"
        ),
        Truncated { node, room, from, to } => {
            format!("{node} truncates the prompt of {room} from {from} to {to} tokens (allow_auto_truncate)")
        }
        PagesReserved { .. }
        | PagesExpectWrite { .. }
        | PagesReady { .. }
        | PagesReleased { .. }
        | Quarantined { .. }
        | QuarantineReleased { .. }
        | PagesHeld { .. }
        | PagesUnheld { .. }
        | KvWritten { .. }
        | PagesZeroed { .. } => describe_page_event(ev),
        KvSent { .. }
        | KvLanded { .. }
        | KvRefused { .. }
        | WriteCompleted { .. }
        | TransferReported { .. }
        | TransferAccepted { .. }
        | TransferRefused { .. }
        | TransferFailed { .. } => describe_transfer_event(ev),
        Running { node, room, side } => format!("{node} runs {room} ({side:?})"),
        Attend { node, room, step, query_pos, seq_len, pages } => format!(
            "{node} step {step} of {room} attends over {seq_len} tokens in [{}], query position {query_pos}",
            tags(pages)
        ),
        TagMismatch { node, room, step, tag, current, .. } => format!(
            "{node} page-tag check refuses step {step} of {room}: page {tag} is not its own (page now at {current})"
        ),
        AbortNoted { node, room, side } => format!("{node} sees the abort of {room} ({side:?})"),
        Responded { node, room, side, status } => format!("{node} answers {room} ({side:?}) with {status}"),
        RouterResponse { node, req, room, status, tokens } => {
            let room = room.map_or(String::new(), |r| format!(" ({r})"));
            format!("{node} answers the client for {req}{room}: {status}, {} tokens", tokens.len())
        }
        RoomCleared { node, room } => format!("{node} clears {room}"),
        RouterRetried {
            node,
            req,
            room,
            status,
            attempt,
        } => format!("{node} gives up {room} of {req} ({status}) and starts attempt {attempt}"),
        DrainAcked { node, room } => format!("{node} acks the drain of {room}"),
        PeerRefused { node, from, room, msg, reason } => {
            let room = room.map_or(String::new(), |r| format!(" about {r}"));
            format!("{node} refuses {msg}{room} from {from}: {reason}")
        }
        Fault { node, fault } => format!("{node} FAULT ({:?}): {fault}", fault.action()),
    }
}

/// A page event (reserve, write, release, quarantine, hold) as a sentence fragment.
fn describe_page_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        PagesReserved { node, room, pages } => {
            format!("{node} reserves [{}] for {room}", tags(pages))
        }
        PagesExpectWrite { node, room, pages } => {
            format!("{node} expects KV writes into [{}] of {room}", tags(pages))
        }
        PagesReady { node, room, pages } => {
            format!("{node} marks [{}] of {room} ready", tags(pages))
        }
        PagesReleased {
            node,
            room,
            pages,
            how,
            held,
        } => {
            let held = still_held(held);
            format!(
                "{node} releases [{}] of {room} ({how:?}){held}",
                tags(pages)
            )
        }
        Quarantined { node, room, pages } => {
            format!("{node} quarantines [{}] of {room}", tags(pages))
        }
        QuarantineReleased {
            node,
            room,
            pages,
            acked,
            held,
        } => {
            let held = still_held(held);
            format!(
                "{node} releases quarantined [{}] of {room} on the ack for {acked}{held}",
                tags(pages)
            )
        }
        PagesHeld { node, pages } => format!("{node} holds [{}] for a send", tags(pages)),
        PagesUnheld { node, pages, freed } => {
            let freed = if freed.is_empty() {
                String::new()
            } else {
                format!(", [{}] freed", tags(freed))
            };
            format!("{node} lets go of the hold on [{}]{freed}", tags(pages))
        }
        KvWritten {
            node,
            room,
            pages,
            start,
            tokens,
        } => format!(
            "{node} writes {tokens} tokens of {room} at position {start} of [{}]",
            tags(pages)
        ),
        PagesZeroed { node, pages } => format!("{node} zeroes {} pages", pages.len()),
        _ => String::new(),
    }
}

/// A KV transfer event (send, land, complete, verify) as a sentence fragment.
fn describe_transfer_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        KvSent {
            node,
            write,
            src,
            dst,
            ..
        } => {
            format!("{node} sends {write}: [{}] -> [{}]", tags(src), tags(dst))
        }
        KvLanded { node, write, dst } => format!("{node} lands {write} in [{}]", tags(dst)),
        KvRefused {
            node,
            write,
            tag,
            reason,
        } => match tag {
            Some(t) => format!("{node} refuses {write}: page {t} {reason}"),
            None => format!("{node} refuses {write}: {reason}"),
        },
        WriteCompleted { node, write, ok } => {
            format!(
                "{node} completes {write} ({})",
                if *ok { "ok" } else { "failed" }
            )
        }
        TransferReported {
            node,
            room,
            from,
            success,
        } => format!(
            "{node} hears from {from} that the transfer of {room} {}",
            if *success { "succeeded" } else { "failed" }
        ),
        TransferAccepted { node, room, claim } => {
            let TransferClaim {
                from,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
            } = claim;
            format!(
                "{node} accepts the transfer of {room} from {from}: expects {prompt_len} tokens in {reserved_pages} pages, prefill sent {sent_tokens} tokens in {sent_pages} pages, all written: {fully_written}"
            )
        }
        TransferRefused {
            node, room, reason, ..
        } => {
            format!("{node} verification refuses the transfer of {room}: {reason}")
        }
        TransferFailed { node, room, reason } => {
            format!("{node} fails the transfer of {room}: {reason}")
        }
        _ => String::new(),
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

/// One entry as a line of text with its time and sequence number.
pub fn render_entry(e: &Entry) -> String {
    format!("[{} #{:>6}] {}", secs(e.at_ns), e.seq, e.text())
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

/// A reply's tokens, each canary token marked with its owner when it is not `req`.
pub fn render_tokens(req: RequestId, tokens: &[u32]) -> String {
    let parts: Vec<String> = tokens
        .iter()
        .map(|&t| match crate::canary::owner(t) {
            Some(o) if o == req => format!("{t:#x}"),
            Some(o) => format!("{t:#x}<{o}!>"),
            None => format!("{t:#x}"),
        })
        .collect();
    parts.join(" ")
}

/// A timer as a short name: `DrainRetry(room1.g8)`.
pub fn timer_name(t: &Timer) -> String {
    match t {
        Timer::Compute => "Compute".into(),
        Timer::Bootstrap(r) => format!("Bootstrap({r})"),
        Timer::WaitingForKv(r) => format!("WaitingForKv({r})"),
        Timer::DrainRetry(r, n) => format!("DrainRetry({r}, {n})"),
        Timer::Request(r) => format!("Request({r})"),
    }
}

fn timer_room(t: &Timer) -> Option<RoomKey> {
    match t {
        Timer::Bootstrap(r)
        | Timer::WaitingForKv(r)
        | Timer::DrainRetry(r, _)
        | Timer::Request(r) => Some(*r),
        Timer::Compute => None,
    }
}

impl Entry {
    /// The rooms the entry is about.
    pub fn rooms(&self) -> Vec<RoomKey> {
        match &self.rec {
            Record::Send { msg, .. } | Record::Deliver { msg, .. } | Record::Drop { msg, .. } => {
                msg.room().into_iter().collect()
            }
            Record::TimerSet { timer, .. }
            | Record::TimerCancel { timer, .. }
            | Record::TimerFire { timer, .. } => timer_room(timer).into_iter().collect(),
            Record::Engine(ev) => ev.room().into_iter().collect(),
            Record::Violation { room, related, .. } => {
                room.iter().chain(related.iter()).copied().collect()
            }
            Record::WriteFailed { write, .. } => vec![write.room],
            Record::Submit { .. }
            | Record::ClientCancel { .. }
            | Record::Response { .. }
            | Record::Fault(_)
            | Record::End { .. } => Vec::new(),
        }
    }

    /// The request the entry is about, when it names one directly.
    pub fn request(&self) -> Option<RequestId> {
        match &self.rec {
            Record::Submit { req, .. }
            | Record::ClientCancel { req, .. }
            | Record::Response { req, .. } => Some(*req),
            Record::Engine(
                TraceEvent::RouterResponse { req, .. }
                | TraceEvent::Routed { req, .. }
                | TraceEvent::Admitted { req, .. },
            ) => Some(*req),
            Record::Deliver {
                msg: MsgView::Submit { req, .. } | MsgView::Cancel { req },
                ..
            } => Some(*req),
            _ => None,
        }
    }

    /// The physical pages (node, page) the entry touches.
    pub fn pages(&self) -> Vec<(NodeId, PageId)> {
        let on = |n: NodeId, t: &[PageTag]| t.iter().map(move |t| (n, t.page)).collect::<Vec<_>>();
        match &self.rec {
            Record::Deliver { from, to, msg } => match msg {
                MsgView::KvWrite { src, dst, .. } => {
                    let mut v = on(*to, dst);
                    v.extend(on(*from, src));
                    v
                }
                MsgView::KvMeta { dst, .. } => on(*from, dst),
                _ => Vec::new(),
            },
            Record::Engine(ev) => match ev {
                TraceEvent::PagesReserved { node, pages, .. }
                | TraceEvent::PagesReleased { node, pages, .. }
                | TraceEvent::Quarantined { node, pages, .. }
                | TraceEvent::QuarantineReleased { node, pages, .. }
                | TraceEvent::Attend { node, pages, .. } => on(*node, pages),
                TraceEvent::KvSent { node, src, .. } => on(*node, src),
                TraceEvent::KvLanded { node, dst, .. } => on(*node, dst),
                TraceEvent::KvRefused { node, tag, .. } => {
                    tag.iter().map(|t| (*node, t.page)).collect()
                }
                TraceEvent::TagMismatch { node, pages, .. } => on(*node, pages),
                TraceEvent::PagesExpectWrite { node, pages, .. }
                | TraceEvent::PagesReady { node, pages, .. }
                | TraceEvent::PagesHeld { node, pages }
                | TraceEvent::PagesUnheld { node, pages, .. }
                | TraceEvent::KvWritten { node, pages, .. } => on(*node, pages),
                _ => Vec::new(),
            },
            Record::Violation { pages, .. } => pages.clone(),
            _ => Vec::new(),
        }
    }

    /// The entry as one line of text (without the time prefix).
    pub fn text(&self) -> String {
        match &self.rec {
            Record::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => format!(
                "client submits {req} ({tenant}, prompt {prompt_len} tokens, {max_new_tokens} new)"
            ),
            Record::ClientCancel { req, how, plan } => {
                format!("client {} {req} ({plan})", cancel_verb(*how))
            }
            Record::Send {
                from,
                to,
                msg,
                deliver_at_ns,
                duplicate,
            } => format!(
                "{from} -> {to} {}{} (due {})",
                msg.summary(),
                if *duplicate { " [duplicate]" } else { "" },
                secs(*deliver_at_ns)
            ),
            Record::Deliver { from, to, msg } => format!("{to} <- {from} {}", msg.summary()),
            Record::Drop {
                from,
                to,
                msg,
                reason,
            } => format!(
                "network drops {from} -> {to} {} ({reason:?})",
                msg.summary()
            ),
            Record::WriteFailed {
                from,
                to,
                write,
                reason,
            } => format!("KV write {write} {from} -> {to} fails, not applied ({reason:?})"),
            Record::TimerSet {
                node,
                timer,
                fire_at_ns,
            } => format!(
                "{node} sets timer {} for {}",
                timer_name(timer),
                secs(*fire_at_ns)
            ),
            Record::TimerCancel { node, timer } => {
                format!("{node} cancels timer {}", timer_name(timer))
            }
            Record::TimerFire { node, timer } => {
                format!("{node} timer {} fires", timer_name(timer))
            }
            Record::Engine(ev) => format!("  {}", describe_event(ev)),
            Record::Response {
                req,
                status,
                tokens,
            } => response_text(*req, *status, tokens),
            Record::Fault(f) => fault_text(f),
            Record::Violation {
                violation,
                detected_by,
                ..
            } => match detected_by {
                None => format!("!! VIOLATION {violation}"),
                Some(d) => format!("!! DETECTED (refused by {d}, nothing leaked) {violation}"),
            },
            Record::End { outcome, detail } => format!("END {outcome:?}: {detail}"),
        }
    }

    /// Whether the full text trace shows this entry (sends that went normally and
    /// timer bookkeeping are in the JSON trace only).
    pub fn shown_in_text(&self) -> bool {
        match &self.rec {
            Record::Send { duplicate, .. } => *duplicate,
            Record::TimerSet { .. } | Record::TimerCancel { .. } => false,
            _ => true,
        }
    }
}

/// What a client does when it cancels.
fn cancel_verb(how: CancelHow) -> &'static str {
    match how {
        CancelHow::Abort => "aborts",
        CancelHow::Disconnect => "disconnects",
    }
}

/// `, [p1@g2] still held: draining` for pages another path still holds, else nothing.
fn still_held(held: &[PageTag]) -> String {
    if held.is_empty() {
        String::new()
    } else {
        format!(", [{}] still held: draining", tags(held))
    }
}

/// A reply as the client got it, its canary tokens marked by owner.
fn response_text(req: RequestId, status: kvsim_engine::msg::Status, tokens: &[u32]) -> String {
    format!(
        "client gets {req}: {status}, {} tokens{}",
        tokens.len(),
        if tokens.is_empty() {
            String::new()
        } else {
            format!(" [{}]", render_tokens(req, tokens))
        }
    )
}

/// A fault event as a line of text.
fn fault_text(f: &FaultEvent) -> String {
    match f {
        FaultEvent::PartitionStart { prefill, decode } => {
            format!("FAULT partition {prefill} | {decode} begins")
        }
        FaultEvent::PartitionEnd { prefill, decode } => {
            format!("FAULT partition {prefill} | {decode} ends")
        }
        FaultEvent::Crash {
            node,
            epoch,
            flushed,
        } => {
            let flushed = if flushed.is_empty() {
                String::new()
            } else {
                format!("; {} KV writes flushed", flushed.len())
            };
            format!("FAULT {node} crashes (incarnation {epoch} dies with its timers, queues and connections{flushed})")
        }
        FaultEvent::Restart { node, epoch } => {
            format!("FAULT {node} restarts as incarnation {epoch} (empty pool, KV memory not zeroed)")
        }
        FaultEvent::Pause { node, until_ns } => {
            format!("FAULT {node} freezes until {} (its timers and inputs wait; one-sided KV writes still land)", secs(*until_ns))
        }
        FaultEvent::DataFault {
            from,
            to,
            write,
            kind,
            meant,
            landed,
        } => match kind {
            kvsim_engine::world::DataFault::StaleDuplicate => format!(
                "FAULT a stale duplicate of KV write {write} {from}->{to} lands again: over page {meant} with its old tag {landed} (no second completion)"
            ),
            _ => format!("FAULT KV write {write} {from}->{to} lands {}: page {meant} landed as {landed}", kind.name()),
        },
        FaultEvent::Heal => {
            "FAULTS HEAL: liveness phase, everything must drain".to_string()
        }
    }
}

impl Record {
    /// The trace record of a finding.
    pub fn violation(f: &Finding) -> Record {
        Record::Violation {
            violation: f.violation.clone(),
            detected_by: f.detected_by.map(str::to_string),
            room: f.room,
            related: f.related.clone(),
            pages: f.pages.clone(),
        }
    }

    /// Is this the record of `f`?
    pub fn is_finding(&self, f: &Finding) -> bool {
        matches!(self, Record::Violation { violation, room, .. } if *violation == f.violation && *room == f.room)
    }
}

/// The findings, first one first.
pub fn render_findings(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let _ = writeln!(
            out,
            "  [{} #{}] {}: {}",
            secs(f.at_ns),
            f.event,
            f.verdict(),
            f.violation
        );
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
    let upto: Vec<&Entry> = entries.iter().filter(|e| e.seq <= finding.event).collect();
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
        if e.seq > finding.event {
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
