//! `kvsim audit`: judge a run from its trace files alone, in one streaming pass.
//!
//! Input: one trace, or several (one per node of a deployment), each a JSON Lines file
//! of the documented schema whose first line is its header. Several files are merged
//! by time (ties: file order, then line order) and their headers must agree on the
//! run's facts; their node lists are united. Every entry goes to one [`Oracle`] as it
//! is read, so memory is bounded by the run's live state (pages, rooms, writes in
//! flight), never by the trace's length. Only when something was found, and only for
//! regular files, a second pass collects the entries of the rooms and pages involved
//! to print their causal trace.
//!
//! A trace ends with one `end` entry per file saying whether the run drained; without
//! one the trace is taken as cut and liveness is not judged (and the report says so).

mod outcome;
mod text;

pub use outcome::{AuditError, AuditOptions, AuditReport};
pub use text::render;

use crate::oracle::Oracle;
use crate::render::{causal_trace, Focus};
use crate::schema::{parse_line, EndOutcome, Entry, Line, Record, RunHeader};
use kvsim_engine::trace::TraceEvent;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// One input file being read.
struct Source {
    path: String,
    reader: BufReader<Box<dyn Read>>,
    line_no: u64,
    buf: String,
}

impl Source {
    fn open(path: &Path) -> Result<Source, AuditError> {
        let name = path.display().to_string();
        let file: Box<dyn Read> = if name == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(File::open(path).map_err(|source| AuditError::Io {
                path: name.clone(),
                source,
            })?)
        };
        Ok(Source::new(name, file))
    }

    fn new(name: String, input: Box<dyn Read>) -> Source {
        Source {
            path: name,
            reader: BufReader::with_capacity(1 << 20, input),
            line_no: 0,
            buf: String::new(),
        }
    }

    /// The next non-empty line, parsed; `None` at the end.
    fn next(&mut self, bytes: &mut u64) -> Result<Option<Line>, AuditError> {
        loop {
            self.buf.clear();
            let n = self
                .reader
                .read_line(&mut self.buf)
                .map_err(|source| AuditError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            *bytes += n as u64;
            self.line_no += 1;
            let text = self.buf.trim();
            if text.is_empty() {
                continue;
            }
            return parse_line(text).map(Some).map_err(|e| AuditError::Line {
                path: self.path.clone(),
                line: self.line_no,
                reason: e.0,
            });
        }
    }
}

