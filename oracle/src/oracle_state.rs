//! The oracle's model of a run, built from trace records alone, and every safety
//! and liveness invariant judged against it: one definition of each.
//!
//! It keeps, per node, a record of every page (lifecycle state, generation, owner,
//! holders) and of who wrote each page's slots (provenance); per room use the request
//! it serves, its true size and its two nodes; every KV write in flight with the
//! provenance of what it read; and the requests not yet answered. It never sees the
//! engine's memory or flags: a defense that catches a hazard does not hide it, because
//! the attempt itself is an event (a write aimed at a page its room no longer owns, a
//! read the tag check refused, a transfer verification refused) and the oracle judges
//! the attempt; the event's outcome only decides between "violated" (it happened) and
//! "detected" (a defense stopped it).
//!
//! Each invariant is checked at its root, when the offending thing happens: a page
//! handed to a second room use (S1), a free by a non-owner or a second free (S8), a
//! write landing in a page its room lost or a source page freed under a write still
//! reading it (S2), a read of slots the request never wrote (S3), a transfer accepted
//! with disagreeing lengths (S4), a request past its limit getting anything (S5), an
//! error turned into a success or two answers (S6), a transfer accepted from another
//! node (S7), a drain ack while a write is incomplete, a send after the ack, a
//! quarantine released on another ack or under a write still in flight, a page reused
//! under a write aimed at it (S9). Checking goes on after a finding, so one problem
//! never hides another.
//!
//! The judging is done by the checkers of [`crate::check`] (pages, rooms, writes,
//! answers, transfer, liveness), each owning its part of the model; [`OracleState`]
//! holds one of each and is the dispatch: for every record it calls the checkers that
//! judge it, in a fixed order (the order of the findings in every report).
//!
//! It is `Clone + Hash + Eq` and holds no timestamps, so the model checker keeps it in
//! its states; it stays bounded by the live state of the run (pages, rooms and writes
//! in flight, plus the answered request ids as ranges). It hashes as the sequence of
//! its shared parts (node books, rooms, writes, pending, answered), in that order.

pub use crate::check::answers::{must_reject, reply_error, Pending};
pub use crate::check::pages::{NodeBook, PageFact, Provenance};
pub use crate::check::rooms::{RoomFacts, RoomFlag};
pub use crate::check::transfer::length_disagreement;
pub use crate::check::writes::{WriteFacts, WriteIndex};
pub use crate::check::{Draft, Drafts};

use crate::check::answers::Answers;
use crate::check::liveness::{self, Ends};
use crate::check::pages::{Pages, Release};
use crate::check::rooms::Rooms;
use crate::check::transfer;
use crate::check::writes::Writes;
use crate::schema::{EndOutcome, FaultEvent, Record, RunHeader};
use enumset::EnumSet;
use kvsim_engine::ids::{NodeId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::{PageOp, PageState};
use kvsim_engine::msg::Status;
use kvsim_engine::trace::{NodeFault, ReleaseKind, Side, TraceEvent};
use std::fmt::Display;

/// The oracle's model of the run: one state per checker. Its parts are shared and
/// hashed separately ([`crate::shared::Shared`]): a copy of the model (the model
/// checker makes one per transition) shares every part, and a change copies and
/// rehashes only the part it touches. The field order is the hash order.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OracleState {
    /// The node books: pages, open halves, quarantines.
    pub pages: Pages,
    /// Routed room uses not yet cleared.
    pub rooms: Rooms,
    /// KV writes in flight.
    pub writes: Writes,
    /// Requests submitted and unanswered, and the answered ids.
    pub answers: Answers,
}

impl OracleState {
    /// Every part is shared with `other`'s (so the two are certainly equal): a copy
    /// of the model that observed events changing nothing. A driver that keeps the
    /// model in a [`crate::shared::Shared`] can then keep the old one, with its digest.
    pub fn same_parts(&self, other: &OracleState) -> bool {
        self.pages.same_parts(&other.pages)
            && self.rooms.same_parts(&other.rooms)
            && self.writes.same_parts(&other.writes)
            && self.answers.same_parts(&other.answers)
    }

    pub fn new(h: &RunHeader) -> Self {
        OracleState {
            pages: Pages::new(h),
            rooms: Rooms::default(),
            writes: Writes::default(),
            answers: Answers::default(),
        }
    }

