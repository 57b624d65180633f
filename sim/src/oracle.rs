//! Oracles: the invariants of DESIGN.md section 4, checked from outside the engine.
//!
//! The oracle watches every delivery, every trace event and every node after every
//! event. It knows the workload (each request's true prompt length and canary tokens)
//! and the topology, never the engine's flags: a defense that catches a bug does not
//! hide it, because the oracle checks the attempt (a write aimed at a page its room no
//! longer owns, a read of pages the request never wrote) before the defense acts.
//! White-box checks read node state (pools, and `SymbolicGpu` provenance where the
//! backend records it); the black-box canary check reads only replies.

use crate::scenario::{canary_owner, PlannedRequest};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RequestId, RoomKey, Token};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::{Msg, Status, TransferOutcome};
use kvsim_engine::node::Node;
use kvsim_engine::trace::{Side, TraceEvent};
use kvsim_engine::Cfg;
use std::collections::{BTreeMap, BTreeSet};

/// A violation with where and when it was found, and what else it involves (so a
/// report can cut the trace down to it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub violation: Violation,
    pub at_ns: u64,
    pub event: u64,
    pub room: Option<RoomKey>,
    /// Other room uses involved (the earlier owner whose KV was read, the room whose
    /// ack released a quarantine).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<RoomKey>,
    /// Physical pages involved, per node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<(NodeId, PageId)>,
}

/// What the oracle knows about one room use.
#[derive(Clone, Debug)]
struct RoomFacts {
    req: RequestId,
    prefill: NodeId,
    decode: NodeId,
}

/// A leaked token found in a reply.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Leak {
    pub victim_of: RequestId,
    pub owner: RequestId,
    pub token: Token,
}

pub struct Oracle {
    cfg: Cfg,
    requests: BTreeMap<RequestId, PlannedRequest>,
    pool_pages: BTreeMap<NodeId, u32>,
    rooms: BTreeMap<RoomKey, RoomFacts>,
    /// The newest room use of each request.
    req_room: BTreeMap<RequestId, RoomKey>,
    /// Halves admitted and not yet answered, per node.
    open: BTreeSet<(NodeId, RoomKey)>,
    /// Rooms quarantined and not yet released, per decode node.
    quarantined: BTreeSet<(NodeId, RoomKey)>,
    /// Rooms the router opened and has not cleared.
    uncleared: BTreeSet<RoomKey>,
    responses: BTreeMap<RequestId, u32>,
    transfer_failed: BTreeSet<(NodeId, RoomKey)>,
    /// The message being delivered right now is prefill's Success for this room.
    success_now: Option<(NodeId, RoomKey)>,
    prefill_aborted: BTreeSet<(NodeId, RoomKey)>,
    /// Rooms a node rejected the legacy way (`to_finish` set, request still live).
    legacy_rejected: BTreeSet<(NodeId, RoomKey)>,
    findings: Vec<Finding>,
    seen: BTreeSet<(Invariant, Option<RoomKey>)>,
    pub leaks: Vec<Leak>,
    now_ns: u64,
    event: u64,
}

impl Oracle {
    pub fn new(cfg: Cfg, requests: &[PlannedRequest], pool_pages: BTreeMap<NodeId, u32>) -> Self {
        Oracle {
            cfg,
            requests: requests.iter().map(|r| (r.req, r.clone())).collect(),
            pool_pages,
            rooms: BTreeMap::new(),
            req_room: BTreeMap::new(),
            open: BTreeSet::new(),
            quarantined: BTreeSet::new(),
            uncleared: BTreeSet::new(),
            responses: BTreeMap::new(),
            transfer_failed: BTreeSet::new(),
            success_now: None,
            prefill_aborted: BTreeSet::new(),
            legacy_rejected: BTreeSet::new(),
            findings: Vec::new(),
            seen: BTreeSet::new(),
            leaks: Vec::new(),
            now_ns: 0,
            event: 0,
        }
    }

    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The invariants broken, in the order first seen.
    pub fn broken(&self) -> Vec<Invariant> {
        let mut out: Vec<Invariant> = Vec::new();
        for f in &self.findings {
            if !out.contains(&f.violation.invariant) {
                out.push(f.violation.invariant);
            }
        }
        out
    }

