//! The HTML timeline of a run: one self-contained page (inline CSS, SVG and a small
//! inline script; nothing fetched) that draws a trace's entries and an oracle's findings
//! the way Jepsen's `timeline.html` draws a history.
//!
//! One vertical lane per node (router, each prefill, each decode) and per tenant of the
//! client endpoint; one row per entry, time flowing down, with the time (or, for a trace
//! whose clock never moves, such as a model checker's counterexample, the step) on the
//! left; each message from its send to its delivery as an arrow between lanes (dropped
//! ones ending in a cross, those never delivered as a stub), each KV write as a thicker
//! arrow; faults (crash, restart, partition, data faults) marked on their lanes; a
//! column per room use and node showing the pages it owns over time, and a table of every
//! room use's pages (tags and generations) and when they were let go; the first
//! violation as a red band with its invariant, the other violations red, detections (a
//! defense that fired) amber. Hovering an element shows its sentence (the
//! [`crate::render`] text); clicking shows it in the details panel.
//!
//! `kvsim replay --html`, `kvsim check --html` and `kvsim audit --html` all call
//! [`render`]: formatting only, it decides nothing (the findings are the oracle's). The
//! output is a pure function of its input (no clock, no hash-map order), so the same
//! run always gives the same bytes. A long trace is cut to [`Timeline::max_entries`]
//! entries around the first violation, and the page says so.

use crate::oracle::Finding;
use crate::render::{distinct, secs};
use crate::schema::{ClockKind, Entry, FaultEvent, MsgView, Record, RunHeader};
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, WriteId};
use kvsim_engine::node::Role;
use kvsim_engine::trace::{ReleaseKind, TraceEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

/// The most entries a page draws by default.
pub const DEFAULT_MAX_ENTRIES: usize = 3000;

/// The most (room use, node) columns drawn beside the lanes (every room use is in the
/// table below the picture).
pub const MAX_ROOM_COLUMNS: usize = 48;

/// What to draw.
pub struct Timeline<'a> {
    pub header: &'a RunHeader,
    /// The run's entries in order (or a window of them: see `first`, `total`).
    pub entries: &'a [Entry],
    /// The oracle's findings about the run (violations and detections), first first.
    pub findings: &'a [Finding],
    /// What the page shows, in a line (the command that reproduces the run).
    pub title: String,
    /// Further lines for the header (a shrunk run's reduction, a counterexample's
    /// property).
    pub notes: Vec<String>,
    /// The position in the whole trace of `entries[0]` (0 unless a window was read).
    pub first: u64,
    /// The entries of the whole trace (`entries.len()` unless a window was read).
    pub total: u64,
    /// The most entries drawn: a longer list is cut around the first violation.
    pub max_entries: usize,
}