    pub fn room(&self, room: RoomKey) -> Option<&RoomFacts> {
        self.rooms.get(room)
    }

    /// The facts of a KV write in flight (sent, not yet landed, refused or failed).
    pub fn write_in_flight(&self, id: WriteId) -> Option<&WriteFacts> {
        self.writes.in_flight(id)
    }

    /// A stale duplicate of a write that already landed is about to land again
    /// (`data_fault` `stale_duplicate`): put its facts back in flight, so that its
    /// landing or refusal is judged as the write it is (where it lands, what its
    /// payload carries). [`crate::Oracle`] keeps the facts of recent landings for this.
    pub fn restore_write(&mut self, facts: WriteFacts) {
        self.writes.put(facts);
    }

    /// A stale duplicate announced by a `data_fault` record, whose facts a driver
    /// holds in `replay`, lands or is refused (`ev`): put its facts back in flight
    /// first ([`OracleState::restore_write`]), so that `ev` is judged as the write it
    /// is. `true` (and `replay` emptied) when `ev` is that landing or refusal.
    pub fn duplicate_lands(&mut self, replay: &mut Option<WriteFacts>, ev: &TraceEvent) -> bool {
        self.writes.duplicate_lands(replay, ev)
    }

    /// A room use for humans: `room2.g4 (req7 of t2, prompt 700 tokens)`.
    pub fn describe(&self, room: RoomKey) -> String {
        self.rooms.describe(room)
    }

    /// What each node still does for `room`: the half it has not answered, the pages
    /// it still owns for it (quarantined pages are let go). Empty when every node is
    /// done with it (bounded cleanup, L6).
    pub fn still_working(&self, room: RoomKey) -> Vec<(NodeId, String)> {
        self.pages.still_working(room)
    }

    /// Judge one record, updating the model; findings go to `out`.
    pub fn observe(&mut self, h: &RunHeader, rec: &Record, out: &mut Drafts) {
        match rec {
            Record::Submit {
                req,
                tenant,
                prompt_len,
                ..
            } => self.answers.submitted(Pending {
                req: *req,
                tenant: *tenant,
                prompt_len: *prompt_len,
            }),
            Record::WriteFailed { write, .. } => {
                self.writes.take(*write);
            }
            Record::Fault(FaultEvent::Crash { node, flushed, .. }) => {
                for w in flushed {
                    self.writes.take(*w);
                }
                self.pages.crashed(*node);
                self.rooms.forget_answers(*node);
            }
            Record::Fault(FaultEvent::Restart { node, epoch }) => {
                self.pages.restarted(*node, *epoch)
            }
            Record::Engine(ev) => self.observe_event(h, ev, out),
            Record::End { outcome, detail } => self.at_end(*outcome, detail, out),
            _ => {}
        }
    }

    /// Judge one engine event ([`OracleState::observe`] of `Record::Engine`, without
    /// building the record): the dispatch to the checkers, by what the event is about.
    pub fn observe_event(&mut self, h: &RunHeader, ev: &TraceEvent, out: &mut Drafts) {
        use TraceEvent::*;
        match ev {
            PagesReserved { .. }
            | PagesExpectWrite { .. }
            | PagesReady { .. }
            | Quarantined { .. }
            | PagesReleased { .. }
            | QuarantineReleased { .. }
            | PagesHeld { .. }
            | PagesUnheld { .. }
            | PagesZeroed { .. } => self.page_event(h, ev, out),
            KvWritten { .. }
            | KvSent { .. }
            | KvLanded { .. }
            | KvRefused { .. }
            | Attend { .. }
            | TagMismatch { .. }
            | DrainAcked { .. } => self.kv_event(h, ev, out),
            TransferAccepted { .. } | TransferRefused { .. } => self.transfer_event(ev, out),
            Routed { .. }
            | RoomCleared { .. }
            | RejectedLegacy { .. }
            | AbortNoted { .. }
            | TransferReported { .. } => self.room_event(ev),
            Admitted { .. } | Running { .. } | Responded { .. } | RouterResponse { .. } => {
                self.answer_event(h, ev, out)
            }
            Fault {
                node,
                fault: NodeFault::DrainAckMissing { .. },
            } => self.pages.stopped(*node),
            Fault { .. }
            | Rejected { .. }
            | Truncated { .. }
            | WriteCompleted { .. }
            | PeerRefused { .. }
            | TransferFailed { .. }
            | RouterRetried { .. } => {}
        }
    }