    pub fn set_clock(&mut self, now_ns: u64, event: u64) {
        self.now_ns = now_ns;
        self.event = event;
        self.success_now = None;
    }

    /// Record a violation (once per invariant and room, so a broken room does not
    /// flood the report).
    pub fn report(&mut self, invariant: Invariant, room: Option<RoomKey>, detail: String) {
        self.report_with(invariant, room, Vec::new(), Vec::new(), detail);
    }

    /// [`Oracle::report`] naming the other rooms and the pages involved.
    pub fn report_with(
        &mut self,
        invariant: Invariant,
        room: Option<RoomKey>,
        related: Vec<RoomKey>,
        pages: Vec<(NodeId, PageId)>,
        detail: String,
    ) {
        if self.seen.insert((invariant, room)) {
            self.findings.push(Finding {
                violation: Violation::new(invariant, detail),
                at_ns: self.now_ns,
                event: self.event,
                room,
                related,
                pages,
            });
        }
    }

    fn tokens_of(&self, node: NodeId) -> u64 {
        u64::from(self.pool_pages.get(&node).copied().unwrap_or(0)) * u64::from(self.cfg.page_size)
    }

    /// Must `node` reject this request at intake (its own length limit)?
    fn must_reject(&self, facts: &RoomFacts, side: Side) -> bool {
        let Some(r) = self.requests.get(&facts.req) else {
            return false;
        };
        match side {
            // A deployment that truncates serves an over-length prompt cut short.
            Side::Prefill => {
                !self.cfg.allow_auto_truncate
                    && r.prompt_len > self.cfg.context_len.min(self.tokens_of(facts.prefill))
            }
            Side::Decode => {
                r.prompt_len + u64::from(r.max_new_tokens)
                    > self.cfg.context_len.min(self.tokens_of(facts.decode))
            }
        }
    }

    fn describe(&self, room: RoomKey) -> String {
        match self
            .rooms
            .get(&room)
            .and_then(|f| self.requests.get(&f.req))
        {
            Some(r) => format!(
                "{room} ({} of {}, prompt {} tokens)",
                r.req, r.tenant, r.prompt_len
            ),
            None => room.to_string(),
        }
    }

    /// The router turned a client request into a room: learn the pairing.
    pub fn on_router_send<K>(&mut self, submitted: Option<RequestId>, msg: &Msg<K>, to: NodeId) {
        if let (Some(req), Msg::DecodeStart { room, prefill, .. }) = (submitted, msg) {
            self.req_room.insert(req, *room);
            self.uncleared.insert(*room);
            self.rooms.insert(
                *room,
                RoomFacts {
                    req,
                    prefill: *prefill,
                    decode: to,
                },
            );
        }
    }

