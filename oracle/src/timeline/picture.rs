//! Reading a run's entries into what is drawn: the lanes (a node, a tenant), the rows
//! (an entry each, on its lane), and the pages each room use owns on each node over
//! time (segments of rows in one state, and a history for the rooms table).

use crate::oracle::Finding;
use crate::render::secs;
use crate::schema::{Entry, FaultEvent, MsgView, Record};
use crate::timeline::subject::Timeline;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId};
use kvsim_engine::node::Role;
use kvsim_engine::trace::{ReleaseKind, TraceEvent};
use std::collections::{BTreeMap, BTreeSet};

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
pub(super) fn time_label(ns: u64) -> String {
    if ns < 1_000_000 {
        format!("{}.{:03} µs", ns / 1_000, ns % 1_000)
    } else if ns < 1_000_000_000 {
        format!("{}.{:03} ms", ns / 1_000_000, (ns % 1_000_000) / 1_000)
    } else {
        secs(ns)
    }
}

/// A vertical lane: a node, or a tenant of the client endpoint.
pub(super) struct Lane {
    pub(super) id: String,
    pub(super) label: String,
    pub(super) role: &'static str,
}

/// One drawn row: an entry.
pub(super) struct Row {
    /// The entry's index in `entries`.
    pub(super) i: usize,
    pub(super) lane: Option<usize>,
    pub(super) kind: &'static str,
}

/// One (room use, node) ownership segment: rows `from..=to` in one state.
pub(super) struct Seg {
    pub(super) col: usize,
    pub(super) state: &'static str,
    pub(super) pages: u64,
    pub(super) from: usize,
    pub(super) to: usize,
    /// How it ended when the room let go of every page there (`freed`, `crash`, ...).
    pub(super) end: Option<&'static str>,
}

/// What a room use owns on a node: its pages, their state since which row, and what
/// happened to them (a line each).
#[derive(Default)]
pub(super) struct Own {
    pages: u64,
    state: Option<(&'static str, usize)>,
    pub(super) history: Vec<String>,
}

/// What is drawn: the lanes, the rows, and the pages each room use owns over time.
pub(super) struct Picture<'a> {
    pub(super) t: &'a Timeline<'a>,
    pub(super) entries: &'a [Entry],
    pub(super) lanes: Vec<Lane>,
    lane_of: BTreeMap<String, usize>,
    tenant_of: BTreeMap<RequestId, TenantId>,
    pub(super) room_req: BTreeMap<RoomKey, (RequestId, TenantId, NodeId, NodeId)>,
    pub(super) rows: Vec<Row>,
    row_of_entry: BTreeMap<usize, usize>,
    pub(super) own: BTreeMap<(RoomKey, NodeId), Own>,
    pub(super) cols: Vec<(RoomKey, NodeId)>,
    col_of: BTreeMap<(RoomKey, NodeId), usize>,
    pub(super) segs: Vec<Seg>,
    /// The step-only axis: the clock never moves in these entries.
    pub(super) steps: bool,
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Router => "router",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    }
}

pub(super) fn msg_req(m: &MsgView) -> Option<RequestId> {
    match m {
        MsgView::Submit { req, .. } | MsgView::Cancel { req } | MsgView::Response { req, .. } => {
            Some(*req)
        }
        _ => None,
    }
}

impl<'a> Picture<'a> {
    pub(super) fn new(t: &'a Timeline<'a>, entries: &'a [Entry]) -> Self {
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
                FaultEvent::Pause { node, .. } => (Some(self.lane(*node, None)), "fault pause"),
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

    pub(super) fn build_rows(&mut self) {
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

    pub(super) fn when(&self, i: usize) -> String {
        let e = &self.entries[i];
        if self.steps {
            format!("step {}", e.seq)
        } else {
            time_label(e.at_ns)
        }
    }

    /// Page ownership: what each room use holds on each node.
    fn ownership(&mut self, r: usize, e: &Entry) {
        match &e.rec {
            Record::Engine(ev) => self.engine_ownership(r, ev),
            Record::Fault(FaultEvent::Crash { node, .. }) => self.crash(r, *node),
            _ => {}
        }
    }

    /// A crash: the node's record of the pages it holds is gone.
    fn crash(&mut self, r: usize, node: NodeId) {
        let gone: Vec<(RoomKey, NodeId)> = self
            .own
            .iter()
            .filter(|((_, n), o)| *n == node && o.state.is_some())
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

    /// What an engine event does to the pages of a room use on a node.
    fn engine_ownership(&mut self, r: usize, ev: &TraceEvent) {
        use TraceEvent::*;
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
            } => self.pages_released((*room, *node), r, pages, *how, held),
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

    /// `k` lets `pages` go (its owner releases them, or they are freed unchecked),
    /// with `held` still held by a reader.
    fn pages_released(
        &mut self,
        k: (RoomKey, NodeId),
        r: usize,
        pages: &[PageTag],
        how: ReleaseKind,
        held: &[PageTag],
    ) {
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

    /// The lane of `node` without adding one (for drawing).
    pub(super) fn lane_ro(p: &Picture, node: NodeId, req: Option<RequestId>) -> Option<usize> {
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
    pub(super) fn finding_row(&self, f: &Finding) -> Option<usize> {
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
    pub(super) fn finding_lanes(&self, f: &Finding, row: usize) -> Vec<usize> {
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
