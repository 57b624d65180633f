//! `Oracle`: the judge of one run, fed its trace line by line.
//!
//! It wraps the [`OracleState`] (the model of the run and every invariant) with what a
//! report needs and a model checker does not: when each finding happened, one finding
//! per invariant, verdict and room (so a broken room does not flood the report), the
//! canary leaks found in replies, and evidence: for every page, the last trace entry
//! that wrote it, so a finding about a page cites the write that proves it. The
//! simulator feeds it the records it produces, `kvsim audit` the lines it reads; both
//! get the same verdict from the same records.

use crate::evidence::LastWrites;
use crate::oracle_state::{Draft, OracleState, WriteFacts};
use crate::schema::{Entry, FaultEvent, Record, RunHeader};
use kvsim_engine::ids::{NodeId, PageId, RequestId, RoomKey, Token};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{DataFault, DUPLICATE_WINDOW};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A broken invariant, or a hazard a defense stopped, with where and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub violation: Violation,
    /// The defense that stopped it (a detection: nothing leaked); `None`: violated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<&'static str>,
    pub at_ns: u64,
    /// The trace sequence number of the step at which it was found.
    pub event: u64,
    pub room: Option<RoomKey>,
    /// Other room uses involved (the earlier owner whose KV was read, the room whose
    /// ack released a quarantine).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<RoomKey>,
    /// Physical pages involved, per node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<(NodeId, PageId)>,
    /// The earlier trace entries that prove it (the writes of the pages involved).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

impl Finding {
    /// A violation (it happened), not a detection.
    pub fn violated(&self) -> bool {
        self.detected_by.is_none()
    }

    /// `VIOLATED S3` or `DETECTED S4 (refused by verify_on_completion, nothing leaked)`.
    pub fn verdict(&self) -> String {
        match self.detected_by {
            None => format!("VIOLATED {}", self.violation.invariant),
            Some(d) => format!(
                "DETECTED {} (refused by {d}, nothing leaked)",
                self.violation.invariant
            ),
        }
    }
}

/// The one verdict rule of every command (`kvsim run`, `sweep`, `replay`, `merge`,
/// `audit`, the suite's rows, the bug matrix): a run fails only on a violation (it
/// happened). A detection (a defense stopped the hazard, nothing leaked) is counted and
/// shown, never a failure.
pub fn fails(findings: &[Finding]) -> bool {
    findings.iter().any(Finding::violated)
}

/// A leaked token found in a reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leak {
    pub victim_of: RequestId,
    pub owner: RequestId,
    pub token: Token,
}

/// The judge of one run.
pub struct Oracle {
    header: RunHeader,
    state: OracleState,
    findings: Vec<Finding>,
    seen: BTreeSet<(Invariant, bool, Option<RoomKey>)>,
    pub leaks: Vec<Leak>,
    /// Per page, the last entry that wrote it (bounded by the pools), shared by the
    /// pages of one write and described only when a finding cites it.
    last_write: LastWrites,
    drafts: Vec<Draft>,
    /// Bounded cleanup (L6): answered room uses by the time every node must be done
    /// with them, in order.
    cleanup: BTreeSet<(u64, RoomKey)>,
    /// Per receiving node, the facts of the KV writes that landed or were refused
    /// there lately (twice the world's [`DUPLICATE_WINDOW`]), for a stale duplicate.
    taken: BTreeMap<NodeId, VecDeque<WriteFacts>>,
    /// The stale duplicate announced by the last `data_fault` record, until it lands.
    replay: Option<WriteFacts>,
}

impl Oracle {
    pub fn new(header: RunHeader) -> Self {
        let last_write = LastWrites::new(&header);
        Oracle {
            state: OracleState::new(&header),
            header,
            findings: Vec::new(),
            seen: BTreeSet::new(),
            leaks: Vec::new(),
            last_write,
            drafts: Vec::new(),
            cleanup: BTreeSet::new(),
            taken: BTreeMap::new(),
            replay: None,
        }
    }

    pub fn header(&self) -> &RunHeader {
        &self.header
    }

    pub fn state(&self) -> &OracleState {
        &self.state
    }

    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The invariants violated (not merely detected), in the order first seen.
    pub fn violated(&self) -> Vec<Invariant> {
        let mut out: Vec<Invariant> = Vec::new();
        for f in self.findings.iter().filter(|f| f.violated()) {
            if !out.contains(&f.violation.invariant) {
                out.push(f.violation.invariant);
            }
        }
        out
    }