    /// The page lifecycle: reservations, marks, quarantines, releases, holds, zeroing.
    fn page_event(&mut self, h: &RunHeader, ev: &TraceEvent, out: &mut Drafts) {
        use TraceEvent::*;
        let rooms = &self.rooms;
        match ev {
            PagesReserved { node, room, pages } => self.reserved(h, (*node, *room), pages, out),
            PagesExpectWrite { node, room, pages } => {
                let op = PageOp::ExpectWrite;
                self.pages.mark(rooms, (*node, *room), pages, op, out)
            }
            PagesReady { node, room, pages } => {
                let op = PageOp::MarkReady;
                self.pages.mark(rooms, (*node, *room), pages, op, out)
            }
            Quarantined { node, room, pages } => {
                self.pages.quarantine(rooms, (*node, *room), pages, out)
            }
            PagesReleased {
                node,
                room,
                pages,
                how,
                held,
            } => {
                let unchecked = *how == ReleaseKind::Unchecked;
                let how = Release {
                    held,
                    unchecked,
                    from: None,
                };
                let ctx = (rooms, &self.writes);
                self.pages.release(ctx, (*node, *room), pages, how, out)
            }
            QuarantineReleased {
                node,
                room,
                pages,
                acked,
                held,
            } => self.quarantine_released((*node, *room), *acked, pages, held, out),
            PagesHeld { node, pages } => self.pages.hold(*node, pages, out),
            PagesUnheld { node, pages, freed } => self.pages.unhold(*node, pages, freed),
            PagesZeroed { node, pages } => self.pages.zeroed(*node, pages),
            _ => unreachable!("not a page event: {ev:?}"),
        }
    }

    /// KV: writes into pages, sends, landings, reads, drain acks.
    fn kv_event(&mut self, h: &RunHeader, ev: &TraceEvent, out: &mut Drafts) {
        use TraceEvent::*;
        match ev {
            KvWritten {
                node,
                room,
                pages,
                start,
                tokens,
            } => {
                let span = (*start, *tokens);
                let rooms = &self.rooms;
                self.pages
                    .written(rooms, h, (*node, *room), pages, span, out)
            }
            KvSent {
                node,
                write,
                src,
                dst,
                to,
            } => self.sent(h, *node, *write, (src, dst), *to, out),
            KvLanded { node, write, dst } => self.landed(h, *node, *write, dst),
            KvRefused { node, write, .. } => {
                let dst = self.writes.take(*write).map(|f| f.dst).unwrap_or_default();
                self.pages
                    .landing_refused(&self.rooms, *node, *write, &dst, out)
            }
            Attend {
                node,
                room,
                seq_len,
                pages,
                ..
            } => self.read(h, (*node, *room), (*seq_len, pages), None, out),
            TagMismatch {
                node,
                room,
                seq_len,
                pages,
                ..
            } => self.read(h, (*node, *room), (*seq_len, pages), Some("page_tags"), out),
            DrainAcked { node, room } => self.drain_acked(*node, *room, out),
            _ => unreachable!("not a KV event: {ev:?}"),
        }
    }

    /// The facts of the room registry: routing, clearing, the flags the nodes set.
    fn room_event(&mut self, ev: &TraceEvent) {
        use TraceEvent::*;
        match ev {
            Routed {
                req,
                tenant,
                room,
                prefill,
                decode,
                prompt_len,
                max_new_tokens,
                ..
            } => self.rooms.routed(
                *room,
                RoomFacts {
                    req: *req,
                    tenant: *tenant,
                    prefill: *prefill,
                    decode: *decode,
                    prompt_len: *prompt_len,
                    max_new_tokens: *max_new_tokens,
                    flags: EnumSet::empty(),
                    answered: [None; 2],
                },
            ),
            RoomCleared { room, .. } => self.rooms.cleared(*room),
            RejectedLegacy { node, room, .. } => {
                let f = match self.pages.side_of(*node) {
                    Some(Side::Prefill) => RoomFlag::FlaggedPrefill,
                    _ => RoomFlag::FlaggedDecode,
                };
                self.rooms.flag(*room, f);
            }
            AbortNoted { room, side, .. } if *side == Side::Prefill => {
                self.rooms.flag(*room, RoomFlag::PrefillAborted)
            }
            TransferReported { room, success, .. } if !success => {
                self.rooms.flag(*room, RoomFlag::TransferFailed)
            }
            AbortNoted { .. } | TransferReported { .. } => {}
            _ => unreachable!("not a room event: {ev:?}"),
        }
    }

