//! The writes checker: every KV write in flight, from its send until it lands, is
//! refused, fails or is flushed by a crash, with the provenance of what it read, and
//! an index of where the writes point.
//!
//! It judges what a write in flight forbids: a source page freed while a write still
//! reads it (S2), a page handed out again while a write is aimed at it, a drain acked
//! or a quarantine released while the room's writes are in flight, a send after the
//! drain ack (S9). Invariant: the writes are sorted by id, one per id, and the index
//! counts exactly what they point at.

use super::book::Provenance;
use super::rooms::{RoomFlag, Rooms};
use super::{draft, Drafts};
use crate::shared::Shared;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey, WriteId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A KV write in flight: from its send until it lands, is refused, fails or is flushed.
/// Its page lists never change after the send, so they are shared: a copy of the facts
/// (the recent landings a stale duplicate may repeat, a model state's write) copies no
/// list. A shared slice hashes and compares as the slice, as a `Vec` does.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct WriteFacts {
    pub id: WriteId,
    pub to: NodeId,
    pub src: Arc<[PageTag]>,
    pub dst: Arc<[PageTag]>,
    /// The provenance of each source page when the write read it.
    pub prov: Arc<[Provenance]>,
}

/// Where the KV writes in flight point, derived from [`Writes::writes`] (so it is left
/// out of `Hash` and `Eq`): how many aim at each (node, page, epoch) and read each
/// (node, page tag). It makes "is a write still aimed at / reading this page" one
/// look-up, where a scan of every write for every page of a 10,000-page release would
/// be quadratic.
#[derive(Clone, Debug, Default)]
pub struct WriteIndex {
    aimed: BTreeMap<(NodeId, PageId, u32), u32>,
    reading: BTreeMap<(NodeId, PageTag), u32>,
}

impl std::hash::Hash for WriteIndex {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl PartialEq for WriteIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for WriteIndex {}

impl WriteIndex {
    fn add(&mut self, w: &WriteFacts, sign: i64) {
        for d in w.dst.iter() {
            bump(&mut self.aimed, (w.to, d.page, d.gen.epoch()), sign);
        }
        for t in w.src.iter() {
            bump(&mut self.reading, (w.id.writer, *t), sign);
        }
    }
}

/// Count `key` once more (`sign` 1) or once less (`sign` -1, never below zero) in
/// `counts`, which holds no zero: a count that drops to zero leaves the map (one
/// look-up, where sweeping the map for zeros after every removal cost a pass over it).
fn bump<K: Ord>(counts: &mut BTreeMap<K, u32>, key: K, sign: i64) {
    use std::collections::btree_map::Entry;
    match counts.entry(key) {
        Entry::Occupied(mut o) => {
            let n = (i64::from(*o.get()) + sign).max(0) as u32;
            if n == 0 {
                o.remove();
            } else {
                *o.get_mut() = n;
            }
        }
        Entry::Vacant(v) => {
            if sign > 0 {
                v.insert(sign as u32);
            }
        }
    }
}

/// The KV writes in flight. `writes` is shared and hashed as one part; the index
/// hashes as nothing (it is derived), so `Writes` hashes exactly as `writes` does. The
/// index is shared too (copied on write, when `writes` changes): the model checker
/// copies the oracle's model in every transition, and most transitions change no
/// write.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Writes {
    /// Sorted by id.
    pub writes: Shared<Vec<WriteFacts>>,
    index: Arc<WriteIndex>,
}

impl Default for Writes {
    fn default() -> Self {
        Writes {
            writes: Shared::new(Vec::new()),
            index: Arc::default(),
        }
    }
}

impl Writes {
    /// The same writes and index, shared (see [`crate::OracleState::same_parts`]).
    pub(crate) fn same_parts(&self, other: &Writes) -> bool {
        self.writes.same(&other.writes) && Arc::ptr_eq(&self.index, &other.index)
    }

    fn position(&self, id: WriteId) -> Result<usize, usize> {
        self.writes.get().binary_search_by_key(&id, |w| w.id)
    }

    /// Every write in flight, sorted by id.
    pub fn all(&self) -> &[WriteFacts] {
        self.writes.get()
    }

    /// The facts of a KV write in flight (sent, not yet landed, refused or failed).
    pub fn in_flight(&self, id: WriteId) -> Option<&WriteFacts> {
        self.position(id).ok().map(|i| &self.writes.get()[i])
    }

    /// Put `facts` in flight (a send, or a stale duplicate's facts put back), replacing
    /// a write of the same id.
    pub fn put(&mut self, facts: WriteFacts) {
        Arc::make_mut(&mut self.index).add(&facts, 1);
        match self.position(facts.id) {
            Ok(i) => {
                let old = std::mem::replace(&mut self.writes.edit()[i], facts);
                Arc::make_mut(&mut self.index).add(&old, -1);
            }
            Err(i) => self.writes.edit().insert(i, facts),
        }
        self.check();
    }

    /// A stale duplicate announced by a `data_fault` record, whose facts a driver
    /// holds in `replay`, lands or is refused (`ev`): put its facts back in flight
    /// first, so that `ev` is judged as the write it is. `true` (and `replay` emptied)
    /// when `ev` is that landing or refusal.
    pub fn duplicate_lands(&mut self, replay: &mut Option<WriteFacts>, ev: &TraceEvent) -> bool {
        let (TraceEvent::KvLanded { write, .. } | TraceEvent::KvRefused { write, .. }) = ev else {
            return false;
        };
        match replay.take_if(|f| f.id == *write) {
            Some(f) => {
                self.put(f);
                true
            }
            None => false,
        }
    }

