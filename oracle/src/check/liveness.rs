//! The liveness checker: at the end of a run that was not cut short, everything
//! answered, cleared, drained and returned. It owns no state: it judges the other
//! checkers' state as the run leaves it. L1 (the run did not drain, a request never
//! answered, a node still holding requests or writes), L2 (a room still open), L3 (a
//! quarantine never released on a node still running), L4 (pages not free). L5 is
//! judged as it happens ([`super::answers`]); L6 needs the trace's times and is in
//! [`crate::oracle`].

use super::answers::Answers;
use super::pages::{NodeBook, PageFact, Pages};
use super::rooms::Rooms;
use super::writes::{WriteFacts, Writes};
use super::{draft, Drafts};
use crate::schema::EndOutcome;
use kvsim_engine::ids::{NodeId, PageId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::PageState;
use std::fmt::Write as _;

/// The state the liveness checker judges: every other checker's, read only.
#[derive(Clone, Copy)]
pub struct Ends<'a> {
    pub pages: &'a Pages,
    pub rooms: &'a Rooms,
    pub writes: &'a Writes,
    pub answers: &'a Answers,
}

/// The second and third of `rooms`, named beside the first.
fn next_two(rooms: &[(RoomKey, impl Sized)]) -> Vec<RoomKey> {
    rooms.iter().skip(1).take(2).map(|(k, _)| *k).collect()
}

/// Liveness at the end of a run: everything answered, cleared, drained, returned.
pub fn at_end(s: Ends<'_>, outcome: EndOutcome, detail: &str, out: &mut Drafts) {
    if outcome == EndOutcome::Cut {
        return;
    }
    let rooms = s.rooms.all();
    if outcome != EndOutcome::Drained {
        out.push(
            draft(
                Invariant::L1,
                rooms.first().map(|(k, _)| *k),
                detail.to_string(),
            )
            .with_related(next_two(rooms)),
        );
    }
    if let Some(p) = s.answers.pending().first() {
        out.push(draft(
            Invariant::L1,
            s.rooms.of_request(p.req),
            format!(
                "{} request(s) never got a response (first: {})",
                s.answers.pending().len(),
                p.req
            ),
        ));
    }
    for (node, b) in s.pages.books() {
        node_at_end(s, node, b, out);
    }
    if let Some((room, _)) = rooms.first() {
        out.push(
            draft(
                Invariant::L2,
                Some(*room),
                format!(
                    "the router still has {} rooms open (first: {})",
                    rooms.len(),
                    s.rooms.describe(*room)
                ),
            )
            .with_related(next_two(rooms)),
        );
    }
}

/// One node at the end: L1 (requests or writes still held), L3 (a quarantine never
/// released on a node that did not stop), L4 (pages not free).
fn node_at_end(s: Ends<'_>, node: NodeId, b: &NodeBook, out: &mut Drafts) {
    let flying: Vec<&WriteFacts> = s
        .writes
        .all()
        .iter()
        .filter(|w| w.id.writer == node)
        .collect();
    if !b.open.is_empty() || !flying.is_empty() {
        let room = b
            .open
            .first()
            .copied()
            .or(flying.first().map(|w| w.id.room));
        out.push(
            draft(
                Invariant::L1,
                room,
                format!(
                    "{node} still holds {} requests and {} KV writes in flight (first: {})",
                    b.open.len(),
                    flying.len(),
                    room.map_or("?".into(), |r| s.rooms.describe(r))
                ),
            )
            .with_related(b.open.iter().skip(1).take(2).copied()),
        );
    }
    if !b.quarantined.is_empty() && !b.stopped {
        out.push(
            draft(
                Invariant::L3,
                b.quarantined.first().copied(),
                format!(
                    "decode {node} still quarantines {} rooms and has not stopped (first: {})",
                    b.quarantined.len(),
                    s.rooms.describe(b.quarantined[0])
                ),
            )
            .with_related(b.quarantined.iter().skip(1).take(2).copied()),
        );
    }
    pages_at_end(s.rooms, node, b, out);
}

/// L4: `node`'s pages not free at the end (a stopped node keeps its quarantines).
fn pages_at_end(rooms: &Rooms, node: NodeId, b: &NodeBook, out: &mut Drafts) {
    let held: Vec<(PageId, &PageFact)> = b
        .pages
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, p)| {
            p.state != PageState::Free && !(b.stopped && p.state == PageState::Quarantined)
        })
        .map(|(i, p)| (PageId(i as u32), p))
        .collect();
    if held.is_empty() {
        return;
    }
    let owner = held.iter().find_map(|(_, p)| p.owner);
    let mut text = String::new();
    let _ = write!(
        text,
        "{node} has {} of {} pages not free at the end (first holder: {})",
        held.len(),
        b.pages.len() - 1,
        owner.map_or("none: pages still draining".into(), |r| rooms.describe(r))
    );
    out.push(
        draft(Invariant::L4, owner, text).on_pages(held.iter().take(8).map(|(p, _)| (node, *p))),
    );
}