    /// Transfer completions: accepted (S7, S4) or refused by verification (S2 by the
    /// effect of stray bytes in the room's pages, then S4 detected).
    fn transfer_event(&mut self, ev: &TraceEvent, out: &mut Drafts) {
        use TraceEvent::*;
        let (node, room, claim) = match ev {
            TransferAccepted { node, room, claim }
            | TransferRefused {
                node, room, claim, ..
            } => (*node, *room, *claim),
            _ => unreachable!("not a transfer event: {ev:?}"),
        };
        let TransferRefused { reason, .. } = ev else {
            return transfer::accepted(&self.rooms, (node, room), &claim, out);
        };
        let true_len = self.rooms.get(room).map(|f| f.prompt_len);
        let why = transfer::disagreement(&claim, true_len).unwrap_or_else(|| reason.clone());
        let mine = self.pages.owned_by(node, room);
        let defense = Some("verify_on_completion");
        self.pages
            .stray_effect(&self.rooms, (node, room), &mine, defense, out);
        transfer::refused(&self.rooms, (node, room), &why, out);
    }

    /// Admissions, batches and answers: S5/L5 at intake, S6 and S10 on the answers.
    fn answer_event(&mut self, h: &RunHeader, ev: &TraceEvent, out: &mut Drafts) {
        use TraceEvent::*;
        match ev {
            Admitted { node, room, .. } => {
                self.pages.admitted(*node, *room);
                let what = "was admitted (got a sender or receiver)";
                self.retired(h, (*node, *room), &what, out)
            }
            Running { node, room, .. } => {
                self.retired(h, (*node, *room), &"joined a running batch", out)
            }
            Responded {
                node,
                room,
                side,
                status,
            } => self.responded((*node, *room), *side, *status, out),
            RouterResponse {
                req,
                room,
                status,
                tokens,
                ..
            } => {
                let ctx = (h, &self.rooms);
                let answer = (*req, *room);
                self.answers
                    .router_response(ctx, answer, *status, tokens, out)
            }
            _ => unreachable!("not an answer event: {ev:?}"),
        }
    }
}

/// The events that need more than one checker, each calling them in a fixed order.
impl OracleState {
    /// S5/L5 when a request past `node`'s limit gets something there.
    fn retired(&self, h: &RunHeader, at: (NodeId, RoomKey), what: &dyn Display, out: &mut Drafts) {
        let ctx = (h, &self.rooms, &self.pages);
        self.answers.check_retired(ctx, at, what, out);
    }

    /// A reservation: L5 beyond the pool, S5/L5 at intake, then per page S9 (a write
    /// still aimed at it) and S1 (not free); then the book records it.
    fn reserved(
        &mut self,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        out: &mut Drafts,
    ) {
        let rooms = &self.rooms;
        let cap = self.pages.book(node).map_or(0, |b| b.pool_pages());
        let at = (node, room);
        self.answers
            .reserved_beyond_pool(rooms, at, pages.len(), cap, out);
        // Text only for a finding: nothing is formatted for a reservation that is fine.
        self.retired(h, at, &format_args!("got {} pages", pages.len()), out);
        let epoch = self.pages.epoch(node);
        for t in pages {
            if let Some(epoch) = epoch {
                self.writes.handed_out(rooms, (node, epoch), room, *t, out);
            }
            self.pages.handed_out(rooms, node, room, *t, out);
        }
        self.pages.reserve(node, room, pages);
    }

    /// Decode released a quarantine on a drain ack: S9 (the ack, the writes in
    /// flight), then the release of its pages, which must be quarantined.
    fn quarantine_released(
        &mut self,
        (node, room): (NodeId, RoomKey),
        acked: RoomKey,
        pages: &[PageTag],
        held: &[PageTag],
        out: &mut Drafts,
    ) {
        let epoch = self.pages.epoch(node).unwrap_or(0);
        let rooms = &self.rooms;
        self.writes
            .quarantine_released(rooms, (node, epoch), room, acked, out);
        self.pages.lift_quarantine(node, room);
        let how = Release {
            held,
            unchecked: false,
            from: Some(PageState::Quarantined),
        };
        self.pages
            .release((rooms, &self.writes), (node, room), pages, how, out);
    }