    /// Checks at the moment a message is delivered, before the receiver acts on it.
    pub fn before_deliver<G: Gpu>(
        &mut self,
        nodes: &[Node<G>],
        from: NodeId,
        to: NodeId,
        msg: &Msg<G::Kv>,
    ) {
        match msg {
            Msg::KvWrite { room, dst, src, .. } => {
                // S2 on the destination: every page must still belong to this room use.
                if let Some(pool) = nodes.get(to.0 as usize).and_then(|n| n.pool()) {
                    for t in dst {
                        let ok = pool.record(t.page).is_some_and(|r| {
                            r.gen == t.gen
                                && r.owner == Some(*room)
                                && (r.state.is_owned() || r.state == PageState::Quarantined)
                        });
                        if !ok {
                            let now = pool
                                .record(t.page)
                                .map(|r| format!("{} {} owner {:?}", r.state, r.gen, r.owner));
                            let holder = pool.record(t.page).and_then(|r| r.owner);
                            let detail = format!(
                                "a KV write for {} aimed at decode {to} page {t} arrives after the page left the room (now {})",
                                self.describe(*room),
                                now.unwrap_or_else(|| "not a pool page".into())
                            );
                            self.report_with(
                                Invariant::S2,
                                Some(*room),
                                holder.into_iter().collect(),
                                vec![(to, t.page)],
                                detail,
                            );
                            break;
                        }
                    }
                }
                // S2 on the source: the send has been reading these pages all along.
                if let Some(pool) = nodes.get(from.0 as usize).and_then(|n| n.pool()) {
                    for t in src {
                        let ok = pool
                            .record(t.page)
                            .is_some_and(|r| r.gen == t.gen && r.state != PageState::Free);
                        if !ok {
                            let detail = format!(
                                "prefill {from} freed source page {t} of {} while its KV write was still reading it",
                                self.describe(*room)
                            );
                            self.report_with(
                                Invariant::S2,
                                Some(*room),
                                Vec::new(),
                                vec![(from, t.page)],
                                detail,
                            );
                            break;
                        }
                    }
                }
            }
            Msg::KvDone {
                room,
                outcome: TransferOutcome::Failed,
            } => {
                self.transfer_failed.insert((to, *room));
            }
            Msg::KvDone {
                room,
                outcome: TransferOutcome::Success { .. },
            } => {
                self.success_now = Some((to, *room));
            }
            _ => {}
        }
    }

