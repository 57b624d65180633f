//! The picture as SVG: the lane heads, the lanes and the time axis, the room columns,
//! a row per entry, the arrows (messages and KV writes) and the findings.

use crate::oracle::Finding;
use crate::schema::{MsgView, Record};
use crate::timeline::html::esc;
use crate::timeline::picture::{msg_req, Picture};
use crate::timeline::subject::MAX_ROOM_COLUMNS;
use kvsim_engine::ids::{NodeId, WriteId};
use kvsim_engine::trace::TraceEvent;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

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

/// `s` cut to `n` characters, the last one an ellipsis when it is cut.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

impl Picture<'_> {
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

    pub(super) fn width(&self) -> usize {
        self.text_x() + TEXT_W
    }
}

/// The picture drawn, and what it holds.
pub(super) struct Drawing {
    pub(super) svg: String,
    /// How many arrows it draws.
    pub(super) arrows: usize,
    /// How many findings it marks.
    pub(super) markers: usize,
}

/// Draw the picture.
pub(super) fn draw(p: &Picture) -> Drawing {
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
    draw_lanes(p, &mut svg, height);
    draw_rooms(p, &mut svg);
    draw_rows(p, &mut svg);
    let arrows = draw_arrows(p, &mut svg);
    let markers = draw_findings(p, &mut svg);
    svg.push_str("</svg>");
    Drawing {
        svg,
        arrows,
        markers,
    }
}

/// The lane heads (and the room columns' and the text's), kept in view on scrolling.
pub(super) fn heads_svg(p: &Picture, width: usize) -> String {
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

/// The lanes' lines, and the axis: the time (or step) where it changes.
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

/// The room columns: a bar per ownership segment, a line where a room use let go.
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

/// A row per entry: its mark on its lane (across all lanes when it has none) and its
/// sentence.
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
    let messages = draw_messages(p, svg);
    let pending = draw_pending(p, svg, &messages.matched);
    let writes = draw_engine_writes(p, svg, &messages.writes);
    messages.drawn + pending + writes
}

/// One arrow: from a lane at a row to a lane at a row.
struct Arrow<'s> {
    cls: &'s str,
    lanes: (usize, usize),
    rows: (usize, usize),
    title: &'s str,
    /// The position in the whole trace of the entry it stands for.
    pos: u64,
}

fn draw_arrow(p: &Picture, svg: &mut String, arrow: &Arrow) {
    let Arrow {
        cls,
        lanes: (a, b),
        rows: (ra, rb),
        title,
        pos,
    } = *arrow;
    let (from, to) = (&p.lanes[a].id, &p.lanes[b].id);
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
}

/// What the message arrows leave to the others.
#[derive(Default)]
struct Messages {
    drawn: usize,
    /// The rows of the sends that were delivered or dropped.
    matched: BTreeSet<usize>,
    /// The KV writes the trace has as messages.
    writes: BTreeSet<WriteId>,
}

/// An arrow per message delivered or dropped, from its send (else from its own row).
fn draw_messages(p: &Picture, svg: &mut String) -> Messages {
    let mut m = Messages::default();
    let mut in_flight: BTreeMap<(NodeId, NodeId, String), VecDeque<usize>> = BTreeMap::new();
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        match &e.rec {
            Record::Send { from, to, msg, .. } => {
                in_flight
                    .entry(msg_key(*from, *to, msg))
                    .or_default()
                    .push_back(r);
                m.writes.extend(msg_write(msg));
            }
            Record::Deliver { from, to, msg } | Record::Drop { from, to, msg, .. } => {
                let send = in_flight
                    .get_mut(&msg_key(*from, *to, msg))
                    .and_then(|q| q.pop_front());
                m.matched.extend(send);
                let Some(lanes) = message_lanes(p, *from, *to, msg) else {
                    continue;
                };
                m.writes.extend(msg_write(msg));
                let dropped = matches!(e.rec, Record::Drop { .. });
                let text = e.text();
                let arrow = Arrow {
                    cls: &message_class(msg, dropped),
                    lanes,
                    rows: (send.unwrap_or(r), r),
                    title: text.trim(),
                    pos: p.t.first + row.i as u64,
                };
                draw_arrow(p, svg, &arrow);
                m.drawn += 1;
            }
            _ => {}
        }
    }
    m
}

/// The lanes of a delivered or dropped message: the sender's (else the receiver's,
/// when the sender has no lane) and the receiver's.
fn message_lanes(p: &Picture, from: NodeId, to: NodeId, msg: &MsgView) -> Option<(usize, usize)> {
    let req = msg_req(msg);
    let b = Picture::lane_ro(p, to, req)?;
    let a = Picture::lane_ro(p, from, req).unwrap_or(b);
    Some((a, b))
}

fn message_class(msg: &MsgView, dropped: bool) -> String {
    let mut cls = String::from(if msg_write(msg).is_some() {
        "kv"
    } else {
        "msg"
    });
    if dropped {
        cls.push_str(" dropped");
    }
    cls
}

/// Sends never delivered (in flight at the end, or cut off by the window): a stub to
/// the next row. Returns how many it drew.
fn draw_pending(p: &Picture, svg: &mut String, matched: &BTreeSet<usize>) -> usize {
    let mut drawn = 0;
    for (r, row) in p.rows.iter().enumerate() {
        let Record::Send { from, to, msg, .. } = &p.entries[row.i].rec else {
            continue;
        };
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
        let arrow = Arrow {
            cls,
            lanes: (a, b),
            rows: (r, end),
            title: &text,
            pos: p.t.first + row.i as u64,
        };
        draw_arrow(p, svg, &arrow);
        drawn += 1;
    }
    drawn
}

/// KV writes the trace states only as engine events (not in `as_messages`): from
/// `KvSent` to `KvLanded` or `KvRefused`. Returns how many it drew.
fn draw_engine_writes(p: &Picture, svg: &mut String, as_messages: &BTreeSet<WriteId>) -> usize {
    let mut drawn = 0;
    let mut sent: BTreeMap<WriteId, (usize, NodeId)> = BTreeMap::new();
    for (r, row) in p.rows.iter().enumerate() {
        let e = &p.entries[row.i];
        let Record::Engine(ev) = &e.rec else {
            continue;
        };
        match ev {
            TraceEvent::KvSent { node, write, .. } if !as_messages.contains(write) => {
                sent.insert(*write, (r, *node));
            }
            TraceEvent::KvLanded { node, write, .. }
            | TraceEvent::KvRefused { node, write, .. } => {
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
                let arrow = Arrow {
                    cls,
                    lanes: (a, b),
                    rows: (s, r),
                    title: text.trim(),
                    pos: p.t.first + row.i as u64,
                };
                draw_arrow(p, svg, &arrow);
                drawn += 1;
            }
            _ => {}
        }
    }
    drawn
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