    /// A send: S5/L5, S9 after the drain ack, S2 for a source page the room does not
    /// own; then the write is in flight with the provenance of what it read.
    fn sent(
        &mut self,
        h: &RunHeader,
        node: NodeId,
        write: WriteId,
        (src, dst): (&[PageTag], &[PageTag]),
        to: Option<NodeId>,
        out: &mut Drafts,
    ) {
        let room = write.room;
        self.retired(h, (node, room), &"sent KV", out);
        self.writes.sent_after_ack(&self.rooms, node, write, out);
        let prov = self.pages.sending(&self.rooms, (node, room), src, out);
        // The receiver the event names (version 2), else the room's decode node.
        let to = to.unwrap_or_else(|| self.rooms.get(room).map_or(node, |f| f.decode));
        self.writes.put(WriteFacts {
            id: write,
            to,
            src: src.into(),
            dst: dst.into(),
            prov,
        });
    }

    /// A landing: the write leaves flight and its pages take its provenance.
    fn landed(&mut self, h: &RunHeader, node: NodeId, write: WriteId, dst: &[PageTag]) {
        let facts = self.writes.take(write);
        let prov = facts.as_ref().map(|f| &f.prov[..]);
        self.pages.landed(h, (node, write.room), dst, prov);
    }

    /// A read (`detected_by` `None`) or a refused read of `pages`: S2 by the effect of
    /// stray bytes, then S3.
    fn read(
        &mut self,
        h: &RunHeader,
        at: (NodeId, RoomKey),
        (seq_len, pages): (u64, &[PageTag]),
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        let rooms = &self.rooms;
        self.pages.stray_effect(rooms, at, pages, detected_by, out);
        let read = (seq_len, pages);
        self.pages.read((rooms, h), at, read, detected_by, out);
    }

    /// Prefill acked a drain: S9 with its writes in flight; the fact is remembered only
    /// while the prefill half is live (a node sends for a room use only while it holds
    /// its request, so afterwards the fact can decide nothing and would only tell apart
    /// runs that are otherwise the same).
    fn drain_acked(&mut self, node: NodeId, room: RoomKey, out: &mut Drafts) {
        self.writes.drain_acked(&self.rooms, node, room, out);
        if self.pages.is_open(node, room) {
            self.rooms.flag(room, RoomFlag::DrainAcked);
        }
    }

    /// A half answered: S6 for a repeat with another status (and nothing else for a
    /// repeat); else the half closes, prefill's drain ack is forgotten, and S6 for a
    /// dishonest 200.
    fn responded(
        &mut self,
        (node, room): (NodeId, RoomKey),
        side: Side,
        status: Status,
        out: &mut Drafts,
    ) {
        let rooms = &mut self.rooms;
        if self
            .answers
            .repeated_answer(rooms, (node, room), side, status, out)
        {
            return;
        }
        self.pages.answered(node, room);
        if side == Side::Prefill {
            self.rooms.unflag(room, RoomFlag::DrainAcked);
        }
        self.answers
            .responded(&self.rooms, (node, room), side, status, out);
    }