    /// Checks on one engine event, against the nodes as they are after the handler.
    /// `in_flight` counts the KV writes queued and not yet landed or failed, per
    /// (receiver, room use).
    pub fn on_trace<G: Gpu>(
        &mut self,
        nodes: &[Node<G>],
        in_flight: &BTreeMap<(NodeId, RoomKey), u32>,
        ev: &TraceEvent,
    ) {
        match ev {
            TraceEvent::Admitted { node, room, .. } => {
                self.open.insert((*node, *room));
            }
            TraceEvent::Responded { node, room, .. } => {
                self.open.remove(&(*node, *room));
            }
            TraceEvent::Quarantined { node, room, .. } => {
                self.quarantined.insert((*node, *room));
            }
            TraceEvent::QuarantineReleased { node, room, .. } => {
                self.quarantined.remove(&(*node, *room));
            }
            TraceEvent::RoomCleared { room, .. } => {
                self.uncleared.remove(room);
            }
            TraceEvent::RejectedLegacy { node, room, .. } => {
                self.legacy_rejected.insert((*node, *room));
            }
            _ => {}
        }
        match ev {
            TraceEvent::Admitted {
                node, room, side, ..
            } => self.check_rejected_is_retired(
                *node,
                *room,
                *side,
                "was admitted (got a sender or receiver)",
            ),
            TraceEvent::PagesReserved { node, room, pages } => {
                let side = if nodes
                    .get(node.0 as usize)
                    .is_some_and(|n| n.as_prefill().is_some())
                {
                    Side::Prefill
                } else {
                    Side::Decode
                };
                self.check_rejected_is_retired(
                    *node,
                    *room,
                    side,
                    &format!("got {} pages", pages.len()),
                );
                let cap = nodes
                    .get(node.0 as usize)
                    .and_then(|n| n.pool())
                    .map_or(0, |p| p.capacity());
                if pages.len() > cap {
                    self.report(
                        Invariant::L5,
                        Some(*room),
                        format!(
                            "{} reserved {} pages on {node}, whose pool has {cap}",
                            self.describe(*room),
                            pages.len()
                        ),
                    );
                }
            }
            TraceEvent::KvSent { node, room, .. } => {
                self.check_rejected_is_retired(*node, *room, Side::Prefill, "sent KV")
            }
            TraceEvent::Running { node, room, side } => {
                self.check_rejected_is_retired(*node, *room, *side, "joined a running batch")
            }
            TraceEvent::TransferAccepted { node, room, .. }
                if self.transfer_failed.contains(&(*node, *room)) =>
            {
                // Accepting a failed transfer is an S6 matter (checked at the answer).
            }
            TraceEvent::TransferAccepted {
                room,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
                ..
            } => {
                let true_len = self
                    .rooms
                    .get(room)
                    .and_then(|f| self.requests.get(&f.req))
                    .map(|r| r.prompt_len);
                let problem = length_disagreement(
                    true_len,
                    *prompt_len,
                    *reserved_pages,
                    *sent_tokens,
                    *sent_pages,
                    *fully_written,
                );
                if let Some(p) = problem {
                    self.report(
                        Invariant::S4,
                        Some(*room),
                        format!(
                            "decode accepted the transfer of {}: {p}",
                            self.describe(*room)
                        ),
                    );
                }
            }
            TraceEvent::Attend {
                node,
                room,
                seq_len,
                pages,
                ..
            } => self.check_isolation(nodes, *node, *room, *seq_len, pages),
            TraceEvent::AbortNoted {
                node,
                room,
                side: Side::Prefill,
            } => {
                self.prefill_aborted.insert((*node, *room));
            }
            TraceEvent::Responded {
                node,
                room,
                side,
                status,
            } => {
                if status.is_ok()
                    && *side == Side::Prefill
                    && self.prefill_aborted.contains(&(*node, *room))
                {
                    self.report(
                        Invariant::S6,
                        Some(*room),
                        format!(
                            "prefill {node} answered 200 for {} after its abort became visible",
                            self.describe(*room)
                        ),
                    );
                }
                if status.is_ok()
                    && *side == Side::Decode
                    && self.transfer_failed.contains(&(*node, *room))
                {
                    self.report(
                        Invariant::S6,
                        Some(*room),
                        format!(
                            "decode {node} answered 200 for {} after its KV transfer failed",
                            self.describe(*room)
                        ),
                    );
                }
            }
            TraceEvent::RouterResponse {
                req, room, status, ..
            } => {
                let n = self.responses.entry(*req).or_insert(0);
                *n += 1;
                if *n > 1 {
                    self.report(
                        Invariant::S6,
                        *room,
                        format!("{req} got a second terminal response ({status})"),
                    );
                }
                if let Some(facts) = room.and_then(|r| self.rooms.get(&r)).cloned() {
                    let rejected = self.must_reject(&facts, Side::Prefill)
                        || self.must_reject(&facts, Side::Decode);
                    if status.is_ok() && rejected {
                        self.report(Invariant::S6, *room, format!("{req} does not fit the pool and must be rejected, but the client got 200"));
                    }
                }
            }
            TraceEvent::QuarantineReleased {
                node, room, acked, ..
            } => {
                if acked != room {
                    self.report(Invariant::S9, Some(*room), format!("decode {node} released the quarantine of {} on a drain ack for {acked}", self.describe(*room)));
                }
                let prefill = self.rooms.get(room).map(|f| f.prefill);
                let pending = prefill
                    .and_then(|p| nodes.get(p.0 as usize))
                    .and_then(|n| n.as_prefill())
                    .map_or(0, |p| p.writes_in_flight(*room));
                let flying = in_flight.get(&(*node, *room)).copied().unwrap_or(0) as usize;
                if pending > 0 || flying > 0 {
                    self.report(Invariant::S9, Some(*room), format!(
                        "decode {node} released the quarantine of {} while {} of its KV writes were still in flight",
                        self.describe(*room), pending.max(flying)
                    ));
                }
            }
            // The engine's own defenses caught something: that is a detected violation
            // of the invariant the defense protects, never a clean run.
            TraceEvent::TransferFailed { node, room, reason }
                if self.success_now == Some((*node, *room)) =>
            {
                // Prefill reported Success and decode's verification (defense 2)
                // refused it: the two halves disagree about this transfer.
                self.report(
                    Invariant::S4,
                    Some(*room),
                    format!(
                        "decode {node}'s verification refused the transfer of {} that prefill reported complete: {reason}; the defense turned a disagreement into an error",
                        self.describe(*room)
                    ),
                );
            }
            TraceEvent::TagMismatch {
                node,
                room,
                tag,
                current,
            } => {
                let found = nodes
                    .get(node.0 as usize)
                    .and_then(|n| n.gpu())
                    .and_then(|g| g.page_tag(tag.page));
                let related: Vec<RoomKey> = found
                    .map(|w| w.room)
                    .filter(|r| r != room)
                    .into_iter()
                    .collect();
                self.report_with(
                    Invariant::S3,
                    Some(*room),
                    related,
                    vec![(*node, tag.page)],
                    format!(
                        "decode {node}'s page-tag check failed {} at read time: page {tag} is not its own (page at {current}, holds {}); the defense turned a leak into an error",
                        self.describe(*room),
                        found.map_or("no tag".into(), |w| format!("KV of {} at {}", self.describe(w.room), w.gen))
                    ),
                );
            }
            TraceEvent::KvRefused {
                node,
                room,
                chunk,
                tag,
                reason,
            } => {
                self.report_with(
                    Invariant::S2,
                    Some(*room),
                    Vec::new(),
                    vec![(*node, tag.page)],
                    format!(
                        "decode {node} refused chunk {chunk} of {}: page {tag} {reason}; a write aimed at a page its room no longer owns was attempted",
                        self.describe(*room)
                    ),
                );
            }
            _ => {}
        }
    }

