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

mod joint;
#[cfg(test)]
mod tests;

pub use crate::check::answers::{must_reject, reply_error, Pending};
pub use crate::check::pages::{NodeBook, PageFact, Provenance};
pub use crate::check::rooms::{RoomFacts, RoomFlag};
pub use crate::check::transfer::length_disagreement;
pub use crate::check::writes::{WriteFacts, WriteIndex};
pub use crate::check::{Draft, Drafts};

use crate::check::answers::Answers;
use crate::check::leases::Leases;
use crate::check::pages::{Pages, Release};
use crate::check::rooms::Rooms;
use crate::check::transfer;
use crate::check::writes::Writes;
use crate::schema::{FaultEvent, Record, RunHeader};
use enumset::EnumSet;
use kvsim_engine::ids::{NodeId, RoomKey, WriteId};
use kvsim_engine::kv::PageOp;
use kvsim_engine::trace::{NodeFault, ReleaseKind, Side, TraceEvent, TransferClaim};

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
    /// vLLM pull's leases, held and expired.
    pub leases: Leases,
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
            && self.leases.same_parts(&other.leases)
    }

    pub fn new(h: &RunHeader) -> Self {
        OracleState {
            pages: Pages::new(h),
            rooms: Rooms::default(),
            writes: Writes::default(),
            answers: Answers::default(),
            leases: Leases::default(),
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
                self.leases.forget(*node);
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
            KvReadServed {
                node,
                read,
                src,
                dst,
                to,
            } => self.read_served(*node, *read, (src, dst), *to, out),
            Leased { node, room, .. } => self.leases.leased(*node, *room),
            LeaseEnded {
                node,
                room,
                expired,
            } => self.leases.ended(*node, *room, *expired),
            TransferAccepted { .. } | TransferRefused { .. } => self.transfer_event(ev, out),
            Routed { .. }
            | RoomCleared { .. }
            | RejectedLegacy { .. }
            | AbortNoted { .. }
            | TransferReported { .. } => self.room_event(ev, out),
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
            | RouterRetried { .. }
            | FrontCancelled { .. } => {}
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
                pos,
            } => {
                let span = (*start, *tokens, *pos);
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
                tag,
                ..
            } => {
                let refused = Some(("page_tags", *tag));
                self.read(h, (*node, *room), (*seq_len, pages), refused, out)
            }
            DrainAcked { node, room } => self.drain_acked(*node, *room, out),
            _ => unreachable!("not a KV event: {ev:?}"),
        }
    }

    /// The facts of the room registry: routing, clearing, the flags the nodes set.
    fn room_event(&mut self, ev: &TraceEvent, out: &mut Drafts) {
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
                out,
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
        // Whether every reserved page was written is the trace's landings where the
        // trace records the pages, not decode's claim: decode reads its pages' tags,
        // which a later write (a stale duplicate) may have changed, and on one-sided
        // RDMA it saw no landing. A trace without page records has only the claim.
        let claim = TransferClaim {
            fully_written: (self.pages.transfer_written(node, room)).unwrap_or(claim.fully_written),
            ..claim
        };
        self.pages.transfer_judged(node, room);
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