    /// Liveness at the end of a run: everything answered, cleared, drained, returned.
    pub fn at_end(&self, outcome: EndOutcome, detail: &str, out: &mut Drafts) {
        let ends = Ends {
            pages: &self.pages,
            rooms: &self.rooms,
            writes: &self.writes,
            answers: &self.answers,
        };
        liveness::at_end(ends, outcome, detail, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::{RequestId, TenantId};
    use kvsim_engine::invariant::Invariant;

    #[test]
    fn provenance_grows_over_contiguous_writes_and_resets_on_another_writer() {
        let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
        let mut p = Provenance::default();
        for s in 0..3 {
            p = p.after_write(a, s);
        }
        assert!(p.covers(a, 3) && !p.covers(a, 4) && !p.covers(b, 1));
        p = p.after_write(b, 1);
        assert_eq!(
            p,
            Provenance {
                writer: Some(b),
                lo: 1,
                hi: 2
            }
        );
        assert!(!p.covers(b, 2));
    }

    #[test]
    fn a_run_of_slots_gives_the_provenance_slot_by_slot_does() {
        let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
        let mut starts = vec![Provenance::default()];
        for writer in [Some(a), Some(b)] {
            for lo in 0..6 {
                for hi in 0..6 {
                    starts.push(Provenance { writer, lo, hi });
                }
            }
        }
        for p in starts {
            for lo in 0..7 {
                for hi in lo..8 {
                    let one_by_one = (lo..hi).fold(p, |q, s| q.after_write(a, s));
                    assert_eq!(p.after_writes(a, lo..hi), one_by_one, "{p:?} {lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn answered_ranges_merge_and_answer_membership() {
        let mut s = Answers::default();
        for r in [0u64, 2, 1, 5, 3, 4, 9] {
            assert!(!s.is_answered(RequestId(r)));
            s.answer(RequestId(r));
            assert!(s.is_answered(RequestId(r)));
        }
        assert_eq!(s.answered.get(), &vec![(0, 5), (9, 9)]);
        assert!(!s.is_answered(RequestId(7)));
    }

    /// A run of one prefill and one decode node, 8 pages each.
    fn one_pair_header() -> RunHeader {
        let topo = kvsim_engine::world::Topology {
            prefill_pools: vec![8],
            decode_pools: vec![8],
        };
        let clock = crate::schema::ClockKind::Simulated;
        RunHeader::new("test", clock, &Default::default(), &topo)
    }

    #[test]
    fn a_half_answering_again_with_another_status_is_s6() {
        use kvsim_engine::msg::Status;
        let h = one_pair_header();
        let mut s = OracleState::new(&h);
        let room = RoomKey::new(1, 1);
        let mut out = Drafts::new();
        s.observe_event(
            &h,
            &TraceEvent::Routed {
                node: NodeId(0),
                req: RequestId(1),
                tenant: TenantId(0),
                room,
                prefill: NodeId(1),
                decode: NodeId(2),
                prompt_len: 4,
                max_new_tokens: 1,
            },
            &mut out,
        );
        let answer = |status| TraceEvent::Responded {
            node: NodeId(2),
            room,
            side: Side::Decode,
            status,
        };
        for status in [Status::INTERNAL, Status::INTERNAL] {
            s.observe_event(&h, &answer(status), &mut out);
        }
        assert!(
            out.is_empty(),
            "the same answer again is not a second one: {out:?}"
        );
        s.observe_event(&h, &answer(Status::CLIENT_CLOSED), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].invariant, Invariant::S6);
        assert!(
            out[0].detail.contains("after answering 500"),
            "{}",
            out[0].detail
        );
    }

    /// A copy shares every part until an event changes one; an event that changes
    /// nothing leaves it sharing (so a model state may keep its old copy).
    #[test]
    fn a_copy_shares_its_parts_until_an_event_changes_one() {
        let h = one_pair_header();
        let base = OracleState::new(&h);
        let mut copy = base.clone();
        assert!(copy.same_parts(&base));
        let mut out = Drafts::new();
        let read = TraceEvent::Attend {
            node: NodeId(2),
            room: RoomKey::new(1, 1),
            step: 0,
            query_pos: 0,
            seq_len: 0,
            pages: vec![],
        };
        copy.observe_event(&h, &read, &mut out);
        assert!(copy.same_parts(&base), "a read of no pages changes nothing");
        let routed = TraceEvent::Routed {
            node: NodeId(0),
            req: RequestId(1),
            tenant: TenantId(0),
            room: RoomKey::new(1, 1),
            prefill: NodeId(1),
            decode: NodeId(2),
            prompt_len: 4,
            max_new_tokens: 1,
        };
        copy.observe_event(&h, &routed, &mut out);
        assert!(!copy.same_parts(&base));
        assert_ne!(copy, base);
    }

    #[test]
    fn length_disagreement_names_the_mismatch() {
        assert!(length_disagreement(Some(4), 4, 2, 4, 2, true).is_none());
        assert!(length_disagreement(Some(7), 7, 4, 1, 1, false).is_some());
        assert!(length_disagreement(Some(4), 4, 2, 4, 1, true).is_some_and(|s| s.contains("pages")));
    }
}