    fn check_rejected_is_retired(&mut self, node: NodeId, room: RoomKey, side: Side, what: &str) {
        let Some(facts) = self.rooms.get(&room).cloned() else {
            return;
        };
        if self.must_reject(&facts, side) {
            let limit = match side {
                Side::Prefill => self.cfg.context_len.min(self.tokens_of(facts.prefill)),
                Side::Decode => self.cfg.context_len.min(self.tokens_of(facts.decode)),
            };
            let need = self.requests.get(&facts.req).map(|r| match side {
                Side::Prefill => r.prompt_len,
                Side::Decode => r.prompt_len + u64::from(r.max_new_tokens),
            });
            let flagged = self.legacy_rejected.contains(&(node, room));
            if over_limit_invariant(need, self.cfg.context_len, flagged) == Invariant::L5 {
                self.report(Invariant::L5, Some(room), format!(
                    "{} needs more than {node}'s pool of {limit} tokens, yet it {what}: admitted beyond the pool",
                    self.describe(room)
                ));
                return;
            }
            self.report(Invariant::S5, Some(room), format!(
                "{} exceeds {node}'s limit of {limit} tokens and must be rejected at intake, but it {what}",
                self.describe(room)
            ));
        }
    }

    /// S3, white-box: every slot the step reads was written by this room use.
    fn check_isolation<G: Gpu>(
        &mut self,
        nodes: &[Node<G>],
        node: NodeId,
        room: RoomKey,
        seq_len: u64,
        pages: &[PageTag],
    ) {
        let Some(gpu) = nodes.get(node.0 as usize).and_then(|n| n.gpu()) else {
            return;
        };
        let ps = u64::from(self.cfg.page_size);
        for (i, t) in pages.iter().enumerate() {
            let start = i as u64 * ps;
            if start >= seq_len {
                break;
            }
            let need = (seq_len - start).min(ps) as u32;
            let Some(prov) = gpu.provenance(t.page) else {
                return;
            };
            let ok = prov.writer == Some(room) && prov.lo == 0 && prov.hi >= need;
            if !ok {
                let whose = match prov.writer {
                    Some(w) if w == room => {
                        format!("only slots {}..{} are its own", prov.lo, prov.hi)
                    }
                    Some(w) => format!("it holds KV written by {}", self.describe(w)),
                    None => "it was never written".to_string(),
                };
                let related = prov.writer.filter(|w| *w != room).into_iter().collect();
                self.report_with(Invariant::S3, Some(room), related, vec![(node, t.page)], format!(
                    "decode {node} attends for {} over page {t} (positions {start}..{}) but {whose}",
                    self.describe(room), start + u64::from(need)
                ));
                return;
            }
        }
    }