impl<'a> Timeline<'a> {
    /// The timeline of a whole run held in memory.
    pub fn new(
        header: &'a RunHeader,
        entries: &'a [Entry],
        findings: &'a [Finding],
        title: impl Into<String>,
    ) -> Self {
        Timeline {
            header,
            entries,
            findings,
            title: title.into(),
            notes: Vec::new(),
            first: 0,
            total: entries.len() as u64,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// The time and step of the first violation (else the first finding), where a window
/// is centred.
pub fn focus_point(findings: &[Finding]) -> Option<(u64, u64)> {
    findings
        .iter()
        .find(|f| f.violated())
        .or(findings.first())
        .map(|f| (f.at_ns, f.event))
}

fn at_or_after(e: &Entry, (at, seq): (u64, u64)) -> bool {
    e.at_ns > at || (e.at_ns == at && e.seq >= seq)
}

/// The range of `entries` drawn when at most `max` are: all of them, or `max` around
/// the focus (three quarters before it: the story; a quarter after).
pub fn window(entries: &[Entry], focus: Option<(u64, u64)>, max: usize) -> std::ops::Range<usize> {
    let max = max.max(1);
    if entries.len() <= max {
        return 0..entries.len();
    }
    let at = focus
        .and_then(|p| entries.iter().position(|e| at_or_after(e, p)))
        .unwrap_or(0);
    let start = at.saturating_sub(max * 3 / 4);
    let end = (start + max).min(entries.len());
    end.saturating_sub(max)..end
}

/// Keeps the window of a trace read as a stream (a file too large to hold): at most
/// `max` entries around the focus, the way [`window`] picks them from a list.
pub struct Collector {
    max: usize,
    focus: Option<(u64, u64)>,
    kept: VecDeque<Entry>,
    reached: bool,
    /// The position of the first kept entry.
    pub first: u64,
}

impl Collector {
    pub fn new(max: usize, focus: Option<(u64, u64)>) -> Self {
        Collector {
            max: max.max(1),
            focus,
            kept: VecDeque::new(),
            reached: focus.is_none(),
            first: 0,
        }
    }

    /// The next entry; `false` once the window is full (the rest is not needed).
    pub fn push(&mut self, e: &Entry) -> bool {
        if !self.reached && self.focus.is_some_and(|p| at_or_after(e, p)) {
            self.reached = true;
        }
        if self.reached {
            if self.kept.len() >= self.max {
                return false;
            }
        } else if self.kept.len() >= self.max * 3 / 4 {
            self.kept.pop_front();
            self.first += 1;
        }
        self.kept.push_back(e.clone());
        true
    }

    pub fn into_entries(self) -> Vec<Entry> {
        self.kept.into()
    }
}

// Geometry (pixels).
const ROW_H: usize = 16;
const TOP: usize = 10;
const AXIS_W: usize = 104;
const LANE_W: usize = 118;
const ROOM_W: usize = 13;
const TEXT_W: usize = 900;
const HEAD_H: usize = 92;
/// Characters of an entry's sentence shown in its row (all of it on hover and click).
const ROW_CHARS: usize = 140;

/// Escape text for HTML and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// Page tags as runs of consecutive pages of one generation:
/// `p5002..p10937@g2, p10938@g1`, at most `max` runs.
pub fn page_runs(tags: &[PageTag], max: usize) -> String {
    let mut runs: Vec<(PageTag, PageTag)> = Vec::new();
    for t in tags {
        match runs.last_mut() {
            Some((_, last))
                if last.page.0.checked_add(1) == Some(t.page.0) && last.gen == t.gen =>
            {
                *last = *t
            }
            _ => runs.push((*t, *t)),
        }
    }
    let mut parts: Vec<String> = runs
        .iter()
        .take(max)
        .map(|(a, b)| {
            if a.page == b.page {
                a.to_string()
            } else {
                format!("{}..{}@{}", a.page, b.page, a.gen)
            }
        })
        .collect();
    if runs.len() > max {
        parts.push(format!("… {} more runs", runs.len() - max));
    }
    parts.join(", ")
}

/// A time as the axis shows it: µs under a millisecond, ms under a second, else s.
fn time_label(ns: u64) -> String {
    if ns < 1_000_000 {
        format!("{}.{:03} µs", ns / 1_000, ns % 1_000)
    } else if ns < 1_000_000_000 {
        format!("{}.{:03} ms", ns / 1_000_000, (ns % 1_000_000) / 1_000)
    } else {
        secs(ns)
    }
}

struct Lane {
    id: String,
    label: String,
    role: &'static str,
}

/// One drawn row: an entry.
struct Row {
    /// The entry's index in `entries`.
    i: usize,
    lane: Option<usize>,
    kind: &'static str,
}

/// One (room use, node) ownership segment: rows `from..=to` in one state.
struct Seg {
    col: usize,
    state: &'static str,
    pages: u64,
    from: usize,
    to: usize,
    /// How it ended when the room let go of every page there (`freed`, `crash`, ...).
    end: Option<&'static str>,
}

#[derive(Default)]
struct Own {
    pages: u64,
    state: Option<(&'static str, usize)>,
    history: Vec<String>,
}

struct Picture<'a> {
    t: &'a Timeline<'a>,
    entries: &'a [Entry],
    lanes: Vec<Lane>,
    lane_of: BTreeMap<String, usize>,
    tenant_of: BTreeMap<RequestId, TenantId>,
    room_req: BTreeMap<RoomKey, (RequestId, TenantId, NodeId, NodeId)>,
    rows: Vec<Row>,
    row_of_entry: BTreeMap<usize, usize>,
    own: BTreeMap<(RoomKey, NodeId), Own>,
    cols: Vec<(RoomKey, NodeId)>,
    col_of: BTreeMap<(RoomKey, NodeId), usize>,
    segs: Vec<Seg>,
    /// The step-only axis: the clock never moves in these entries.
    steps: bool,
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Router => "router",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    }
}

fn msg_req(m: &MsgView) -> Option<RequestId> {
    match m {
        MsgView::Submit { req, .. } | MsgView::Cancel { req } | MsgView::Response { req, .. } => {
            Some(*req)
        }
        _ => None,
    }
}

impl<'a> Picture<'a> {
    fn new(t: &'a Timeline<'a>, entries: &'a [Entry]) -> Self {
        let mut p = Picture {
            t,
            entries,
            lanes: Vec::new(),
            lane_of: BTreeMap::new(),
            tenant_of: BTreeMap::new(),
            room_req: BTreeMap::new(),
            rows: Vec::new(),
            row_of_entry: BTreeMap::new(),
            own: BTreeMap::new(),
            cols: Vec::new(),
            col_of: BTreeMap::new(),
            segs: Vec::new(),
            steps: entries.iter().all(|e| e.at_ns == 0),
        };
        let mut nodes: Vec<(NodeId, &'static str)> = t
            .header
            .nodes
            .iter()
            .map(|n| (n.id, role_name(n.role)))
            .collect();
        nodes.sort();
        for (id, role) in nodes {
            p.add_lane(id.to_string(), format!("{role} {id}"), role);
        }
        for e in entries {
            match &e.rec {
                Record::Submit { req, tenant, .. } => {
                    p.tenant_of.insert(*req, *tenant);
                }
                Record::Engine(TraceEvent::Routed {
                    req,
                    tenant,
                    room,
                    prefill,
                    decode,
                    ..
                }) => {
                    p.tenant_of.entry(*req).or_insert(*tenant);
                    p.room_req.insert(*room, (*req, *tenant, *prefill, *decode));
                }
                _ => {}
            }
        }
        let tenants: BTreeSet<TenantId> = p.tenant_of.values().copied().collect();
        if t.header.client.is_some() || !tenants.is_empty() {
            for tn in tenants {
                p.add_lane(tn.to_string(), format!("tenant {tn}"), "client");
            }
        }
        p
    }

    fn add_lane(&mut self, id: String, label: String, role: &'static str) -> usize {
        if let Some(&i) = self.lane_of.get(&id) {
            return i;
        }
        self.lanes.push(Lane {
            id: id.clone(),
            label,
            role,
        });
        self.lane_of.insert(id, self.lanes.len() - 1);
        self.lanes.len() - 1
    }

    /// The lane of `node`; for the client endpoint, the lane of the request's tenant.
    fn lane(&mut self, node: NodeId, req: Option<RequestId>) -> usize {
        if Some(node) == self.t.header.client {
            return match req.and_then(|r| self.tenant_of.get(&r)) {
                Some(tn) => self.lane_of[&tn.to_string()],
                None => self.add_lane("client".into(), format!("client {node}"), "client"),
            };
        }
        let id = node.to_string();
        match self.lane_of.get(&id) {
            Some(&i) => i,
            None => self.add_lane(id, format!("node {node}"), "node"),
        }
    }

    fn tenant_lane(&mut self, req: RequestId) -> usize {
        match self.tenant_of.get(&req) {
            Some(tn) => self.lane_of[&tn.to_string()],
            None => {
                let c = self.t.header.client.unwrap_or(NodeId(u16::MAX));
                self.add_lane("client".into(), format!("client {c}"), "client")
            }
        }
    }

    /// The lane and kind of an entry's row.
    fn place(&mut self, e: &Entry) -> (Option<usize>, &'static str) {
        match &e.rec {
            Record::Submit { req, .. } => (Some(self.tenant_lane(*req)), "client"),
            Record::ClientCancel { req, .. } => (Some(self.tenant_lane(*req)), "client cancel"),
            Record::Response { req, .. } => (Some(self.tenant_lane(*req)), "client"),
            Record::Send { from, msg, .. } => (Some(self.lane(*from, msg_req(msg))), "send"),
            Record::Deliver { to, msg, .. } => (Some(self.lane(*to, msg_req(msg))), "deliver"),
            Record::Drop { to, msg, .. } => (Some(self.lane(*to, msg_req(msg))), "drop"),
            Record::WriteFailed { to, .. } => (Some(self.lane(*to, None)), "write-failed"),
            Record::TimerSet { node, .. }
            | Record::TimerCancel { node, .. }
            | Record::TimerFire { node, .. } => (Some(self.lane(*node, None)), "timer"),
            Record::Engine(ev) => {
                let kind = match ev {
                    TraceEvent::Fault { .. } => "fault node-fault",
                    TraceEvent::TagMismatch { .. }
                    | TraceEvent::KvRefused { .. }
                    | TraceEvent::TransferRefused { .. } => "event refusal",
                    _ => "event",
                };
                (Some(self.lane(ev.node(), None)), kind)
            }
            Record::Fault(f) => match f {
                FaultEvent::Crash { node, .. } => (Some(self.lane(*node, None)), "fault crash"),
                FaultEvent::Restart { node, .. } => (Some(self.lane(*node, None)), "fault restart"),
                FaultEvent::PartitionStart { prefill, .. } => {
                    (Some(self.lane(*prefill, None)), "fault partition")
                }
                FaultEvent::PartitionEnd { prefill, .. } => {
                    (Some(self.lane(*prefill, None)), "fault partition-end")
                }
                FaultEvent::DataFault { to, .. } => {
                    (Some(self.lane(*to, None)), "fault data-fault")
                }
                FaultEvent::Heal => (None, "fault heal"),
            },
            Record::Violation { detected_by, .. } => (
                None,
                if detected_by.is_some() {
                    "verdict-record detection-record"
                } else {
                    "verdict-record violation-record"
                },
            ),
            Record::End { .. } => (None, "end"),
        }
    }

    fn build_rows(&mut self) {
        for (i, e) in self.entries.iter().enumerate() {
            // Timer bookkeeping stays in the JSON trace, as in the text trace.
            if matches!(e.rec, Record::TimerSet { .. } | Record::TimerCancel { .. }) {
                continue;
            }
            let (lane, kind) = self.place(e);
            self.row_of_entry.insert(i, self.rows.len());
            self.rows.push(Row { i, lane, kind });
        }
        for r in 0..self.rows.len() {
            let e = &self.entries[self.rows[r].i];
            self.ownership(r, e);
        }
        // Close what is still owned at the end.
        let last = self.rows.len().saturating_sub(1);
        let open: Vec<(RoomKey, NodeId)> = self
            .own
            .iter()
            .filter(|(_, o)| o.state.is_some())
            .map(|(k, _)| *k)
            .collect();
        for k in open {
            self.close(k, last, None);
        }
    }

    fn col(&mut self, k: (RoomKey, NodeId)) -> usize {
        if let Some(&c) = self.col_of.get(&k) {
            return c;
        }
        self.cols.push(k);
        self.col_of.insert(k, self.cols.len() - 1);
        self.cols.len() - 1
    }

    /// `k` is in `state` from row `r` (its page count as `own.pages` says).
    fn enter(&mut self, k: (RoomKey, NodeId), r: usize, state: &'static str) {
        self.close(k, r, None);
        let o = self.own.entry(k).or_default();
        if o.pages > 0 {
            o.state = Some((state, r));
        }
    }

    fn close(&mut self, k: (RoomKey, NodeId), r: usize, end: Option<&'static str>) {
        let col = self.col(k);
        let o = self.own.entry(k).or_default();
        if let Some((state, from)) = o.state.take() {
            let pages = o.pages;
            self.segs.push(Seg {
                col,
                state,
                pages,
                from,
                to: r.max(from),
                end,
            });
        }
    }

    fn note(&mut self, k: (RoomKey, NodeId), r: usize, what: String) {
        let at = self.when(self.rows[r].i);
        self.own
            .entry(k)
            .or_default()
            .history
            .push(format!("{what} ({at})"));
    }

    fn when(&self, i: usize) -> String {
        let e = &self.entries[i];
        if self.steps {
            format!("step {}", e.seq)
        } else {
            time_label(e.at_ns)
        }
    }

    /// Page ownership: what each room use holds on each node.
    fn ownership(&mut self, r: usize, e: &Entry) {
        use TraceEvent::*;
        let Record::Engine(ev) = &e.rec else {
            if let Record::Fault(FaultEvent::Crash { node, .. }) = &e.rec {
                let gone: Vec<(RoomKey, NodeId)> = self
                    .own
                    .iter()
                    .filter(|((_, n), o)| n == node && o.state.is_some())
                    .map(|(k, _)| *k)
                    .collect();
                for k in gone {
                    self.close(k, r, Some("crash"));
                    self.note(
                        k,
                        r,
                        format!("{node} crashes: its record of the pages is gone"),
                    );
                    self.own.entry(k).or_default().pages = 0;
                }
            }
            return;
        };
        match ev {
            PagesReserved { node, room, pages } => {
                let k = (*room, *node);
                self.own.entry(k).or_default().pages += pages.len() as u64;
                self.note(
                    k,
                    r,
                    format!("reserves {} pages [{}]", pages.len(), page_runs(pages, 6)),
                );
                self.enter(k, r, "reserved");
            }
            PagesExpectWrite { node, room, pages } => {
                let k = (*room, *node);
                self.note(k, r, format!("expects writes into {} pages", pages.len()));
                self.enter(k, r, "writing");
            }
            PagesReady { node, room, pages } => {
                let k = (*room, *node);
                self.note(k, r, format!("{} pages ready", pages.len()));
                self.enter(k, r, "ready");
            }
            Quarantined { node, room, pages } => {
                let k = (*room, *node);
                self.note(k, r, format!("quarantines {} pages", pages.len()));
                self.enter(k, r, "quarantined");
            }
            PagesReleased {
                node,
                room,
                pages,
                how,
                held,
            } => {
                let k = (*room, *node);
                let (word, end) = match how {
                    ReleaseKind::Owner => ("releases", "freed"),
                    ReleaseKind::Unchecked => ("frees unchecked", "unchecked-free"),
                };
                let held = if held.is_empty() {
                    String::new()
                } else {
                    format!(", {} still held: draining", held.len())
                };
                self.note(
                    k,
                    r,
                    format!(
                        "{word} {} pages [{}]{held}",
                        pages.len(),
                        page_runs(pages, 6)
                    ),
                );
                self.release(k, r, pages.len() as u64, end);
            }
            QuarantineReleased {
                node,
                room,
                pages,
                acked,
                ..
            } => {
                let k = (*room, *node);
                self.note(
                    k,
                    r,
                    format!(
                        "releases {} quarantined pages on the ack for {acked}",
                        pages.len()
                    ),
                );
                self.release(k, r, pages.len() as u64, "quarantine-released");
            }
            _ => {}
        }
    }

    fn release(&mut self, k: (RoomKey, NodeId), r: usize, n: u64, end: &'static str) {
        let state = self.own.get(&k).and_then(|o| o.state).map(|s| s.0);
        let left = {
            let o = self.own.entry(k).or_default();
            o.pages.saturating_sub(n)
        };
        if left == 0 {
            self.close(k, r, Some(end));
            self.own.entry(k).or_default().pages = 0;
        } else {
            self.close(k, r, None);
            let o = self.own.entry(k).or_default();
            o.pages = left;
            o.state = state.map(|s| (s, r));
        }
    }

    fn y(&self, row: usize) -> usize {
        TOP + row * ROW_H + ROW_H / 2
    }

    fn lane_x(&self, lane: usize) -> usize {
        AXIS_W + lane * LANE_W + LANE_W / 2
    }

    fn rooms_x(&self) -> usize {
        AXIS_W + self.lanes.len() * LANE_W + 6
    }

    fn drawn_cols(&self) -> usize {
        self.cols.len().min(MAX_ROOM_COLUMNS)
    }

    fn text_x(&self) -> usize {
        self.rooms_x() + self.drawn_cols() * ROOM_W + 14
    }

    fn width(&self) -> usize {
        self.text_x() + TEXT_W
    }
}

/// A message in flight: the key a send and its delivery share.
fn msg_key(from: NodeId, to: NodeId, msg: &MsgView) -> (NodeId, NodeId, String) {
    (from, to, msg.summary())
}

fn msg_write(msg: &MsgView) -> Option<WriteId> {
    match msg {
        MsgView::KvWrite { id, .. } => Some(*id),
        _ => None,
    }
}

/// Render the page.
pub fn render(t: &Timeline) -> String {
    let range = window(t.entries, focus_point(t.findings), t.max_entries);
    let entries = &t.entries[range.clone()];
    let mut p = Picture::new(t, entries);
    p.build_rows();
    let mut svg = String::new();
    let height = TOP * 2 + p.rows.len().max(1) * ROW_H;
    let width = p.width();
    let _ = write!(
        svg,
        r#"<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#
    );
    svg.push_str(
        r#"<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="context-stroke"/></marker></defs>"#,
    );
    draw_lanes(&p, &mut svg, height);
    draw_rooms(&p, &mut svg);
    draw_rows(&p, &mut svg);
    let arrows = draw_arrows(&p, &mut svg);
    let markers = draw_findings(&p, &mut svg);
    svg.push_str("</svg>");

    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(
        html,
        "<title>{}</title>",
        esc(&format!("kvsim timeline: {}", t.title))
    );
    let _ = writeln!(html, "<style>\n{CSS}</style>\n</head>\n<body>");
    header_html(&p, &mut html, (range.start, range.end), arrows, markers);
    let _ = write!(
        html,
        r#"<div id="heads" style="width:{width}px">{}</div>"#,
        heads_svg(&p, width)
    );
    let _ = writeln!(html, r#"<div id="main">{svg}</div>"#);
    rooms_table(&p, &mut html);
    html.push_str(r#"<aside id="details"><b>Details</b><div id="details-text">Click an event, an arrow or a marker to see its full text.</div></aside>"#);
    html.push('\n');
    let _ = writeln!(
        html,
        r#"<script type="application/json" id="kvsim-data">{}</script>"#,
        data_json(&p, (range.start, range.end))
    );
    let _ = writeln!(html, "<script>\n{JS}</script>\n</body>\n</html>");
    html
}

fn heads_svg(p: &Picture, width: usize) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEAD_H}" viewBox="0 0 {width} {HEAD_H}">"#
    );
    let _ = write!(
        s,
        r#"<text x="8" y="{}" class="axis-head">{}</text>"#,
        HEAD_H - 12,
        if p.steps { "step" } else { "time" }
    );
    for (i, l) in p.lanes.iter().enumerate() {
        let x = AXIS_W + i * LANE_W;
        let _ = write!(
            s,
            r#"<g class="lane {role}" data-lane="{id}" data-role="{role}"><rect x="{x0}" y="{y0}" width="{w}" height="30" rx="4"/><text x="{cx}" y="{ty}" text-anchor="middle">{label}</text></g>"#,
            role = l.role,
            id = esc(&l.id),
            x0 = x + 4,
            y0 = HEAD_H - 36,
            w = LANE_W - 8,
            cx = x + LANE_W / 2,
            ty = HEAD_H - 17,
            label = esc(&l.label)
        );
    }
    for c in 0..p.drawn_cols() {
        let (room, node) = p.cols[c];
        let x = p.rooms_x() + c * ROOM_W + ROOM_W / 2;
        let _ = write!(
            s,
            r#"<text class="room-head" data-room="{room}" data-node="{node}" transform="translate({x},{y}) rotate(-90)">{room} {node}</text>"#,
            x = x + 3,
            y = HEAD_H - 4
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" class="axis-head">what happened (hover or click for all of it)</text></svg>"#,
        p.text_x(),
        HEAD_H - 12
    );
    s
}

fn draw_lanes(p: &Picture, svg: &mut String, height: usize) {
    for (i, l) in p.lanes.iter().enumerate() {
        let x = p.lane_x(i);
        let _ = write!(
            svg,
            r#"<line class="lane-line {}" data-lane="{}" x1="{x}" y1="0" x2="{x}" y2="{height}"/>"#,
            l.role,
            esc(&l.id)
        );
    }
    // The axis: a label on every row whose time (or step) differs from the row above.
    svg.push_str(r#"<g class="axis">"#);
    let mut last: Option<u64> = None;
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        let v = if p.steps { e.seq } else { e.at_ns };
        if last != Some(v) {
            let label = p.when(row.i);
            let _ = write!(
                svg,
                r#"<text class="tick" x="{}" y="{}" text-anchor="end" data-ns="{}" data-seq="{}">{}</text>"#,
                AXIS_W - 8,
                p.y(r) + 4,
                e.at_ns,
                e.seq,
                esc(&label)
            );
            last = Some(v);
        }
    }
    svg.push_str("</g>");
}

fn draw_rooms(p: &Picture, svg: &mut String) {
    for seg in p.segs.iter().filter(|s| s.col < MAX_ROOM_COLUMNS) {
        let (room, node) = p.cols[seg.col];
        let x = p.rooms_x() + seg.col * ROOM_W + 2;
        let y0 = p.y(seg.from) - ROW_H / 2 + 2;
        let y1 = p.y(seg.to) + ROW_H / 2 - 2;
        let end = seg
            .end
            .map_or(String::new(), |e| format!(" data-end=\"{e}\""));
        let _ = write!(
            svg,
            r#"<rect class="seg {state}" data-room="{room}" data-node="{node}" data-state="{state}" data-pages="{pages}"{end} x="{x}" y="{y0}" width="{w}" height="{h}"><title>{room} on {node}: {pages} pages {state}{ended}</title></rect>"#,
            state = seg.state,
            pages = seg.pages,
            w = ROOM_W - 4,
            h = (y1 - y0).max(2),
            ended = seg.end.map_or(String::new(), |e| format!(", then {e}"))
        );
        if let Some(e) = seg.end {
            let _ = write!(
                svg,
                r#"<line class="freed {e}" data-room="{room}" data-node="{node}" x1="{}" x2="{}" y1="{y1}" y2="{y1}"/>"#,
                x - 2,
                x + ROOM_W - 2
            );
        }
    }
}

fn draw_rows(p: &Picture, svg: &mut String) {
    let width = p.width();
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        let text = e.text();
        let text = text.trim();
        let y = p.y(r);
        let lane = row.lane.map_or(String::new(), |l| {
            format!(r#" data-lane="{}""#, esc(&p.lanes[l].id))
        });
        let _ = write!(
            svg,
            r#"<g class="row {kind}" id="e{pos}" data-i="{pos}" data-seq="{seq}" data-ns="{ns}"{lane}>"#,
            kind = row.kind,
            pos = p.t.first + (row.i as u64),
            seq = e.seq,
            ns = e.at_ns
        );
        let _ = write!(
            svg,
            r#"<rect class="hit" x="0" y="{}" width="{width}" height="{ROW_H}"/>"#,
            y - ROW_H / 2
        );
        match row.lane {
            Some(l) => {
                let x = p.lane_x(l);
                if row.kind.starts_with("fault") {
                    let _ = write!(
                        svg,
                        r#"<path class="mark" d="M{},{}l6,6l-6,6l-6,-6z"/>"#,
                        x,
                        y - 6
                    );
                } else {
                    let _ = write!(svg, r#"<circle class="mark" cx="{x}" cy="{y}" r="3"/>"#);
                }
            }
            None => {
                let _ = write!(
                    svg,
                    r#"<line class="mark" x1="{AXIS_W}" x2="{}" y1="{y}" y2="{y}"/>"#,
                    p.text_x() - 6
                );
            }
        }
        let _ = write!(
            svg,
            r#"<text class="row-text" x="{}" y="{}">{}</text><title>{}</title></g>"#,
            p.text_x(),
            y + 4,
            esc(&cut(text, ROW_CHARS)),
            esc(&format!("{} (#{}): {}", p.when(row.i), e.seq, text))
        );
    }
}

/// Messages from send to delivery (or drop), KV writes from `KvSent` to `KvLanded`
/// where the trace has no message for them. Returns how many arrows it drew.
fn draw_arrows(p: &Picture, svg: &mut String) -> usize {
    let mut drawn = 0;
    let mut in_flight: BTreeMap<(NodeId, NodeId, String), VecDeque<usize>> = BTreeMap::new();
    let mut matched: BTreeSet<usize> = BTreeSet::new();
    let mut writes_as_messages: BTreeSet<WriteId> = BTreeSet::new();
    let mut arrow = |svg: &mut String,
                     cls: &str,
                     (a, b): (usize, usize),
                     (ra, rb): (usize, usize),
                     (from, to): (&str, &str),
                     title: &str,
                     pos: u64| {
        let (x1, y1) = (p.lane_x(a), p.y(ra));
        let (x2, y2) = (p.lane_x(b), p.y(rb));
        let dash = if cls.contains("dropped") {
            ""
        } else {
            r#" marker-end="url(#head)""#
        };
        let _ = write!(
            svg,
            r#"<g class="arrow {cls}" data-from="{from}" data-to="{to}" data-i="{pos}"><line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}"{dash}/>"#
        );
        if cls.contains("dropped") {
            let _ = write!(
                svg,
                r#"<path class="cross" d="M{},{}l8,8m0,-8l-8,8"/>"#,
                x2 - 4,
                y2 - 4
            );
        }
        let _ = write!(svg, "<title>{}</title></g>", esc(title));
        drawn += 1;
    };
    let pos = |i: usize| p.t.first + i as u64;
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        match &e.rec {
            Record::Send { from, to, msg, .. } => {
                in_flight
                    .entry(msg_key(*from, *to, msg))
                    .or_default()
                    .push_back(r);
                if let Some(w) = msg_write(msg) {
                    writes_as_messages.insert(w);
                }
            }
            Record::Deliver { from, to, msg } | Record::Drop { from, to, msg, .. } => {
                let dropped = matches!(e.rec, Record::Drop { .. });
                let send = in_flight
                    .get_mut(&msg_key(*from, *to, msg))
                    .and_then(|q| q.pop_front());
                let req = msg_req(msg);
                let mut pp = Picture::lane_ro(p, *from, req);
                let b = Picture::lane_ro(p, *to, req);
                let start = match send {
                    Some(s) => {
                        matched.insert(s);
                        s
                    }
                    None => r,
                };
                if pp.is_none() {
                    pp = b;
                }
                let (Some(a), Some(b)) = (pp, b) else {
                    continue;
                };
                let mut cls = String::from(if msg_write(msg).is_some() {
                    "kv"
                } else {
                    "msg"
                });
                if dropped {
                    cls.push_str(" dropped");
                }
                if let Some(w) = msg_write(msg) {
                    writes_as_messages.insert(w);
                }
                let text = e.text();
                arrow(
                    svg,
                    &cls,
                    (a, b),
                    (start, r),
                    (&p.lanes[a].id, &p.lanes[b].id),
                    text.trim(),
                    pos(row.i),
                );
            }
            _ => {}
        }
    }
    // Sends never delivered (in flight at the end, or cut off by the window).
    for (r, row) in p.rows.iter().enumerate() {
        if let Record::Send { from, to, msg, .. } = &p.entries[row.i].rec {
            if matched.contains(&r) {
                continue;
            }
            let req = msg_req(msg);
            let (Some(a), Some(b)) = (
                Picture::lane_ro(p, *from, req),
                Picture::lane_ro(p, *to, req),
            ) else {
                continue;
            };
            let text = format!("{} (not delivered in this trace)", p.entries[row.i].text());
            let cls = if msg_write(msg).is_some() {
                "kv pending"
            } else {
                "msg pending"
            };
            let end = (r + 1).min(p.rows.len().saturating_sub(1));
            arrow(
                svg,
                cls,
                (a, b),
                (r, end),
                (&p.lanes[a].id, &p.lanes[b].id),
                &text,
                pos(row.i),
            );
        }
    }
    // KV writes the trace states only as engine events.
    let mut sent: BTreeMap<WriteId, (usize, NodeId)> = BTreeMap::new();
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        match &e.rec {
            Record::Engine(TraceEvent::KvSent { node, write, .. })
                if !writes_as_messages.contains(write) =>
            {
                sent.insert(*write, (r, *node));
            }
            Record::Engine(
                ev @ (TraceEvent::KvLanded { node, write, .. }
                | TraceEvent::KvRefused { node, write, .. }),
            ) => {
                let Some((s, from)) = sent.get(write).copied() else {
                    continue;
                };
                let (Some(a), Some(b)) = (
                    Picture::lane_ro(p, from, None),
                    Picture::lane_ro(p, *node, None),
                ) else {
                    continue;
                };
                let cls = if matches!(ev, TraceEvent::KvRefused { .. }) {
                    "kv refused"
                } else {
                    "kv"
                };
                let text = e.text();
                arrow(
                    svg,
                    cls,
                    (a, b),
                    (s, r),
                    (&p.lanes[a].id, &p.lanes[b].id),
                    text.trim(),
                    pos(row.i),
                );
            }
            _ => {}
        }
    }
    drawn
}

impl Picture<'_> {
    /// The lane of `node` without adding one (for drawing).
    fn lane_ro(p: &Picture, node: NodeId, req: Option<RequestId>) -> Option<usize> {
        if Some(node) == p.t.header.client {
            return req
                .and_then(|r| p.tenant_of.get(&r))
                .and_then(|tn| p.lane_of.get(&tn.to_string()).copied())
                .or_else(|| p.lane_of.get("client").copied());
        }
        p.lane_of.get(&node.to_string()).copied()
    }

    /// The row where finding `f` is drawn: its own record when the trace has one, else
    /// the last entry of its step.
    fn finding_row(&self, f: &Finding) -> Option<usize> {
        let own = self
            .rows
            .iter()
            .position(|r| self.entries[r.i].rec.is_finding(f));
        own.or_else(|| {
            self.rows
                .iter()
                .rposition(|r| {
                    let e = &self.entries[r.i];
                    (e.at_ns, e.seq) <= (f.at_ns, f.event)
                })
                .filter(|&r| {
                    let e = &self.entries[self.rows[r].i];
                    e.seq == f.event || r + 1 < self.rows.len()
                })
        })
    }

    /// The lanes a finding involves: the nodes of its pages, its room's halves.
    fn finding_lanes(&self, f: &Finding, row: usize) -> Vec<usize> {
        let mut nodes: BTreeSet<NodeId> = f.pages.iter().map(|(n, _)| *n).collect();
        if let Some((_, _, pf, dc)) = f.room.and_then(|r| self.room_req.get(&r)) {
            nodes.insert(*pf);
            nodes.insert(*dc);
        }
        let mut lanes: Vec<usize> = nodes
            .into_iter()
            .filter_map(|n| Picture::lane_ro(self, n, None))
            .collect();
        if lanes.is_empty() {
            lanes.extend(self.rows[row].lane);
        }
        lanes.sort();
        lanes.dedup();
        lanes
    }
}

/// Every finding at its row; the first violation prominent. Returns how many it drew.
fn draw_findings(p: &Picture, svg: &mut String) -> usize {
    let first = p.t.findings.iter().position(Finding::violated);
    let width = p.width();
    let mut drawn = 0;
    for (k, f) in p.t.findings.iter().enumerate() {
        let Some(row) = p.finding_row(f) else {
            continue;
        };
        let y = p.y(row);
        let lanes = p.finding_lanes(f, row);
        let is_first = Some(k) == first;
        let (cls, id) = match (f.violated(), is_first) {
            (true, true) => ("finding violation first", r#" id="first-violation""#),
            (true, false) => ("finding violation", ""),
            (false, _) => ("finding detection", ""),
        };
        let lane_ids: Vec<&str> = lanes.iter().map(|&l| p.lanes[l].id.as_str()).collect();
        let _ = write!(
            svg,
            r#"<g class="{cls}"{id} data-invariant="{inv}" data-verdict="{verdict}" data-lanes="{lanes}" data-i="{pos}">"#,
            inv = f.violation.invariant,
            verdict = if f.violated() { "violated" } else { "detected" },
            lanes = esc(&lane_ids.join(" ")),
            pos = p.t.first + p.rows[row].i as u64,
        );
        let _ = write!(
            svg,
            r#"<rect class="band" x="0" y="{}" width="{width}" height="{ROW_H}"/>"#,
            y - ROW_H / 2
        );
        for &l in &lanes {
            let _ = write!(
                svg,
                r#"<circle class="spot" data-lane="{}" cx="{}" cy="{y}" r="{}"/>"#,
                esc(&p.lanes[l].id),
                p.lane_x(l),
                if is_first { 9 } else { 7 }
            );
        }
        let label = format!(
            "{} {}",
            f.violation.invariant,
            if f.violated() { "VIOLATED" } else { "DETECTED" }
        );
        let x = lanes.last().map_or(AXIS_W + 4, |&l| p.lane_x(l) + 12);
        let _ = write!(
            svg,
            r#"<text class="finding-label" x="{x}" y="{}">{}</text><title>{}</title></g>"#,
            y - 6,
            esc(&label),
            esc(&format!("{}: {}", f.verdict(), f.violation))
        );
        drawn += 1;
    }
    drawn
}

fn header_html(
    p: &Picture,
    html: &mut String,
    (from, to): (usize, usize),
    arrows: usize,
    markers: usize,
) {
    let t = p.t;
    let h = t.header;
    let violated = distinct(
        &t.findings
            .iter()
            .filter(|f| f.violated())
            .cloned()
            .collect::<Vec<_>>(),
    );
    let detected: Vec<String> = t
        .findings
        .iter()
        .filter(|f| !f.violated())
        .map(|f| {
            format!(
                "{} (by {})",
                f.violation.invariant,
                f.detected_by.unwrap_or("?")
            )
        })
        .collect();
    let _ = writeln!(html, "<header>\n<h1>{}</h1>", esc(&t.title));
    for n in &t.notes {
        let _ = writeln!(html, r#"<p class="note">{}</p>"#, esc(n));
    }
    let defenses_off: Vec<String> = serde_json::to_value(h.defenses)
        .ok()
        .and_then(|v| v.as_object().cloned())
        .map(|o| {
            o.iter()
                .filter(|(_, v)| v.as_bool() == Some(false))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    html.push_str(r#"<table id="facts">"#);
    let mut fact = |k: &str, id: &str, v: String| {
        let _ = write!(
            html,
            r#"<tr><th>{k}</th><td id="{id}">{}</td></tr>"#,
            esc(&v)
        );
    };
    fact(
        "scenario",
        "scenario",
        h.scenario.clone().unwrap_or_else(|| "-".into()),
    );
    fact("seed", "seed", h.seed.map_or("-".into(), |s| s.to_string()));
    fact("bug switches", "bugs", h.bugs.to_string());
    fact(
        "defenses off",
        "defenses-off",
        if defenses_off.is_empty() {
            "none".into()
        } else {
            defenses_off.join(", ")
        },
    );
    fact(
        "trace",
        "source",
        format!(
            "written by {}, {} clock; {} nodes, page {} tokens, context {} tokens",
            h.source,
            match h.clock {
                ClockKind::Simulated => "simulated",
                ClockKind::Wall => "wall",
            },
            h.nodes.len(),
            h.page_size,
            h.context_len
        ),
    );
    html.push_str("</table>\n");
    let names: Vec<String> = violated.iter().map(|i| i.to_string()).collect();
    let _ = write!(
        html,
        r#"<p id="verdict" data-verdict="{}" class="{}">verdict: {}"#,
        if names.is_empty() {
            "clean"
        } else {
            "violated"
        },
        if names.is_empty() {
            "clean"
        } else {
            "violated"
        },
        if names.is_empty() {
            "no violation".to_string()
        } else {
            format!("VIOLATED {}", names.join(", "))
        }
    );
    if !detected.is_empty() {
        let _ = write!(
            html,
            "; detected (a defense fired, nothing leaked): {}",
            esc(&detected.join(", "))
        );
    }
    html.push_str("</p>\n");
    if let Some(f) = t.findings.iter().find(|f| f.violated()) {
        let _ = writeln!(
            html,
            r##"<p id="first-violation-text" data-invariant="{}"><a href="#first-violation" onclick="kvsimJump(event)">first violation</a> at {} (step #{}): <b>{}</b>: {}</p>"##,
            f.violation.invariant,
            esc(&if p.steps {
                format!("step {}", f.event)
            } else {
                time_label(f.at_ns)
            }),
            f.event,
            esc(&f.verdict()),
            esc(&f.violation.to_string())
        );
    }
    let total = t.total.max(t.first + t.entries.len() as u64);
    let shown = (to - from) as u64;
    let cap = if shown < total {
        format!(
            r#"<p id="cap" class="cap">This page draws {shown} of the trace's {total} entries (#{} to #{}), the cap being {}: the window is placed around the first violation. The JSON trace has all of them.</p>"#,
            t.first + from as u64 + 1,
            t.first + to as u64,
            t.max_entries
        )
    } else {
        String::new()
    };
    html.push_str(&cap);
    let _ = writeln!(
        html,
        r#"<p class="summary">{} lanes, {} rows, {arrows} arrows, {markers} findings drawn; {} room uses. <span id="drawn"></span></p>"#,
        p.lanes.len(),
        p.rows.len(),
        p.own.len()
    );
    html.push_str(LEGEND);
    html.push_str("</header>\n");
}

fn rooms_table(p: &Picture, html: &mut String) {
    html.push_str(r#"<section id="rooms"><h2>Page ownership per room use</h2>"#);
    if p.cols.len() > MAX_ROOM_COLUMNS {
        let _ = write!(
            html,
            r#"<p class="cap">The picture has a column for the first {MAX_ROOM_COLUMNS} of {} (room use, node) pairs; this table has them all.</p>"#,
            p.cols.len()
        );
    }
    html.push_str("<table><tr><th>room use</th><th>request</th><th>node</th><th>its pages over time</th></tr>");
    for (k, o) in &p.own {
        let (room, node) = *k;
        let req = p
            .room_req
            .get(&room)
            .map_or("-".to_string(), |(q, tn, _, _)| format!("{q} ({tn})"));
        let _ = write!(
            html,
            r#"<tr class="room" data-room="{room}" data-node="{node}"><td>{room}</td><td>{}</td><td>{node}</td><td>{}</td></tr>"#,
            esc(&req),
            esc(&o.history.join(" → "))
        );
    }
    html.push_str("</table></section>\n");
}

fn data_json(p: &Picture, (from, to): (usize, usize)) -> String {
    let t = p.t;
    let first = t.findings.iter().find(|f| f.violated());
    let v = serde_json::json!({
        "scenario": t.header.scenario,
        "seed": t.header.seed,
        "bugs": t.header.bugs,
        "source": t.header.source,
        "title": t.title,
        "verdict": if first.is_some() { "violated" } else { "clean" },
        "first_violation": first.map(|f| serde_json::json!({
            "invariant": f.violation.invariant.to_string(),
            "text": f.violation.to_string(),
            "at_ns": f.at_ns,
            "seq": f.event,
        })),
        "findings": t.findings.iter().map(|f| serde_json::json!({
            "invariant": f.violation.invariant.to_string(),
            "verdict": if f.violated() { "violated" } else { "detected" },
            "at_ns": f.at_ns,
            "seq": f.event,
        })).collect::<Vec<_>>(),
        "lanes": p.lanes.iter().map(|l| serde_json::json!({"id": l.id, "label": l.label, "role": l.role})).collect::<Vec<_>>(),
        "entries": {"first": t.first + from as u64, "drawn": to - from, "total": t.total.max(t.first + t.entries.len() as u64), "cap": t.max_entries},
    });
    // Inside a script element: no `<`, `>` or `&` may appear as themselves.
    v.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

const LEGEND: &str = r#"<p class="legend"><span class="k msg">→ message</span> <span class="k kv">⇒ KV write</span> <span class="k dropped">✕ dropped</span> <span class="k pending">⋯ not delivered</span> <span class="k fault">◆ fault</span> <span class="k violation">● violation</span> <span class="k detection">● detection (a defense fired)</span> room columns: <span class="k s-reserved">reserved</span> <span class="k s-writing">writing</span> <span class="k s-ready">ready</span> <span class="k s-quarantined">quarantined</span></p>"#;

const CSS: &str = include_str!("page.css");

const JS: &str = include_str!("page.js");

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::ids::{Generation, PageId};
    use kvsim_engine::invariant::{Invariant, Violation};
    use kvsim_engine::world::Topology;

    fn header() -> RunHeader {
        let mut h = RunHeader::new(
            "test",
            ClockKind::Simulated,
            &EngineConfig::default(),
            &Topology {
                prefill_pools: vec![8],
                decode_pools: vec![8],
            },
        );
        h.scenario = Some("tiny <\"&'>".into());
        h.seed = Some(7);
        h
    }

    fn tag(p: u32, g: u64) -> PageTag {
        PageTag {
            page: PageId(p),
            gen: Generation(g),
        }
    }

    fn entries() -> Vec<Entry> {
        let room = RoomKey::new(1, 1);
        let (r, p, d, c) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let submit = MsgView::Submit {
            req: RequestId(0),
            tenant: TenantId(1),
            prompt_len: 64,
            max_new_tokens: 2,
        };
        let start = MsgView::PrefillStart {
            room,
            req: RequestId(0),
            prompt_len: 64,
            decode: d,
        };
        let recs = vec![
            (
                0,
                Record::Submit {
                    req: RequestId(0),
                    tenant: TenantId(1),
                    prompt_len: 64,
                    max_new_tokens: 2,
                },
            ),
            (
                0,
                Record::Send {
                    from: c,
                    to: r,
                    msg: submit.clone(),
                    deliver_at_ns: 50_000,
                    duplicate: false,
                },
            ),
            (
                50_000,
                Record::Deliver {
                    from: c,
                    to: r,
                    msg: submit,
                },
            ),
            (
                50_000,
                Record::Engine(TraceEvent::Routed {
                    node: r,
                    req: RequestId(0),
                    tenant: TenantId(1),
                    room,
                    prefill: p,
                    decode: d,
                    prompt_len: 64,
                    max_new_tokens: 2,
                }),
            ),
            (
                50_000,
                Record::Send {
                    from: r,
                    to: p,
                    msg: start.clone(),
                    deliver_at_ns: 100_000,
                    duplicate: false,
                },
            ),
            (
                100_000,
                Record::Deliver {
                    from: r,
                    to: p,
                    msg: start.clone(),
                },
            ),
            (
                100_000,
                Record::Engine(TraceEvent::PagesReserved {
                    node: p,
                    room,
                    pages: vec![tag(1, 1), tag(2, 1), tag(3, 2)],
                }),
            ),
            (
                100_000,
                Record::Send {
                    from: r,
                    to: d,
                    msg: start.clone(),
                    deliver_at_ns: 150_000,
                    duplicate: false,
                },
            ),
            (
                120_000,
                Record::Drop {
                    from: r,
                    to: d,
                    msg: start,
                    reason: kvsim_engine::world::DropReason::Lost,
                },
            ),
            (
                130_000,
                Record::Fault(FaultEvent::Crash {
                    node: d,
                    epoch: 0,
                    flushed: vec![],
                }),
            ),
            (
                140_000,
                Record::Engine(TraceEvent::PagesReleased {
                    node: p,
                    room,
                    pages: vec![tag(1, 1), tag(2, 1), tag(3, 2)],
                    how: ReleaseKind::Owner,
                    held: vec![],
                }),
            ),
        ];
        recs.into_iter()
            .enumerate()
            .map(|(i, (at_ns, rec))| Entry {
                at_ns,
                seq: i as u64 + 1,
                rec,
            })
            .collect()
    }

    fn finding(inv: Invariant, detected: Option<&'static str>, seq: u64) -> Finding {
        Finding {
            violation: Violation::new(inv, "a <b> & \"c\""),
            detected_by: detected,
            at_ns: 100_000,
            event: seq,
            room: Some(RoomKey::new(1, 1)),
            related: vec![],
            pages: vec![(NodeId(1), PageId(2))],
            evidence: vec![],
        }
    }

    fn count(s: &str, pat: &str) -> usize {
        s.matches(pat).count()
    }

    #[test]
    fn lanes_arrows_and_the_first_violation_are_drawn() {
        let h = header();
        let es = entries();
        let fs = [
            finding(Invariant::S4, Some("verify_on_completion"), 6),
            finding(Invariant::S3, None, 7),
            finding(Invariant::S6, None, 8),
        ];
        let html = render(&Timeline::new(&h, &es, &fs, "kvsim replay x --seed 7"));
        // A lane per node and one per tenant.
        for lane in ["n0", "n1", "n2", "t1"] {
            assert!(
                html.contains(&format!(r#"data-lane="{lane}" data-role"#)),
                "{lane}"
            );
        }
        assert_eq!(count(&html, r#"<g class="lane "#), 4);
        // Submit and PrefillStart delivered, one dropped.
        assert_eq!(count(&html, r#"<g class="arrow msg""#), 2);
        assert_eq!(count(&html, r#"<g class="arrow msg dropped""#), 1);
        assert!(html.contains(r#"data-from="t1" data-to="n0""#));
        assert_eq!(count(&html, r#"id="first-violation""#), 1);
        assert!(html.contains(
            r#"<g class="finding violation first" id="first-violation" data-invariant="S3""#
        ));
        assert_eq!(count(&html, r#"<g class="finding detection""#), 1);
        assert_eq!(count(&html, r#"<g class="finding violation"#), 2);
        assert!(html.contains(r#"data-lanes="n1 n2""#));
        assert!(html.contains("fault crash"));
        // The room column: reserved on n1, freed.
        assert!(html.contains(r#"data-room="room1.g1" data-node="n1" data-state="reserved" data-pages="3" data-end="freed""#));
        assert!(html.contains("p1..p2@g1, p3@g2"));
        assert!(html.contains(r#"id="verdict" data-verdict="violated""#));
        // Self-contained: nothing is fetched.
        assert!(
            !html.contains(" src=") && !html.contains("href=\"http") && !html.contains("@import")
        );
    }

    #[test]
    fn strings_are_escaped() {
        let h = header();
        let es = entries();
        let fs = [finding(Invariant::S3, None, 7)];
        let html = render(&Timeline::new(&h, &es, &fs, "t <script>alert(1)</script>"));
        assert!(!html.contains("<script>alert"));
        assert!(html.contains("t &lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("tiny &lt;&quot;&amp;&#39;&gt;"));
        assert!(html.contains("a &lt;b&gt; &amp; &quot;c&quot;"));
        assert!(!html.contains("a <b>"));
        // The embedded JSON cannot close its script element.
        let data = html.split(r#"id="kvsim-data">"#).nth(1).unwrap();
        let data = data.split("</script>").next().unwrap();
        assert!(!data.contains('<') && !data.contains('>'));
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["first_violation"]["invariant"], "S3");
        assert_eq!(v["scenario"], "tiny <\"&'>");
    }

    #[test]
    fn a_clean_run_has_no_marker_and_says_so() {
        let h = header();
        let es = entries();
        let fs = [finding(Invariant::S4, Some("verify_on_completion"), 6)];
        let html = render(&Timeline::new(&h, &es, &fs, "clean"));
        assert!(!html.contains(r#"id="first-violation""#));
        assert!(html.contains(r#"data-verdict="clean""#));
        assert!(html.contains("verdict: no violation"));
        assert!(html
            .contains("detected (a defense fired, nothing leaked): S4 (by verify_on_completion)"));
    }

    #[test]
    fn a_long_trace_is_cut_around_the_first_violation_and_says_so() {
        let h = header();
        let mut es = Vec::new();
        for i in 0..1000u64 {
            es.push(Entry {
                at_ns: i * 1000,
                seq: i + 1,
                rec: Record::Engine(TraceEvent::RoomCleared {
                    node: NodeId(0),
                    room: RoomKey::new(1, i),
                }),
            });
        }
        let mut f = finding(Invariant::S3, None, 600);
        f.at_ns = 599_000;
        let fs = [f];
        let mut t = Timeline::new(&h, &es, &fs, "long");
        t.max_entries = 100;
        let r = window(&es, focus_point(&fs), 100);
        assert_eq!(r, 524..624);
        let html = render(&t);
        assert!(html.contains(r#"id="cap""#));
        assert!(html.contains("draws 100 of the trace's 1000 entries (#525 to #624)"));
        assert_eq!(count(&html, r#"<g class="row "#), 100);
        assert!(html.contains(r#"id="first-violation""#));
        // The streaming collector keeps the same window.
        let mut c = Collector::new(100, focus_point(&fs));
        for e in &es {
            if !c.push(e) {
                break;
            }
        }
        assert_eq!(c.first, 524);
        assert_eq!(c.into_entries(), es[524..624].to_vec());
    }

    #[test]
    fn the_same_input_gives_the_same_bytes() {
        let h = header();
        let es = entries();
        let fs = [finding(Invariant::S3, None, 7)];
        let a = render(&Timeline::new(&h, &es, &fs, "x"));
        let b = render(&Timeline::new(&h, &es, &fs, "x"));
        assert_eq!(a, b);
    }

    #[test]
    fn page_runs_group_consecutive_pages_of_one_generation() {
        let t = [tag(5, 2), tag(6, 2), tag(7, 2), tag(9, 2), tag(10, 1)];
        assert_eq!(page_runs(&t, 8), "p5..p7@g2, p9@g2, p10@g1");
        assert_eq!(page_runs(&t, 1), "p5..p7@g2, … 2 more runs");
    }
}
