//! The events that need more than one checker (a reservation, a quarantine lifted,
//! a send, a landing, a read, a drain ack, a response, the end of a run), each
//! calling the checkers in a fixed order. It does not dispatch records to them
//! ([`crate::oracle_state`]) nor judge anything itself ([`crate::check`]).

use crate::check::rooms::RoomFlag;
use crate::check::writes::WriteFacts;
use crate::check::Drafts;
use crate::oracle_state::OracleState;

use crate::check::liveness::{self, Ends};
use crate::check::pages::Release;
use crate::schema::{EndOutcome, RunHeader};
use kvsim_engine::ids::{NodeId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::Status;
use kvsim_engine::trace::Side;
use std::fmt::Display;

/// The events that need more than one checker, each calling them in a fixed order.
impl OracleState {
    /// S5/L5 when a request past `node`'s limit gets something there.
    pub(super) fn retired(
        &self,
        h: &RunHeader,
        at: (NodeId, RoomKey),
        what: &dyn Display,
        out: &mut Drafts,
    ) {
        let ctx = (h, &self.rooms, &self.pages);
        self.answers.check_retired(ctx, at, what, out);
    }

    /// A reservation: L5 beyond the pool, S5/L5 at intake, then per page S9 (a write
    /// still aimed at it) and S1 (not free); then the book records it.
    pub(super) fn reserved(
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
    pub(super) fn quarantine_released(
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
    pub(super) fn sent(
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

    /// A source's NIC served an RDMA READ: the leases checker judges a READ after its
    /// lease expired; the bytes read are the source pages' as of now (S2 where the
    /// room does not own them), and they travel to the reader as a write in flight
    /// that reads nothing more (its source pages are already read).
    pub(super) fn read_served(
        &mut self,
        node: NodeId,
        read: WriteId,
        (src, dst): (&[PageTag], &[PageTag]),
        to: NodeId,
        out: &mut Drafts,
    ) {
        let room = read.room;
        self.leases
            .served(node, read, &self.rooms.describe(room), out);
        let prov = self.pages.sending(&self.rooms, (node, room), src, out);
        self.writes.put(WriteFacts {
            id: read,
            to,
            src: Vec::new().into(),
            dst: dst.into(),
            prov,
        });
    }

    /// A landing: the write leaves flight and its pages take its provenance.
    pub(super) fn landed(&mut self, h: &RunHeader, node: NodeId, write: WriteId, dst: &[PageTag]) {
        let facts = self.writes.take(write);
        let prov = facts.as_ref().map(|f| &f.prov[..]);
        self.pages.landed(h, (node, write.room), dst, prov);
    }

    /// A read (`refused` `None`) or a read of `pages` refused by a defense at one of
    /// its pages (`refused`: the defense and the page whose check failed): S2 by the
    /// effect of stray bytes, then S3.
    pub(super) fn read(
        &mut self,
        h: &RunHeader,
        at: (NodeId, RoomKey),
        (seq_len, pages): (u64, &[PageTag]),
        refused: Option<(&'static str, PageTag)>,
        out: &mut Drafts,
    ) {
        let rooms = &self.rooms;
        let detected_by = refused.map(|(by, _)| by);
        self.pages.stray_effect(rooms, at, pages, detected_by, out);
        let read = (seq_len, pages);
        self.pages.read((rooms, h), at, read, refused, out);
    }

    /// Prefill acked a drain: S9 with its writes in flight; the fact is remembered only
    /// while the prefill half is live (a node sends for a room use only while it holds
    /// its request, so afterwards the fact can decide nothing and would only tell apart
    /// runs that are otherwise the same).
    pub(super) fn drain_acked(&mut self, node: NodeId, room: RoomKey, out: &mut Drafts) {
        self.writes.drain_acked(&self.rooms, node, room, out);
        if self.pages.is_open(node, room) {
            self.rooms.flag(room, RoomFlag::DrainAcked);
        }
    }

    /// A half answered: S6 for a repeat with another status (and nothing else for a
    /// repeat); else the half closes, prefill's drain ack is forgotten, and S6 for a
    /// dishonest 200.
    pub(super) fn responded(
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
        if outcome == EndOutcome::Drained {
            self.leases.at_end(out);
        }
    }
}