    /// The black-box canary check of one reply.
    pub fn on_response(&mut self, req: RequestId, status: Status, tokens: &[Token]) {
        let room = self.req_room.get(&req).copied();
        for &t in tokens {
            if let Some(owner) = canary_owner(t) {
                if owner != req {
                    let related = self.req_room.get(&owner).copied().into_iter().collect();
                    self.leaks.push(Leak {
                        victim_of: req,
                        owner,
                        token: t,
                    });
                    let tenants = (
                        self.requests.get(&req).map(|r| r.tenant),
                        self.requests.get(&owner).map(|r| r.tenant),
                    );
                    self.report_with(Invariant::S3, room, related, Vec::new(), format!(
                        "canary: the {status} reply to {req} ({}) echoes token {t:#010x} from the prompt of {owner} ({})",
                        tenants.0.map_or("?".into(), |t| t.to_string()),
                        tenants.1.map_or("?".into(), |t| t.to_string()),
                    ));
                }
            }
        }
    }

    /// Checks after every event: the own invariants of the node that handled it (no
    /// other node's state can have changed).
    pub fn after_event<G: Gpu>(&mut self, node: &Node<G>) {
        if let Err(v) = node.invariants() {
            self.report(v.invariant, None, format!("{}: {}", node.id(), v.detail));
        }
    }

    /// Liveness at the end of a run: everything answered, cleared, drained, returned.
    pub fn at_quiescence<G: Gpu>(&mut self, nodes: &[Node<G>], stuck: Option<String>) {
        // Name the rooms that did not drain, so a report can show their story.
        let first_two =
            |rooms: &mut dyn Iterator<Item = RoomKey>| -> (Option<RoomKey>, Vec<RoomKey>, usize) {
                let all: Vec<RoomKey> = rooms.collect();
                (
                    all.first().copied(),
                    all.iter().skip(1).take(2).copied().collect(),
                    all.len(),
                )
            };
        if let Some(why) = stuck {
            let (room, related, _) = first_two(&mut self.uncleared.iter().copied());
            self.report_with(Invariant::L1, room, related, Vec::new(), why);
        }
        let missing: Vec<RequestId> = self
            .requests
            .keys()
            .filter(|r| !self.responses.contains_key(r))
            .copied()
            .collect();
        if let Some(r) = missing.first() {
            let room = self.req_room.get(r).copied();
            self.report(
                Invariant::L1,
                room,
                format!(
                    "{} request(s) never got a response (first: {r})",
                    missing.len()
                ),
            );
        }
        for n in nodes {
            let id = n.id();
            match n {
                Node::Router(r) if r.live_rooms() > 0 => {
                    let (room, related, _) = first_two(&mut self.uncleared.iter().copied());
                    self.report_with(
                        Invariant::L2,
                        room,
                        related,
                        Vec::new(),
                        format!(
                            "the router still has {} rooms open (first: {})",
                            r.live_rooms(),
                            room.map_or("?".into(), |r| self.describe(r))
                        ),
                    );
                }
                Node::Prefill(p) if p.requests() > 0 || !p.rooms_in_flight().is_empty() => {
                    let flying = p.rooms_in_flight();
                    let (room, related, _) = first_two(
                        &mut self
                            .open
                            .iter()
                            .filter(|(n, _)| *n == id)
                            .map(|(_, r)| *r)
                            .chain(flying.iter().copied()),
                    );
                    self.report_with(
                        Invariant::L1,
                        room,
                        related,
                        Vec::new(),
                        format!(
                            "prefill {id} still holds {} requests and KV writes in flight for {} rooms (first: {})",
                            p.requests(),
                            flying.len(),
                            room.map_or("?".into(), |r| self.describe(r))
                        ),
                    );
                }
                Node::Decode(d) if d.requests() > 0 => {
                    let (room, related, _) =
                        first_two(&mut self.open.iter().filter(|(n, _)| *n == id).map(|(_, r)| *r));
                    self.report_with(
                        Invariant::L1,
                        room,
                        related,
                        Vec::new(),
                        format!(
                            "decode {id} still holds {} requests (first: {})",
                            d.requests(),
                            room.map_or("?".into(), |r| self.describe(r))
                        ),
                    );
                }
                _ => {}
            }
            if let Node::Decode(d) = n {
                if d.quarantined_rooms() > 0 {
                    let why = d
                        .fatal()
                        .map_or(String::new(), |f| format!(" (node stopped: {f})"));
                    let (room, related, _) = first_two(
                        &mut self
                            .quarantined
                            .iter()
                            .filter(|(n, _)| *n == id)
                            .map(|(_, r)| *r),
                    );
                    self.report_with(
                        Invariant::L3,
                        room,
                        related,
                        Vec::new(),
                        format!(
                            "decode {id} still quarantines {} rooms (first: {}){why}",
                            d.quarantined_rooms(),
                            room.map_or("?".into(), |r| self.describe(r))
                        ),
                    );
                }
            }
            if let Some(pool) = n.pool() {
                if pool.free_count() != pool.capacity() {
                    let held: Vec<(NodeId, PageId)> = pool
                        .records()
                        .filter(|(_, r)| r.state != PageState::Free)
                        .map(|(p, _)| (id, p))
                        .take(8)
                        .collect();
                    let (room, related, _) = first_two(
                        &mut pool
                            .records()
                            .filter_map(|(_, r)| r.owner)
                            .collect::<BTreeSet<_>>()
                            .into_iter(),
                    );
                    self.report_with(
                        Invariant::L4,
                        room,
                        related,
                        held,
                        format!(
                            "{id} has {} of {} pages free at quiescence (first holder: {})",
                            pool.free_count(),
                            pool.capacity(),
                            room.map_or("none: pages still draining".into(), |r| self.describe(r))
                        ),
                    );
                }
            }
        }
    }