    /// Judge one entry; returns the findings it produced.
    pub fn observe(&mut self, e: &Entry) -> &[Finding] {
        let before = self.findings.len();
        self.drafts.clear();
        let mut drafts = std::mem::take(&mut self.drafts);
        self.check_cleanup(e, &mut drafts);
        self.track_duplicates(&e.rec);
        self.state.observe(&self.header, &e.rec, &mut drafts);
        // L6's clock starts when the router has moved on from a room use: it answered
        // the request, or it let go of the room use without an answer (an abandoned
        // attempt: `RoomCleared`). Either way every half it started must end within the
        // bound.
        if let (
            Some(bound),
            Record::Engine(
                TraceEvent::RouterResponse { room: Some(r), .. }
                | TraceEvent::RoomCleared { room: r, .. },
            ),
        ) = (self.header.cleanup_bound_ns, &e.rec)
        {
            self.cleanup.insert((e.at_ns.saturating_add(bound), *r));
        }
        if let Record::Engine(TraceEvent::RouterResponse { req, tokens, .. }) = &e.rec {
            if self.header.canary_tokens {
                for &t in tokens {
                    if let Some(owner) = crate::canary::owner(t).filter(|o| o != req) {
                        self.leaks.push(Leak {
                            victim_of: *req,
                            owner,
                            token: t,
                        });
                    }
                }
            }
        }
        for d in drafts.drain(..) {
            self.push(e, d);
        }
        self.drafts = drafts;
        self.remember_writes(e);
        &self.findings[before..]
    }

    /// A stale duplicate lands with the id of a write that landed before: keep the
    /// facts of recent landings, and put the duplicate's back in flight just before it
    /// lands (or is refused), so the one judgment of a landing applies to it. A write
    /// whose facts are gone is judged as the sends of an untraced writer are.
    fn track_duplicates(&mut self, rec: &Record) {
        match rec {
            Record::Fault(FaultEvent::DataFault {
                to,
                write,
                kind: DataFault::StaleDuplicate,
                ..
            }) => {
                self.replay = self
                    .taken
                    .get(to)
                    .and_then(|q| q.iter().rev().find(|f| f.id == *write))
                    .cloned();
            }
            Record::Engine(
                ev @ (TraceEvent::KvLanded { node, write, .. }
                | TraceEvent::KvRefused { node, write, .. }),
            ) => {
                if self.state.duplicate_lands(&mut self.replay, ev) {
                    return;
                }
                if let Some(f) = self.state.write_in_flight(*write) {
                    let q = self.taken.entry(*node).or_default();
                    if q.len() == 2 * DUPLICATE_WINDOW {
                        q.pop_front();
                    }
                    q.push_back(f.clone());
                }
            }
            _ => {}
        }
    }

    /// L6: every room use whose cleanup deadline passed before this entry must be let
    /// go by every node. At the end of a trace, every deadline is judged (a drained
    /// run's last entry may come before a deadline; it is judged against the final
    /// state then, which is what the nodes hold for good).
    fn check_cleanup(&mut self, e: &Entry, out: &mut Vec<Draft>) {
        let end = matches!(e.rec, Record::End { .. });
        while let Some(&(due, room)) = self.cleanup.first() {
            if due >= e.at_ns && !end {
                break;
            }
            self.cleanup.pop_first();
            let left = self.state.still_working(room);
            if let Some((node, what)) = left.first() {
                let bound = self.header.cleanup_bound_ns.unwrap_or(0);
                out.push(Draft {
                    invariant: Invariant::L6,
                    detected_by: None,
                    room: Some(room),
                    related: Vec::new(),
                    pages: Vec::new(),
                    detail: format!(
                        "{} ms after the answer to {}, {node} {what} (cleanup bound {} ms){}",
                        bound / 1_000_000,
                        self.state.describe(room),
                        bound / 1_000_000,
                        if left.len() > 1 {
                            format!("; {} more nodes", left.len() - 1)
                        } else {
                            String::new()
                        }
                    ),
                });
            }
        }
    }

    fn push(&mut self, e: &Entry, d: Draft) {
        if !self
            .seen
            .insert((d.invariant, d.detected_by.is_some(), d.room))
        {
            return;
        }
        let evidence = d
            .pages
            .iter()
            .filter_map(|k| self.last_write.line(*k))
            .collect();
        self.findings.push(Finding {
            violation: Violation::new(d.invariant, d.detail),
            detected_by: d.detected_by,
            at_ns: e.at_ns,
            event: e.seq,
            room: d.room,
            related: d.related,
            pages: d.pages,
            evidence,
        });
    }

    fn remember_writes(&mut self, e: &Entry) {
        if let Record::Engine(ev) = &e.rec {
            self.last_write.remember((e.at_ns, e.seq), ev);
        }
    }
}