    /// The write left flight (landed, refused, failed, flushed): its facts, if it was
    /// in flight.
    pub fn take(&mut self, id: WriteId) -> Option<WriteFacts> {
        let i = self.position(id).ok()?;
        let w = self.writes.edit().remove(i);
        Arc::make_mut(&mut self.index).add(&w, -1);
        self.check();
        Some(w)
    }

    /// Writes in flight aimed at `(node, page)` in the node's incarnation `epoch`.
    fn aimed_at(&self, node: NodeId, epoch: u32, t: PageTag) -> Option<&WriteFacts> {
        self.index.aimed.get(&(node, t.page, epoch))?;
        self.all().iter().find(|w| {
            w.to == node
                && w.dst
                    .iter()
                    .any(|d| d.page == t.page && d.gen.epoch() == epoch)
        })
    }

    /// Writes in flight reading `(node, page@gen)`.
    fn reading(&self, node: NodeId, t: PageTag) -> Option<&WriteFacts> {
        self.index.reading.get(&(node, t))?;
        self.all()
            .iter()
            .find(|w| w.id.writer == node && w.src.contains(&t))
    }

    /// Writes in flight from `node` for `room`.
    fn flying_from(&self, node: NodeId, room: RoomKey) -> Vec<WriteId> {
        self.all()
            .iter()
            .filter(|w| w.id.writer == node && w.id.room == room)
            .map(|w| w.id)
            .collect()
    }

    /// A page of `room` on `node` went back to Free: S2 if a write still reads it.
    pub fn freed(&self, rooms: &Rooms, node: NodeId, room: RoomKey, t: PageTag, out: &mut Drafts) {
        if let Some(w) = self.reading(node, t) {
            out.push(draft(
                    Invariant::S2,
                    Some(room),
                    format!(
                        "{node} freed source page {t} of {} while its KV write {} was still reading it",
                        rooms.describe(room),
                        w.id
                    ),
                ).on_page(node, t.page));
        }
    }

    /// S9: `node` (in incarnation `epoch`) hands page `t` to `room` while a write is
    /// still aimed at it.
    pub fn handed_out(
        &self,
        rooms: &Rooms,
        (node, epoch): (NodeId, u32),
        room: RoomKey,
        t: PageTag,
        out: &mut Drafts,
    ) {
        if let Some(w) = self.aimed_at(node, epoch, t) {
            out.push(draft(Invariant::S9, Some(room), format!(
                    "{node} handed page {t} to {} while the KV write {} aimed at it was still in flight",
                    rooms.describe(room),
                    w.id
                )).with_related([w.id.room]).on_page(node, t.page));
        }
    }

    /// S9 on a send: prefill `node` sends `write` after it acked the room's drain.
    pub fn sent_after_ack(&self, rooms: &Rooms, node: NodeId, write: WriteId, out: &mut Drafts) {
        let room = write.room;
        if rooms.has(room, RoomFlag::DrainAcked) {
            out.push(draft(
                Invariant::S9,
                Some(room),
                format!(
                "prefill {node} sent the KV write {write} for {} after it acked the room's drain",
                rooms.describe(room)
            ),
            ));
        }
    }

    /// S9: prefill `node` acks the drain of `room` while its writes are in flight.
    pub fn drain_acked(&self, rooms: &Rooms, node: NodeId, room: RoomKey, out: &mut Drafts) {
        let flying = self.flying_from(node, room);
        if let Some(w) = flying.first() {
            out.push(draft(Invariant::S9, Some(room), format!(
                "prefill {node} acked the drain of {} while {} of its KV writes were still in flight (first: {w})",
                rooms.describe(room),
                flying.len()
            )));
        }
    }

    /// S9: decode `node` (in incarnation `epoch`) releases the quarantine of `room` on
    /// the drain ack for `acked`: the ack must be the room's, and none of the room's
    /// writes aimed at this incarnation may still be in flight.
    pub fn quarantine_released(
        &self,
        rooms: &Rooms,
        (node, epoch): (NodeId, u32),
        room: RoomKey,
        acked: RoomKey,
        out: &mut Drafts,
    ) {
        if acked != room {
            out.push(
                draft(
                    Invariant::S9,
                    Some(room),
                    format!(
                        "decode {node} released the quarantine of {} on a drain ack for {acked}",
                        rooms.describe(room)
                    ),
                )
                .with_related([acked]),
            );
        }
        let flying: Vec<WriteId> = self
            .all()
            .iter()
            .filter(|w| {
                w.to == node && w.id.room == room && w.dst.iter().any(|d| d.gen.epoch() == epoch)
            })
            .map(|w| w.id)
            .collect();
        if let Some(w) = flying.first() {
            out.push(draft(Invariant::S9, Some(room), format!(
                "decode {node} released the quarantine of {} while {} of its KV writes were still in flight (first: {w})",
                rooms.describe(room),
                flying.len()
            )));
        }
    }

    /// What must hold after every change: sorted by id, one write per id, and the
    /// index counts exactly what the writes point at.
    fn check(&self) {
        debug_assert!(
            self.all().windows(2).all(|w| w[0].id < w[1].id),
            "the writes in flight are sorted by id, one per id"
        );
        debug_assert_eq!(
            self.index
                .reading
                .values()
                .map(|n| *n as usize)
                .sum::<usize>(),
            self.all().iter().map(|w| w.src.len()).sum::<usize>(),
            "the write index counts every source page of every write in flight"
        );
    }
}