    /// A node restarted: what its previous incarnation held is gone.
    pub fn on_restart(&mut self, node: NodeId) {
        self.open.retain(|(n, _)| *n != node);
        self.quarantined.retain(|(n, _)| *n != node);
    }
}

// Pure predicates of the oracle, for drivers that keep no `Oracle` (the model checker
// evaluates them inside its transitions, where state must stay hashable). Each one
// states exactly the condition the corresponding `Oracle` check reports; they read
// only what they are given.

/// S2 on the destination of a KV write: the first tag in `dst` whose page no longer
/// belongs to `room` (stale generation, another owner, or a state that holds no
/// owner's data), with the page's current record. `None` when the write may land.
pub fn write_target_breach(
    pool: &kvsim_engine::kv::PagePool,
    room: RoomKey,
    dst: &[PageTag],
) -> Option<(PageTag, Option<kvsim_engine::kv::PageRecord>)> {
    dst.iter().find_map(|t| {
        let rec = pool.record(t.page);
        let ok = rec.is_some_and(|r| {
            r.gen == t.gen
                && r.owner == Some(room)
                && (r.state.is_owned() || r.state == PageState::Quarantined)
        });
        (!ok).then(|| (*t, rec.cloned()))
    })
}

/// S2 on the source of a KV write: the first source tag whose page was freed (or
/// reallocated) while the send was still reading it.
pub fn source_read_breach(pool: &kvsim_engine::kv::PagePool, src: &[PageTag]) -> Option<PageTag> {
    src.iter().copied().find(|t| {
        !pool
            .record(t.page)
            .is_some_and(|r| r.gen == t.gen && r.state != PageState::Free)
    })
}

/// S3, white-box: the first page (index and tag) of an attention over `seq_len`
/// positions whose slots were not all written by `room`, with its provenance. `None`
/// when every slot read is the room's own, or the backend records no provenance.
pub fn isolation_breach<G: Gpu>(
    gpu: &G,
    page_size: u32,
    room: RoomKey,
    seq_len: u64,
    pages: &[PageTag],
) -> Option<(usize, PageTag, kvsim_engine::gpu::Provenance)> {
    let ps = u64::from(page_size);
    for (i, t) in pages.iter().enumerate() {
        let start = i as u64 * ps;
        if start >= seq_len {
            break;
        }
        let need = (seq_len - start).min(ps) as u32;
        let prov = gpu.provenance(t.page)?;
        if !(prov.writer == Some(room) && prov.lo == 0 && prov.hi >= need) {
            return Some((i, *t, prov));
        }
    }
    None
}

