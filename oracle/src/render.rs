//! Text forms of a trace: one sentence per engine event, one line per entry, and the
//! causal trace of a finding (only the entries that touch the rooms, requests and pages
//! it involves, with repetitive stretches collapsed). `kvsim replay`, `kvsim run` and
//! `kvsim audit` print the same forms. Formatting only; nothing here decides anything.

mod entry;
pub(crate) mod event;

pub use entry::{render_entry, render_tokens, render_trace, timer_name};
pub use event::{describe_event, secs, tags};

use crate::oracle::Finding;
use crate::schema::{Entry, MsgView, Record};
use kvsim_engine::ids::{NodeId, PageId, RequestId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

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