/// Open every file and read its header; the merged header.
fn open_all(paths: &[PathBuf], bytes: &mut u64) -> Result<(RunHeader, Vec<Source>), AuditError> {
    let sources = paths
        .iter()
        .map(|p| Source::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    headers(sources, bytes)
}

/// Read every source's header; the merged header.
fn headers(inputs: Vec<Source>, bytes: &mut u64) -> Result<(RunHeader, Vec<Source>), AuditError> {
    let mut sources = Vec::new();
    let mut merged: Option<(RunHeader, String)> = None;
    for mut src in inputs {
        let header = match src.next(bytes)? {
            Some(Line::Header(h)) => *h,
            _ => return Err(AuditError::NoHeader { path: src.path }),
        };
        match &mut merged {
            None => merged = Some((header, src.path.clone())),
            Some((h, first)) => {
                let agree = h.page_size == header.page_size
                    && h.context_len == header.context_len
                    && h.allow_auto_truncate == header.allow_auto_truncate
                    && h.clock == header.clock;
                if !agree {
                    return Err(AuditError::HeaderMismatch {
                        path: src.path,
                        first: first.clone(),
                        reason:
                            "page_size, context_len, allow_auto_truncate and clock must be equal"
                                .into(),
                    });
                }
                for n in header.nodes {
                    match h.nodes.iter().find(|m| m.id == n.id) {
                        Some(m) if *m != n => {
                            return Err(AuditError::HeaderMismatch {
                                path: src.path,
                                first: first.clone(),
                                reason: format!("node {} is declared differently", n.id),
                            })
                        }
                        Some(_) => {}
                        None => h.nodes.push(n),
                    }
                }
                h.nodes.sort_by_key(|n| n.id);
            }
        }
        sources.push(src);
    }
    let (header, _) = merged.ok_or(AuditError::Nothing)?;
    Ok((header, sources))
}

/// What a merged stream of entries says besides the entries: each entry's position,
/// and the run's end from the `end` entries (collected, not judged, until the stream
/// ends). The one bookkeeping of every way a trace reaches the oracle.
#[derive(Default)]
struct Ends {
    ends: Vec<(EndOutcome, String)>,
    end_at: u64,
    end_seq: u64,
    position: u64,
}

impl Ends {
    /// The position of an entry to judge; `None` for an `end` entry (kept).
    fn admit(&mut self, e: &Entry) -> Option<u64> {
        if let Record::End { outcome, detail } = &e.rec {
            self.ends.push((*outcome, detail.clone()));
            if e.at_ns >= self.end_at {
                (self.end_at, self.end_seq) = (e.at_ns, e.seq);
            }
            return None;
        }
        self.position += 1;
        (self.end_at, self.end_seq) = (self.end_at.max(e.at_ns), self.end_seq.max(e.seq));
        Some(self.position)
    }

    /// The reader stopped early: the stream is cut where it stopped.
    fn cut(&self) -> (u64, Entry) {
        let rec = Record::End {
            outcome: EndOutcome::Cut,
            detail: String::new(),
        };
        self.at(rec)
    }

    /// The run's end: drained only if each of `files` says so; otherwise the first
    /// other outcome (a cut when a file has no `end` entry).
    fn finish(self, files: usize) -> (u64, Entry) {
        let (outcome, detail) = if self.ends.len() < files {
            (
                EndOutcome::Cut,
                "the trace has no end entry: liveness is not judged".to_string(),
            )
        } else {
            self.ends
                .iter()
                .find(|(o, _)| *o != EndOutcome::Drained)
                .cloned()
                .unwrap_or((EndOutcome::Drained, "drained".into()))
        };
        self.at(Record::End { outcome, detail })
    }

    fn at(&self, rec: Record) -> (u64, Entry) {
        let e = Entry {
            at_ns: self.end_at,
            seq: self.end_seq,
            rec,
        };
        (self.position, e)
    }
}

/// Read every file's entries merged by time, calling `f(position, entry)` for each
/// (the `end` entries are collected, not passed on) until `f` says stop. Returns the
/// run's end.
fn merged(
    sources: &mut [Source],
    bytes: &mut u64,
    mut f: impl FnMut(u64, &Entry) -> bool,
) -> Result<(u64, Entry), AuditError> {
    let mut heap: BinaryHeap<Reverse<(u64, usize, u64)>> = BinaryHeap::new();
    let mut pending: Vec<Option<Entry>> = Vec::with_capacity(sources.len());
    for (i, s) in sources.iter_mut().enumerate() {
        let e = next_entry(s, bytes)?;
        if let Some(e) = &e {
            heap.push(Reverse((e.at_ns, i, s.line_no)));
        }
        pending.push(e);
    }
    let mut ends = Ends::default();
    while let Some(Reverse((_, i, _))) = heap.pop() {
        let Some(e) = pending[i].take() else { continue };
        if let Some(position) = ends.admit(&e) {
            if !f(position, &e) {
                return Ok(ends.cut());
            }
        }
        let next = next_entry(&mut sources[i], bytes)?;
        if let Some(n) = &next {
            heap.push(Reverse((n.at_ns, i, sources[i].line_no)));
        }
        pending[i] = next;
    }
    Ok(ends.finish(sources.len()))
}

fn next_entry(s: &mut Source, bytes: &mut u64) -> Result<Option<Entry>, AuditError> {
    match s.next(bytes)? {
        None => Ok(None),
        Some(Line::Entry(e)) => Ok(Some(e)),
        Some(Line::Header(_)) => Err(AuditError::Line {
            path: s.path.clone(),
            line: s.line_no,
            reason: "a second header".into(),
        }),
    }
}

/// The entries of trace files merged as the audit reads them, at most `max` of them
/// around `focus` (the first violation's time and step: [`crate::timeline::window`]),
/// for the timeline: the header, the entries kept and the position of the first one.
/// A second pass over the files, stopped once the window is full.
pub fn timeline_window(
    paths: &[PathBuf],
    focus: Option<(u64, u64)>,
    max: usize,
) -> Result<(RunHeader, Vec<Entry>, u64), AuditError> {
    let mut bytes = 0u64;
    let (header, mut sources) = open_all(paths, &mut bytes)?;
    let mut keep = crate::timeline::Collector::new(max, focus);
    let (_, end) = merged(&mut sources, &mut bytes, |_, e| keep.push(e))?;
    let first = keep.first;
    let mut entries = keep.into_entries();
    if matches!(end.rec, Record::End { .. }) && entries.len() < max {
        entries.push(end);
    }
    Ok((header, entries, first))
}

/// Audit traces given as readers (named for errors): the same single pass as
/// [`audit`], without the causal traces (those need to read the input again).
pub fn audit_readers(inputs: Vec<(String, Box<dyn Read>)>) -> Result<AuditReport, AuditError> {
    let sources = inputs
        .into_iter()
        .map(|(name, r)| Source::new(name, r))
        .collect();
    let mut bytes = 0u64;
    let (header, sources) = headers(sources, &mut bytes)?;
    judge(header, sources, bytes).map(|(r, _)| r)
}

/// Audit trace files.
pub fn audit(paths: &[PathBuf], opts: AuditOptions) -> Result<AuditReport, AuditError> {
    let mut bytes = 0u64;
    let (header, sources) = open_all(paths, &mut bytes)?;
    let (mut report, positions) = judge(header, sources, bytes)?;
    let files = paths.iter().all(|p| p.to_str() != Some("-"));
    if opts.causal && files && !report.findings.is_empty() {
        report.causal = explain(paths, &report, &positions, opts)?;
    }
    Ok(report)
}

/// The one pass over files: every entry to the oracle, then the run's end. Also
/// returns, per finding, the merged position of the entry that produced it.
fn judge(
    header: RunHeader,
    mut sources: Vec<Source>,
    mut bytes: u64,
) -> Result<(AuditReport, Vec<u64>), AuditError> {
    let mut pass = Pass::new(header);
    let (entries, last) = merged(&mut sources, &mut bytes, |pos, e| {
        pass.take(pos, e);
        true
    })?;
    Ok(pass.finish(entries, &last, bytes))
}

/// The oracle of one audit and, per finding, the position of the entry that produced
/// it: what every way a trace reaches the audit (files, readers, entries in memory)
/// feeds.
struct Pass {
    oracle: Oracle,
    positions: Vec<u64>,
}

impl Pass {
    fn new(header: RunHeader) -> Self {
        Pass {
            oracle: Oracle::new(header),
            positions: Vec::new(),
        }
    }

    fn take(&mut self, position: u64, e: &Entry) {
        let found = self.oracle.observe(e).len();
        self.positions.extend(std::iter::repeat_n(position, found));
    }

    /// Judge the run's end (`last`, after `entries` entries) and report.
    fn finish(mut self, entries: u64, last: &Entry, bytes: u64) -> (AuditReport, Vec<u64>) {
        let end = match &last.rec {
            Record::End { outcome, .. } => *outcome,
            _ => EndOutcome::Cut,
        };
        self.take(entries + 1, last);
        let report = AuditReport {
            header: self.oracle.header().clone(),
            findings: self.oracle.findings().to_vec(),
            leaks: self.oracle.leaks.clone(),
            entries,
            bytes,
            end,
            causal: Vec::new(),
        };
        (report, self.positions)
    }
}

/// The audit of one run handed over in memory as it runs (`kvsim sweep --audit`):
/// its header, then its entries in order, exactly what the lines of its trace file
/// would hold (the schema's own types), judged by the same single pass as [`audit`]
/// without writing or parsing their text. The report's `bytes` is 0.
pub struct EntryAudit {
    pass: Pass,
    ends: Ends,
}

impl EntryAudit {
    /// The audit of the run `header` describes; `name` names it in errors.
    pub fn new(name: &str, header: &RunHeader) -> Result<Self, AuditError> {
        header.check().map_err(|reason| AuditError::Line {
            path: name.to_string(),
            line: 1,
            reason,
        })?;
        Ok(EntryAudit {
            pass: Pass::new(header.clone()),
            ends: Ends::default(),
        })
    }

    /// The run's next entry.
    pub fn observe(&mut self, e: &Entry) {
        if let Some(position) = self.ends.admit(e) {
            self.pass.take(position, e);
        }
    }

    /// The verdict, once every entry was observed.
    pub fn finish(self) -> AuditReport {
        let (entries, last) = self.ends.finish(1);
        self.pass.finish(entries, &last, 0).0
    }
}

/// The second pass: the causal traces of the first findings.
fn explain(
    paths: &[PathBuf],
    report: &AuditReport,
    positions: &[u64],
    opts: AuditOptions,
) -> Result<Vec<(usize, Vec<String>)>, AuditError> {
    let chosen: Vec<usize> = (0..report.findings.len())
        .filter(|i| report.findings[*i].violated())
        .chain((0..report.findings.len()).filter(|i| !report.findings[*i].violated()))
        .take(opts.max_findings_explained)
        .collect();
    let mut focus: Vec<Focus> = chosen
        .iter()
        .map(|&i| {
            let f = &report.findings[i];
            let mut focus = Focus::default();
            focus.rooms.extend(f.room);
            focus.rooms.extend(f.related.iter().copied());
            focus.pages.extend(f.pages.iter().copied());
            focus
        })
        .collect();
    // Bounded: the entries of the focus only, at most this many per finding.
    const KEEP: usize = 20_000;
    let mut kept: Vec<Vec<Entry>> = vec![Vec::new(); chosen.len()];
    let mut bytes = 0u64;
    let (_, mut sources) = open_all(paths, &mut bytes)?;
    let upto = chosen
        .iter()
        .map(|&i| positions.get(i).copied().unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0);
    merged(&mut sources, &mut bytes, |pos, e| {
        for (k, &i) in chosen.iter().enumerate() {
            if pos > positions.get(i).copied().unwrap_or(u64::MAX) {
                continue;
            }
            if let Record::Engine(TraceEvent::Routed { req, room, .. }) = &e.rec {
                if focus[k].rooms.contains(room) {
                    focus[k].requests.insert(*req);
                }
            }
            let touches = matches!(e.rec, Record::Fault(_))
                || e.rooms().iter().any(|r| focus[k].rooms.contains(r))
                || e.request().is_some_and(|r| focus[k].requests.contains(&r))
                || e.pages().iter().any(|p| focus[k].pages.contains(p));
            if touches && kept[k].len() < KEEP {
                kept[k].push(e.clone());
            }
        }
        pos <= upto
    })?;
    Ok(chosen
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let mut f = report.findings[i].clone();
            f.event = u64::MAX; // the entries are already cut at the finding
            (i, causal_trace(&kept[k], &f, &focus[k], opts.max_lines))
        })
        .collect())
}