/// S5's limit: must a node whose pool has `pool_pages` pages reject a request that
/// needs `tokens` tokens (prefill: the prompt; decode: prompt plus new tokens)?
pub fn exceeds_limit(cfg: &Cfg, pool_pages: u32, tokens: u64) -> bool {
    let pool_tokens = u64::from(pool_pages) * u64::from(cfg.page_size);
    tokens > cfg.context_len.min(pool_tokens)
}

/// Which invariant a node breaks when a request that exceeds its limit (see
/// [`exceeds_limit`]) gets pages, a sender or a batch slot there. `need` is the
/// request's token count on that side (if known), `flagged` whether the node traced a
/// legacy rejection of it. A request within the context that the node never even
/// flagged was admitted beyond its pool (L5, SGLang #29249); one it flagged as
/// rejected, or one beyond the context, and then served is rejected-but-live (S5, the
/// GLM-5.3 incident).
pub fn over_limit_invariant(need: Option<u64>, context_len: u64, flagged: bool) -> Invariant {
    if need.is_some_and(|n| n <= context_len) && !flagged {
        Invariant::L5
    } else {
        Invariant::S5
    }
}

/// S4: why an accepted transfer breaks length agreement, given the request's true
/// prompt length (if known), or `None` when prefill and decode agree.
pub fn length_disagreement(
    true_len: Option<u64>,
    prompt_len: u64,
    reserved_pages: u32,
    sent_tokens: u64,
    sent_pages: u32,
    fully_written: bool,
) -> Option<String> {
    if Some(prompt_len) != true_len || sent_tokens != prompt_len {
        Some(format!(
            "decode expects {prompt_len} tokens, prefill sent {sent_tokens} (true prompt {})",
            true_len.map_or("?".into(), |l| l.to_string())
        ))
    } else if sent_pages != reserved_pages {
        Some(format!(
            "decode reserved {reserved_pages} pages, prefill sent {sent_pages}"
        ))
    } else if !fully_written {
        Some("some reserved page was never written".to_string())
    } else {
        None
    }
}

#[cfg(test)]
mod predicate_tests {
    use super::*;
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::kv::PagePool;

    #[test]
    fn predicates_agree_with_their_statements() {
        let room = RoomKey::new(1, 1);
        let other = RoomKey::new(2, 1);
        let mut pool = PagePool::new(4, 2);
        let tags = pool.alloc(2, room).unwrap();
        assert_eq!(write_target_breach(&pool, room, &tags), None);
        assert_eq!(
            write_target_breach(&pool, other, &tags).map(|b| b.0),
            Some(tags[0])
        );
        assert_eq!(source_read_breach(&pool, &tags), None);
        pool.release(room, &tags).unwrap();
        assert_eq!(source_read_breach(&pool, &tags), Some(tags[0]));

        let mut gpu = SymbolicGpu::new(4, 2);
        gpu.write_tokens(&tags, 0, &[1, 2, 3], room);
        assert!(isolation_breach(&gpu, 2, room, 3, &tags).is_none());
        assert_eq!(
            isolation_breach(&gpu, 2, room, 4, &tags).map(|b| b.0),
            Some(1)
        );
        assert_eq!(
            isolation_breach(&gpu, 2, other, 1, &tags).map(|b| b.0),
            Some(0)
        );

        let cfg = Cfg::new(kvsim_engine::EngineConfig {
            page_size: 2,
            context_len: 16,
            ..Default::default()
        });
        assert!(exceeds_limit(&cfg, 3, 7));
        assert!(!exceeds_limit(&cfg, 3, 6));
        assert!(length_disagreement(Some(4), 4, 2, 4, 2, true).is_none());
        assert!(length_disagreement(Some(7), 7, 4, 1, 1, false).is_some());
    }
}
