//! The oracle's own model of a run, built from trace records alone, and every safety
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
//! It is `Clone + Hash + Eq` and holds no timestamps, so the model checker keeps it in
//! its states; it stays bounded by the live state of the run (pages, rooms and writes
//! in flight, plus the answered request ids as ranges).

use crate::schema::{EndOutcome, FaultEvent, Record, RunHeader};
use crate::shared::{Edit, Shared};
use kvsim_engine::gpu::query_position;
use kvsim_engine::ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomKey, TenantId, WriteId,
};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::{lifecycle, PageOp, PageState};
use kvsim_engine::node::Role;
use kvsim_engine::trace::{NodeFault, ReleaseKind, Side, TraceEvent};
use std::fmt::Write as _;

/// Who wrote a page's slots last: the room use, and the contiguous slot range
/// `lo..hi` it covered. Slots outside the range hold an earlier writer's KV (stale).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Provenance {
    pub writer: Option<RoomKey>,
    pub lo: u32,
    pub hi: u32,
}

impl Provenance {
    /// The provenance after `writer` writes slot `slot`.
    pub fn after_write(self, writer: RoomKey, slot: u32) -> Provenance {
        if self.writer == Some(writer) && slot >= self.lo && slot <= self.hi {
            Provenance {
                hi: self.hi.max(slot + 1),
                ..self
            }
        } else if self.writer == Some(writer) && slot + 1 == self.lo {
            Provenance { lo: slot, ..self }
        } else {
            Provenance {
                writer: Some(writer),
                lo: slot,
                hi: slot + 1,
            }
        }
    }

    /// The provenance after a KV write of provenance `landed` lands over this page: a
    /// write places only the slots it carries, so a landing of the same writer over
    /// slots that writer already holds (a late copy of its own write) keeps the rest
    /// of its range; any other landing takes the page's provenance.
    pub fn after_landing(self, landed: Provenance) -> Provenance {
        let overlaps = landed.lo <= self.hi && self.lo <= landed.hi;
        if landed.writer.is_some() && landed.writer == self.writer && overlaps {
            Provenance {
                writer: self.writer,
                lo: self.lo.min(landed.lo),
                hi: self.hi.max(landed.hi),
            }
        } else {
            landed
        }
    }

    /// Did `writer` write slots `0..need`?
    pub fn covers(&self, writer: RoomKey, need: u32) -> bool {
        self.writer == Some(writer) && self.lo == 0 && self.hi >= need
    }
}

/// One page as the oracle knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageFact {
    pub state: PageState,
    pub gen: Generation,
    pub owner: Option<RoomKey>,
    pub holders: u16,
    pub prov: Provenance,
    /// The page holds bytes of a KV write that landed unchecked (no landing gate: a
    /// one-sided transport, or the gate off) when the page was not its room use's (a
    /// stray landing). S2 is then judged by its effect: violated when a read accepts
    /// those bytes, detected when the read-time tag check or verification refuses
    /// them; cleared without a finding when they are overwritten or zeroed unread.
    pub stray: bool,
}

/// Written by hand: the model checker hashes these on every transition, so each page
/// is packed into four words. It hashes exactly the fields `Eq` compares.
impl std::hash::Hash for PageFact {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let room =
            |k: Option<RoomKey>| k.map_or((0u64, 0u64), |k| (u64::from(k.room.0) + 1, k.gen.0));
        let (owner_room, owner_gen) = room(self.owner);
        let (writer_room, writer_gen) = room(self.prov.writer);
        h.write_u64(self.state as u64 | u64::from(self.holders) << 8 | owner_room << 24);
        h.write_u64(self.gen.0 ^ owner_gen.rotate_left(32));
        h.write_u64(writer_room | u64::from(self.stray) << 32 | u64::from(self.prov.lo) << 40);
        h.write_u64(writer_gen ^ u64::from(self.prov.hi).rotate_left(48));
    }
}

/// One node as the oracle knows it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct NodeBook {
    pub role: Role,
    pub epoch: u32,
    /// Index = page id; page 0 is padding and never used.
    pub pages: Vec<PageFact>,
    /// Halves admitted here and not yet answered.
    pub open: Vec<RoomKey>,
    /// Room uses quarantined here and not yet released.
    pub quarantined: Vec<RoomKey>,
    /// The node stopped itself loudly (a drain ack never came).
    pub stopped: bool,
}

impl NodeBook {
    fn new(role: Role, pool_pages: u32, epoch: u32) -> Self {
        let fact = PageFact {
            state: PageState::Free,
            gen: Generation::first_of_epoch(epoch),
            owner: None,
            holders: 0,
            prov: Provenance::default(),
            stray: false,
        };
        NodeBook {
            role,
            epoch,
            pages: vec![fact; pool_pages as usize + 1],
            open: Vec::new(),
            quarantined: Vec::new(),
            stopped: false,
        }
    }

    fn page(&self, p: PageId) -> Option<&PageFact> {
        (p.0 != 0).then(|| self.pages.get(p.0 as usize)).flatten()
    }

    fn page_mut(&mut self, p: PageId) -> Option<&mut PageFact> {
        if p.0 == 0 {
            return None;
        }
        self.pages.get_mut(p.0 as usize)
    }
}

/// What the oracle remembers about a room use, from the router's `Routed` event until
/// the router clears the room.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RoomFacts {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prefill: NodeId,
    pub decode: NodeId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    pub flags: u8,
    /// The first status each half answered (prefill, decode): a half's answer is one
    /// answer, so a repeat must carry the same status (S6).
    pub answered: [Option<kvsim_engine::msg::Status>; 2],
}

/// Room-use flags (see [`RoomFacts::flags`]).
pub mod flag {
    /// Prefill saw the abort: a later 200 from prefill is dishonest (S6).
    pub const PREFILL_ABORTED: u8 = 1;
    /// Decode heard that the transfer failed: a later 200 from decode is dishonest (S6).
    pub const TRANSFER_FAILED: u8 = 2;
    /// Prefill flagged it with a legacy rejection (to_finish set, still live).
    pub const FLAGGED_PREFILL: u8 = 4;
    /// Decode flagged it with a legacy rejection.
    pub const FLAGGED_DECODE: u8 = 8;
    /// Prefill acked decode's drain request: every later send is a violation (S9).
    pub const DRAIN_ACKED: u8 = 16;
}

/// A KV write in flight: from its send until it lands, is refused, fails or is flushed.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct WriteFacts {
    pub id: WriteId,
    pub to: NodeId,
    pub src: Vec<PageTag>,
    pub dst: Vec<PageTag>,
    /// The provenance of each source page when the write read it.
    pub prov: Vec<Provenance>,
}

/// What a finding says, before the caller stamps time and evidence on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    pub invariant: Invariant,
    /// `Some(defense)`: the defense stopped the hazard (a detection, nothing leaked);
    /// `None`: the invariant was violated.
    pub detected_by: Option<&'static str>,
    pub room: Option<RoomKey>,
    pub related: Vec<RoomKey>,
    pub pages: Vec<(NodeId, PageId)>,
    pub detail: String,
}

/// A request submitted and not yet answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Pending {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prompt_len: u64,
}

/// Where the KV writes in flight point, derived from [`OracleState::writes`] (so it is
/// left out of `Hash` and `Eq`): how many aim at each (node, page, epoch) and read each
/// (node, page tag). It makes "is a write still aimed at / reading this page" one
/// look-up, where a scan of every write for every page of a 10,000-page release would
/// be quadratic.
#[derive(Clone, Debug, Default)]
pub struct WriteIndex {
    aimed: std::collections::BTreeMap<(NodeId, PageId, u32), u32>,
    reading: std::collections::BTreeMap<(NodeId, PageTag), u32>,
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
        let bump = |n: &mut u32| {
            *n = (i64::from(*n) + sign).max(0) as u32;
        };
        for d in &w.dst {
            bump(self.aimed.entry((w.to, d.page, d.gen.epoch())).or_insert(0));
        }
        for t in &w.src {
            bump(self.reading.entry((w.id.writer, *t)).or_insert(0));
        }
        if sign < 0 {
            self.aimed.retain(|_, n| *n > 0);
            self.reading.retain(|_, n| *n > 0);
        }
    }
}

/// The oracle's model of the run. Its parts are shared and hashed separately
/// ([`Shared`]): a copy of the model (the model checker makes one per transition)
/// shares every part, and a change copies and rehashes only the part it touches.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OracleState {
    /// Index = node id (the client and unknown ids have no book).
    pub nodes: Vec<Option<Shared<NodeBook>>>,
    /// Routed room uses not yet cleared, sorted.
    pub rooms: Shared<Vec<(RoomKey, RoomFacts)>>,
    /// KV writes in flight, sorted by id.
    pub writes: Shared<Vec<WriteFacts>>,
    /// Submitted and unanswered, sorted.
    pub pending: Shared<Vec<Pending>>,
    /// Answered request ids, as sorted disjoint closed ranges.
    pub answered: Shared<Vec<(u64, u64)>>,
    /// Derived from `writes` (not part of the state's value).
    index: WriteIndex,
}

/// Findings of one step.
pub type Drafts = Vec<Draft>;

fn draft(inv: Invariant, room: Option<RoomKey>, detail: String) -> Draft {
    Draft {
        invariant: inv,
        detected_by: None,
        room,
        related: Vec::new(),
        pages: Vec::new(),
        detail,
    }
}

impl OracleState {
    pub fn new(h: &RunHeader) -> Self {
        let n = h
            .nodes
            .iter()
            .map(|n| n.id.0 as usize + 1)
            .max()
            .unwrap_or(0);
        let mut nodes = vec![None; n];
        for info in &h.nodes {
            nodes[info.id.0 as usize] = Some(Shared::new(NodeBook::new(
                info.role,
                info.pool_pages.unwrap_or(0),
                0,
            )));
        }
        OracleState {
            nodes,
            rooms: Shared::new(Vec::new()),
            writes: Shared::new(Vec::new()),
            pending: Shared::new(Vec::new()),
            answered: Shared::new(Vec::new()),
            index: WriteIndex::default(),
        }
    }

    fn book(&self, n: NodeId) -> Option<&NodeBook> {
        self.nodes
            .get(n.0 as usize)
            .and_then(Option::as_ref)
            .map(Shared::get)
    }

    fn book_mut(&mut self, n: NodeId) -> Option<Edit<'_, NodeBook>> {
        self.nodes
            .get_mut(n.0 as usize)
            .and_then(Option::as_mut)
            .map(Shared::edit)
    }

    pub fn room(&self, room: RoomKey) -> Option<&RoomFacts> {
        let rooms = self.rooms.get();
        rooms
            .binary_search_by_key(&room, |(k, _)| *k)
            .ok()
            .map(|i| &rooms[i].1)
    }

    /// Change a room's flags (no copy when nothing changes).
    fn set_flags(&mut self, room: RoomKey, f: impl Fn(u8) -> u8) {
        let Ok(i) = self.rooms.get().binary_search_by_key(&room, |(k, _)| *k) else {
            return;
        };
        let new = f(self.rooms.get()[i].1.flags);
        if new != self.rooms.get()[i].1.flags {
            self.rooms.edit()[i].1.flags = new;
        }
    }

    fn flag(&mut self, room: RoomKey, f: u8) {
        self.set_flags(room, |x| x | f);
    }

    fn has(&self, room: RoomKey, f: u8) -> bool {
        self.room(room).is_some_and(|r| r.flags & f != 0)
    }

    fn write_index(&self, id: WriteId) -> Result<usize, usize> {
        self.writes.get().binary_search_by_key(&id, |w| w.id)
    }

    /// The facts of a KV write in flight (sent, not yet landed, refused or failed).
    pub fn write_in_flight(&self, id: WriteId) -> Option<&WriteFacts> {
        self.write_index(id).ok().map(|i| &self.writes.get()[i])
    }

    /// A stale duplicate of a write that already landed is about to land again
    /// (`data_fault` `stale_duplicate`): put its facts back in flight, so that its
    /// landing or refusal is judged as the write it is (where it lands, what its
    /// payload carries). [`crate::Oracle`] keeps the facts of recent landings for this.
    pub fn restore_write(&mut self, facts: WriteFacts) {
        self.index.add(&facts, 1);
        match self.write_index(facts.id) {
            Ok(i) => {
                let old = std::mem::replace(&mut self.writes.edit()[i], facts);
                self.index.add(&old, -1);
            }
            Err(i) => self.writes.edit().insert(i, facts),
        }
    }

    /// A stale duplicate announced by a `data_fault` record, whose facts a driver
    /// holds in `replay`, lands or is refused (`ev`): put its facts back in flight
    /// first ([`OracleState::restore_write`]), so that `ev` is judged as the write it
    /// is. `true` (and `replay` emptied) when `ev` is that landing or refusal.
    pub fn duplicate_lands(&mut self, replay: &mut Option<WriteFacts>, ev: &TraceEvent) -> bool {
        let (TraceEvent::KvLanded { write, .. } | TraceEvent::KvRefused { write, .. }) = ev else {
            return false;
        };
        match replay.take_if(|f| f.id == *write) {
            Some(f) => {
                self.restore_write(f);
                true
            }
            None => false,
        }
    }

    fn take_write(&mut self, id: WriteId) -> Option<WriteFacts> {
        let i = self.write_index(id).ok()?;
        let w = self.writes.edit().remove(i);
        self.index.add(&w, -1);
        Some(w)
    }

    fn is_answered(&self, req: RequestId) -> bool {
        let answered = self.answered.get();
        let i = answered.partition_point(|(_, hi)| *hi < req.0);
        answered.get(i).is_some_and(|(lo, _)| *lo <= req.0)
    }

    fn answer(&mut self, req: RequestId) {
        let r = req.0;
        let mut answered = self.answered.edit();
        let i = answered.partition_point(|(_, hi)| hi.saturating_add(1) < r);
        match answered.get_mut(i) {
            Some((lo, hi)) if *lo <= r.saturating_add(1) => {
                *lo = (*lo).min(r);
                *hi = (*hi).max(r);
                // Merge with the next range if they now touch.
                if let Some(&(nlo, nhi)) = answered.get(i + 1) {
                    if nlo <= answered[i].1.saturating_add(1) {
                        answered[i].1 = answered[i].1.max(nhi);
                        answered.remove(i + 1);
                    }
                }
            }
            _ => answered.insert(i, (r, r)),
        }
    }

    /// A room use for humans: `room2.g4 (req7 of t2, prompt 700 tokens)`.
    pub fn describe(&self, room: RoomKey) -> String {
        match self.room(room) {
            Some(f) => format!(
                "{room} ({} of {}, prompt {} tokens)",
                f.req, f.tenant, f.prompt_len
            ),
            None => room.to_string(),
        }
    }

    /// What each node still does for `room`: the half it has not answered, the pages
    /// it still owns for it (quarantined pages are let go). Empty when every node is
    /// done with it (bounded cleanup, L6).
    pub fn still_working(&self, room: RoomKey) -> Vec<(NodeId, String)> {
        let mut out = Vec::new();
        for (i, b) in self.nodes.iter().enumerate() {
            let Some(b) = b.as_ref().map(Shared::get) else {
                continue;
            };
            let node = NodeId(i as u16);
            if b.open.binary_search(&room).is_ok() {
                out.push((node, "has not answered its half".to_string()));
            }
            let held = b
                .pages
                .iter()
                .filter(|p| p.owner == Some(room) && p.state != PageState::Quarantined)
                .count();
            if held > 0 {
                out.push((node, format!("still owns {held} of its pages")));
            }
        }
        out
    }

    /// Must `side` reject the request of this room at intake (its own limit)?
    fn must_reject(&self, h: &RunHeader, f: &RoomFacts, side: Side) -> bool {
        must_reject(h, side, f.prefill, f.decode, f.prompt_len, f.max_new_tokens)
    }

    fn side_of(&self, node: NodeId) -> Option<Side> {
        match self.book(node)?.role {
            Role::Prefill => Some(Side::Prefill),
            Role::Decode => Some(Side::Decode),
            Role::Router => None,
        }
    }

    /// S5 (or L5) when a request that exceeds `node`'s limit gets something there.
    fn check_retired(
        &self,
        h: &RunHeader,
        node: NodeId,
        room: RoomKey,
        what: &str,
        out: &mut Drafts,
    ) {
        let (Some(f), Some(side)) = (self.room(room), self.side_of(node)) else {
            return;
        };
        if !self.must_reject(h, f, side) {
            return;
        }
        let (need, flag) = match side {
            Side::Prefill => (f.prompt_len, flag::FLAGGED_PREFILL),
            Side::Decode => (
                f.prompt_len.saturating_add(u64::from(f.max_new_tokens)),
                flag::FLAGGED_DECODE,
            ),
        };
        let limit = h.limit(node);
        let d = self.describe(room);
        // A request within the context that the node never flagged was admitted beyond
        // its pool (L5, SGLang #29249); one it flagged as rejected, or one beyond the
        // context, and then served is rejected-but-live (S5, the GLM-5.3 incident).
        if need <= h.context_len && f.flags & flag == 0 {
            out.push(draft(Invariant::L5, Some(room), format!(
                "{d} needs more than {node}'s pool of {limit} tokens, yet it {what}: admitted beyond the pool"
            )));
        } else {
            out.push(draft(Invariant::S5, Some(room), format!(
                "{d} exceeds {node}'s limit of {limit} tokens and must be rejected at intake, but it {what}"
            )));
        }
    }

    /// Writes in flight aimed at `(node, page)` in the node's current incarnation.
    fn write_aimed_at(&self, node: NodeId, t: PageTag) -> Option<&WriteFacts> {
        let epoch = self.book(node)?.epoch;
        self.index.aimed.get(&(node, t.page, epoch))?;
        self.writes.get().iter().find(|w| {
            w.to == node
                && w.dst
                    .iter()
                    .any(|d| d.page == t.page && d.gen.epoch() == epoch)
        })
    }

    /// Writes in flight reading `(node, page@gen)`.
    fn write_reading(&self, node: NodeId, t: PageTag) -> Option<&WriteFacts> {
        self.index.reading.get(&(node, t))?;
        self.writes
            .get()
            .iter()
            .find(|w| w.id.writer == node && w.src.contains(&t))
    }

    /// A page went back to Free: S2 if a write still reads it.
    fn freed(&self, node: NodeId, room: RoomKey, t: PageTag, out: &mut Drafts) {
        if let Some(w) = self.write_reading(node, t) {
            out.push(Draft {
                pages: vec![(node, t.page)],
                ..draft(
                    Invariant::S2,
                    Some(room),
                    format!(
                        "{node} freed source page {t} of {} while its KV write {} was still reading it",
                        self.describe(room),
                        w.id
                    ),
                )
            });
        }
    }

    /// S3: the first attended page whose slots `0..need` were not all written by
    /// `room`, with its provenance.
    fn isolation_breach(
        &self,
        h: &RunHeader,
        node: NodeId,
        room: RoomKey,
        seq_len: u64,
        pages: &[PageTag],
    ) -> Option<(usize, PageTag, Provenance)> {
        let book = self.book(node)?;
        let ps = u64::from(h.page_size);
        for (i, t) in pages.iter().enumerate() {
            let start = i as u64 * ps;
            if start >= seq_len {
                break;
            }
            let need = (seq_len - start).min(ps) as u32;
            let prov = book.page(t.page).map(|p| p.prov).unwrap_or_default();
            if !prov.covers(room, need) {
                return Some((i, *t, prov));
            }
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn s3(
        &self,
        h: &RunHeader,
        node: NodeId,
        room: RoomKey,
        seq_len: u64,
        pages: &[PageTag],
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        let Some((i, t, prov)) = self.isolation_breach(h, node, room, seq_len, pages) else {
            return;
        };
        let whose = match prov.writer {
            Some(w) if w == room => format!("only slots {}..{} are its own", prov.lo, prov.hi),
            Some(w) => format!("it holds KV written by {}", self.describe(w)),
            None => "it was never written".to_string(),
        };
        let ps = u64::from(h.page_size);
        let start = i as u64 * ps;
        let end = (start + ps).min(seq_len);
        let verb = if detected_by.is_some() {
            "the page-tag check refused the read of"
        } else {
            "reads"
        };
        out.push(Draft {
            invariant: Invariant::S3,
            detected_by,
            room: Some(room),
            related: prov.writer.filter(|w| *w != room).into_iter().collect(),
            pages: vec![(node, t.page)],
            detail: format!(
                "decode {node} {verb} page {t} (positions {start}..{end}) for {} but {whose}",
                self.describe(room)
            ),
        });
    }

    /// S2 judged by its effect: `room` on `node` reads (`detected_by` `None`), or a
    /// defense refuses (the read-time tag check, verification), `pages`, and one of them
    /// holds stray bytes (a write that landed unchecked when the page was not its
    /// room's, `PageFact::stray`). A read that accepts them is the violation; a refusal
    /// is the detection. Either way the bytes have had their one effect: the flag clears.
    fn stray_effect(
        &mut self,
        node: NodeId,
        room: RoomKey,
        pages: &[PageTag],
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        let Some(mut b) = self.book_mut(node) else {
            return;
        };
        let mut hit = None;
        for t in pages {
            if let Some(p) = b.page_mut(t.page) {
                if p.stray && p.prov.writer != Some(room) {
                    hit.get_or_insert((*t, p.prov.writer));
                }
                p.stray = false;
            }
        }
        drop(b);
        let Some((t, writer)) = hit else {
            return;
        };
        let whose = writer.map_or("an unknown room use".to_string(), |w| self.describe(w));
        let what = match detected_by {
            None => format!("decode {node} read it for {}", self.describe(room)),
            Some(d) => format!(
                "{d} refused it for {} before any of it was read",
                self.describe(room)
            ),
        };
        out.push(Draft {
            detected_by,
            related: writer.into_iter().collect(),
            pages: vec![(node, t.page)],
            ..draft(Invariant::S2, Some(room), format!(
                "a KV write of {whose} landed unchecked in decode {node} page {t} after the page left that room (no landing gate), and {what}"
            ))
        });
    }

    /// S2 on a write's destination: the first page that no longer belongs to its room.
    fn write_target_breach(
        &self,
        node: NodeId,
        room: RoomKey,
        dst: &[PageTag],
    ) -> Option<(PageTag, String)> {
        let book = self.book(node)?;
        dst.iter().find_map(|t| {
            let ok = book.page(t.page).is_some_and(|p| {
                p.gen == t.gen
                    && p.owner == Some(room)
                    && (p.state.is_owned() || p.state == PageState::Quarantined)
            });
            (!ok).then(|| {
                let now = book.page(t.page).map_or("not a pool page".into(), |p| {
                    format!("{} at {} for {:?}", p.state, p.gen, p.owner)
                });
                (*t, now)
            })
        })
    }

    /// Move pages of `room` on `node` by `op` (S1 when the record would not allow it).
    fn mark(
        &mut self,
        node: NodeId,
        room: RoomKey,
        pages: &[PageTag],
        op: PageOp,
        out: &mut Drafts,
    ) {
        let mut bad = None;
        if let Some(mut book) = self.book_mut(node) {
            for t in pages {
                let Some(p) = book.page_mut(t.page) else {
                    bad.get_or_insert((*t, "not a pool page".to_string()));
                    continue;
                };
                match lifecycle::transition(p.state, op) {
                    Ok(to) if p.gen == t.gen && p.owner == Some(room) => p.state = to,
                    Ok(_) => {
                        bad.get_or_insert((
                            *t,
                            format!("it is {} at {} for {:?}", p.state, p.gen, p.owner),
                        ));
                    }
                    Err(e) => {
                        bad.get_or_insert((*t, e.to_string()));
                    }
                }
            }
        }
        if let Some((t, why)) = bad {
            out.push(Draft {
                pages: vec![(node, t.page)],
                ..draft(
                    Invariant::S1,
                    Some(room),
                    format!(
                        "{node} moved page {t} of {} by {op:?}, but {why}",
                        self.describe(room)
                    ),
                )
            });
        }
    }

    /// Judge one record, updating the model; findings go to `out`.
    pub fn observe(&mut self, h: &RunHeader, rec: &Record, out: &mut Drafts) {
        match rec {
            Record::Submit {
                req,
                tenant,
                prompt_len,
                ..
            } => {
                if let Err(i) = self.pending.get().binary_search_by_key(req, |p| p.req) {
                    self.pending.edit().insert(
                        i,
                        Pending {
                            req: *req,
                            tenant: *tenant,
                            prompt_len: *prompt_len,
                        },
                    );
                }
            }
            Record::WriteFailed { write, .. } => {
                self.take_write(*write);
            }
            Record::Fault(FaultEvent::Crash { node, flushed, .. }) => {
                for w in flushed {
                    self.take_write(*w);
                }
                if let Some(mut b) = self.book_mut(*node) {
                    b.open.clear();
                    b.quarantined.clear();
                }
                self.forget_answers(*node);
            }
            Record::Fault(FaultEvent::Restart { node, epoch }) => {
                if let Some(mut b) = self.book_mut(*node) {
                    // A new incarnation: an empty pool in the new epoch. KV memory is not
                    // zeroed, so what each page held (its provenance) stays.
                    let fresh = NodeBook::new(b.role, b.pages.len() as u32 - 1, *epoch);
                    let old = std::mem::replace(&mut *b, fresh);
                    for (p, o) in b.pages.iter_mut().zip(old.pages) {
                        p.prov = o.prov;
                    }
                }
            }
            Record::Engine(ev) => self.observe_event(h, ev, out),
            Record::End { outcome, detail } => self.at_end(*outcome, detail, out),
            _ => {}
        }
    }

    /// Judge one engine event ([`OracleState::observe`] of `Record::Engine`, without
    /// building the record).
    pub fn observe_event(&mut self, h: &RunHeader, ev: &TraceEvent, out: &mut Drafts) {
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
            } => {
                let facts = RoomFacts {
                    req: *req,
                    tenant: *tenant,
                    prefill: *prefill,
                    decode: *decode,
                    prompt_len: *prompt_len,
                    max_new_tokens: *max_new_tokens,
                    flags: 0,
                    answered: [None; 2],
                };
                match self.rooms.get().binary_search_by_key(room, |(k, _)| *k) {
                    Ok(i) => self.rooms.edit()[i].1 = facts,
                    Err(i) => self.rooms.edit().insert(i, (*room, facts)),
                }
            }
            Admitted { node, room, .. } => {
                if let Some(mut b) = self.book_mut(*node) {
                    if let Err(i) = b.open.binary_search(room) {
                        b.open.insert(i, *room);
                    }
                }
                self.check_retired(
                    h,
                    *node,
                    *room,
                    "was admitted (got a sender or receiver)",
                    out,
                );
            }
            RejectedLegacy { node, room, .. } => {
                let f = match self.side_of(*node) {
                    Some(Side::Prefill) => flag::FLAGGED_PREFILL,
                    _ => flag::FLAGGED_DECODE,
                };
                self.flag(*room, f);
            }
            Rejected { .. } | Truncated { .. } => {}
            PagesReserved { node, room, pages } => {
                let cap = self
                    .book(*node)
                    .map_or(0, |b| b.pages.len().saturating_sub(1));
                if pages.len() > cap {
                    out.push(draft(
                        Invariant::L5,
                        Some(*room),
                        format!(
                            "{} reserved {} pages on {node}, whose pool has {cap}",
                            self.describe(*room),
                            pages.len()
                        ),
                    ));
                }
                self.check_retired(h, *node, *room, &format!("got {} pages", pages.len()), out);
                for t in pages {
                    if let Some(w) = self.write_aimed_at(*node, *t) {
                        out.push(Draft {
                            related: vec![w.id.room],
                            pages: vec![(*node, t.page)],
                            ..draft(Invariant::S9, Some(*room), format!(
                                "{node} handed page {t} to {} while the KV write {} aimed at it was still in flight",
                                self.describe(*room),
                                w.id
                            ))
                        });
                    }
                    let prior = self.book(*node).and_then(|b| b.page(t.page)).cloned();
                    match prior {
                        Some(p) if p.state == PageState::Free && t.gen > p.gen => {}
                        Some(p) => out.push(Draft {
                            related: p.owner.filter(|o| o != room).into_iter().collect(),
                            pages: vec![(*node, t.page)],
                            ..draft(
                                Invariant::S1,
                                Some(*room),
                                format!(
                                    "{node} handed page {t} to {}, but it is {} at {} for {}",
                                    self.describe(*room),
                                    p.state,
                                    p.gen,
                                    p.owner.map_or("nobody".into(), |o| self.describe(o))
                                ),
                            )
                        }),
                        None => out.push(draft(
                            Invariant::S1,
                            Some(*room),
                            format!(
                                "{node} handed page {t}, which is not a pool page, to {}",
                                self.describe(*room)
                            ),
                        )),
                    }
                }
                // One change of the node's record for the whole batch.
                if let Some(mut b) = self.book_mut(*node) {
                    for t in pages {
                        if let Some(p) = b.page_mut(t.page) {
                            p.state = PageState::Reserved;
                            p.gen = t.gen;
                            p.owner = Some(*room);
                            p.holders = 0;
                        }
                    }
                }
            }
            PagesExpectWrite { node, room, pages } => {
                self.mark(*node, *room, pages, PageOp::ExpectWrite, out)
            }
            PagesReady { node, room, pages } => {
                self.mark(*node, *room, pages, PageOp::MarkReady, out)
            }
            Quarantined { node, room, pages } => {
                self.mark(*node, *room, pages, PageOp::Quarantine, out);
                if let Some(mut b) = self.book_mut(*node) {
                    if let Err(i) = b.quarantined.binary_search(room) {
                        b.quarantined.insert(i, *room);
                    }
                }
            }
            PagesReleased {
                node,
                room,
                pages,
                how,
                held,
            } => self.release(
                *node,
                *room,
                pages,
                held,
                *how == ReleaseKind::Unchecked,
                None,
                out,
            ),
            QuarantineReleased {
                node,
                room,
                pages,
                acked,
                held,
            } => {
                if acked != room {
                    out.push(Draft {
                        related: vec![*acked],
                        ..draft(Invariant::S9, Some(*room), format!(
                            "decode {node} released the quarantine of {} on a drain ack for {acked}",
                            self.describe(*room)
                        ))
                    });
                }
                let epoch = self.book(*node).map_or(0, |b| b.epoch);
                let flying: Vec<WriteId> = self
                    .writes
                    .get()
                    .iter()
                    .filter(|w| {
                        w.to == *node
                            && w.id.room == *room
                            && w.dst.iter().any(|d| d.gen.epoch() == epoch)
                    })
                    .map(|w| w.id)
                    .collect();
                if let Some(w) = flying.first() {
                    out.push(draft(Invariant::S9, Some(*room), format!(
                        "decode {node} released the quarantine of {} while {} of its KV writes were still in flight (first: {w})",
                        self.describe(*room),
                        flying.len()
                    )));
                }
                if let Some(mut b) = self.book_mut(*node) {
                    if let Ok(i) = b.quarantined.binary_search(room) {
                        b.quarantined.remove(i);
                    }
                }
                self.release(
                    *node,
                    *room,
                    pages,
                    held,
                    false,
                    Some(PageState::Quarantined),
                    out,
                );
            }
            PagesHeld { node, pages } => {
                let mut bad = None;
                if let Some(mut b) = self.book_mut(*node) {
                    for t in pages {
                        match b.page_mut(t.page) {
                            Some(p) if p.gen == t.gen && lifecycle::check_hold(p.state).is_ok() => {
                                p.holders = p.holders.saturating_add(1)
                            }
                            _ => {
                                bad.get_or_insert(*t);
                            }
                        }
                    }
                }
                if let Some(t) = bad {
                    out.push(Draft {
                        pages: vec![(*node, t.page)],
                        ..draft(Invariant::S1, None, format!(
                            "{node} took a hold on page {t}, which no room use owns at that generation"
                        ))
                    });
                }
            }
            PagesUnheld { node, pages, freed } => {
                if let Some(mut b) = self.book_mut(*node) {
                    for t in pages {
                        if let Some(p) = b.page_mut(t.page) {
                            p.holders = p.holders.saturating_sub(1);
                        }
                    }
                    for t in freed {
                        if let Some(p) = b.page_mut(t.page) {
                            if p.state == PageState::Draining && p.holders == 0 {
                                p.state = PageState::Free;
                            }
                        }
                    }
                }
            }
            KvWritten {
                node,
                room,
                pages,
                start,
                tokens,
            } => {
                if let Some((t, now)) = self
                    .book(*node)
                    .and_then(|b| {
                        pages.iter().find(|t| {
                            !b.page(t.page).is_some_and(|p| {
                                p.gen == t.gen && p.owner == Some(*room) && p.state.is_owned()
                            })
                        })
                    })
                    .map(|t| (*t, self.describe(*room)))
                {
                    out.push(Draft {
                        pages: vec![(*node, t.page)],
                        ..draft(
                            Invariant::S2,
                            Some(*room),
                            format!(
                            "{node} wrote KV of {now} into page {t}, which its room no longer owns"
                        ),
                        )
                    });
                }
                let ps = u64::from(h.page_size);
                if let Some(mut b) = self.book_mut(*node) {
                    for pos in *start..start.saturating_add(*tokens) {
                        let Some(t) = pages.get((pos / ps) as usize) else {
                            break;
                        };
                        if let Some(p) = b.page_mut(t.page) {
                            p.prov = p.prov.after_write(*room, (pos % ps) as u32);
                            p.stray &= p.prov.writer != Some(*room);
                        }
                    }
                }
            }
            PagesZeroed { node, pages } => {
                if let Some(mut b) = self.book_mut(*node) {
                    for &pg in pages {
                        if let Some(p) = b.page_mut(pg) {
                            p.prov = Provenance::default();
                            p.stray = false;
                        }
                    }
                }
            }
            KvSent {
                node,
                write,
                src,
                dst,
                to,
            } => {
                let room = write.room;
                self.check_retired(h, *node, room, "sent KV", out);
                if self.has(room, flag::DRAIN_ACKED) {
                    out.push(draft(Invariant::S9, Some(room), format!(
                        "prefill {node} sent the KV write {write} for {} after it acked the room's drain",
                        self.describe(room)
                    )));
                }
                let book = self.book(*node);
                if let Some(t) = src.iter().find(|t| {
                    !book.and_then(|b| b.page(t.page)).is_some_and(|p| {
                        p.gen == t.gen && p.owner == Some(room) && p.state.is_owned()
                    })
                }) {
                    out.push(Draft {
                        pages: vec![(*node, t.page)],
                        ..draft(
                            Invariant::S2,
                            Some(room),
                            format!(
                                "prefill {node} sends page {t} for {}, which its room does not own",
                                self.describe(room)
                            ),
                        )
                    });
                }
                let prov = src
                    .iter()
                    .map(|t| {
                        book.and_then(|b| b.page(t.page))
                            .map(|p| p.prov)
                            .unwrap_or_default()
                    })
                    .collect();
                // The receiver the event names (version 2), else the room's decode node.
                let to = to.unwrap_or_else(|| self.room(room).map_or(*node, |f| f.decode));
                let facts = WriteFacts {
                    id: *write,
                    to,
                    src: src.clone(),
                    dst: dst.clone(),
                    prov,
                };
                self.index.add(&facts, 1);
                match self.write_index(*write) {
                    Ok(i) => {
                        let old = std::mem::replace(&mut self.writes.edit()[i], facts);
                        self.index.add(&old, -1);
                    }
                    Err(i) => self.writes.edit().insert(i, facts),
                }
            }
            KvLanded { node, write, dst } => {
                let room = write.room;
                let facts = self.take_write(*write);
                // Pages the write reached although they are not its room use's: nothing
                // checked it before it landed (a one-sided transport, or no landing
                // gate). Judged by its effect (`PageFact::stray`).
                let strays: Vec<PageTag> = dst
                    .iter()
                    .filter(|t| self.write_target_breach(*node, room, &[**t]).is_some())
                    .copied()
                    .collect();
                let ps = h.page_size;
                if let Some(mut b) = self.book_mut(*node) {
                    for (i, t) in dst.iter().enumerate() {
                        let prov = facts
                            .as_ref()
                            .and_then(|f| f.prov.get(i).copied())
                            .unwrap_or(
                                // The send is not in the trace (a trace of the receiver only):
                                // the write is taken as the room's, every slot.
                                Provenance {
                                    writer: Some(room),
                                    lo: 0,
                                    hi: ps,
                                },
                            );
                        if let Some(p) = b.page_mut(t.page) {
                            p.prov = p.prov.after_landing(prov);
                            p.stray =
                                strays.contains(t) || (p.stray && p.prov.writer != Some(room));
                        }
                    }
                }
            }
            KvRefused { node, write, .. } => {
                let facts = self.take_write(*write);
                let room = write.room;
                let dst = facts.map(|f| f.dst).unwrap_or_default();
                if let Some((t, now)) = self.write_target_breach(*node, room, &dst) {
                    out.push(Draft {
                        detected_by: Some("landing_gate"),
                        pages: vec![(*node, t.page)],
                        ..draft(Invariant::S2, Some(room), format!(
                            "decode {node}'s landing-time tag check refused the KV write {write} for {} aimed at page {t} (it is {now}): nothing landed",
                            self.describe(room)
                        ))
                    });
                }
            }
            WriteCompleted { .. }
            | PeerRefused { .. }
            | TransferFailed { .. }
            | RouterRetried { .. } => {}
            TransferReported { room, success, .. } => {
                if !success {
                    self.flag(*room, flag::TRANSFER_FAILED);
                }
            }
            TransferAccepted {
                node,
                room,
                from,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
            } => {
                if let Some(f) = self.room(*room) {
                    if f.prefill != *from {
                        out.push(draft(Invariant::S7, Some(*room), format!(
                            "decode {node} accepted the transfer of {} on a completion from {from}, which is not its prefill node {}",
                            self.describe(*room),
                            f.prefill
                        )));
                    }
                }
                if !self.has(*room, flag::TRANSFER_FAILED) {
                    let true_len = self.room(*room).map(|f| f.prompt_len);
                    if let Some(p) = length_disagreement(
                        true_len,
                        *prompt_len,
                        *reserved_pages,
                        *sent_tokens,
                        *sent_pages,
                        *fully_written,
                    ) {
                        out.push(draft(
                            Invariant::S4,
                            Some(*room),
                            format!(
                                "decode {node} accepted the transfer of {}: {p}",
                                self.describe(*room)
                            ),
                        ));
                    }
                }
            }
            TransferRefused {
                node,
                room,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
                reason,
                ..
            } => {
                let true_len = self.room(*room).map(|f| f.prompt_len);
                let why = length_disagreement(
                    true_len,
                    *prompt_len,
                    *reserved_pages,
                    *sent_tokens,
                    *sent_pages,
                    *fully_written,
                )
                .unwrap_or_else(|| reason.clone());
                let mine: Vec<PageTag> = self.book(*node).map_or(Vec::new(), |b| {
                    b.pages
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.owner == Some(*room))
                        .map(|(i, p)| PageTag {
                            page: PageId(i as u32),
                            gen: p.gen,
                        })
                        .collect()
                });
                self.stray_effect(*node, *room, &mine, Some("verify_on_completion"), out);
                out.push(Draft {
                    detected_by: Some("verify_on_completion"),
                    ..draft(Invariant::S4, Some(*room), format!(
                        "decode {node}'s verification refused the transfer of {} that prefill reported complete: {why}; the request failed instead",
                        self.describe(*room)
                    ))
                });
            }
            Running { node, room, .. } => {
                self.check_retired(h, *node, *room, "joined a running batch", out)
            }
            Attend {
                node,
                room,
                seq_len,
                pages,
                ..
            } => {
                self.stray_effect(*node, *room, pages, None, out);
                self.s3(h, *node, *room, *seq_len, pages, None, out)
            }
            TagMismatch {
                node,
                room,
                seq_len,
                pages,
                ..
            } => {
                self.stray_effect(*node, *room, pages, Some("page_tags"), out);
                self.s3(h, *node, *room, *seq_len, pages, Some("page_tags"), out)
            }
            AbortNoted { room, side, .. } => {
                if *side == Side::Prefill {
                    self.flag(*room, flag::PREFILL_ABORTED);
                }
            }
            Responded {
                node,
                room,
                side,
                status,
            } => {
                if self.repeated_answer(*node, *room, *side, *status, out) {
                    return;
                }
                if let Some(mut b) = self.book_mut(*node) {
                    if let Ok(i) = b.open.binary_search(room) {
                        b.open.remove(i);
                    }
                }
                if *side == Side::Prefill {
                    self.set_flags(*room, |f| f & !flag::DRAIN_ACKED);
                }
                if status.is_ok()
                    && *side == Side::Prefill
                    && self.has(*room, flag::PREFILL_ABORTED)
                {
                    out.push(draft(
                        Invariant::S6,
                        Some(*room),
                        format!(
                            "prefill {node} answered 200 for {} after its abort became visible",
                            self.describe(*room)
                        ),
                    ));
                }
                if status.is_ok() && *side == Side::Decode && self.has(*room, flag::TRANSFER_FAILED)
                {
                    out.push(draft(
                        Invariant::S6,
                        Some(*room),
                        format!(
                            "decode {node} answered 200 for {} after its KV transfer failed",
                            self.describe(*room)
                        ),
                    ));
                }
            }
            RouterResponse {
                req,
                room,
                status,
                tokens,
                ..
            } => {
                if self.is_answered(*req) {
                    out.push(draft(
                        Invariant::S6,
                        *room,
                        format!("{req} got a second terminal response ({status})"),
                    ));
                }
                self.answer(*req);
                if let Ok(i) = self.pending.get().binary_search_by_key(req, |p| p.req) {
                    self.pending.edit().remove(i);
                }
                if let Some(f) = room.and_then(|r| self.room(r)) {
                    let rejected = self.must_reject(h, f, Side::Prefill)
                        || self.must_reject(h, f, Side::Decode);
                    if status.is_ok() && rejected {
                        out.push(draft(Invariant::S6, *room, format!(
                            "{req} does not fit the pool and must be rejected, but the client got 200"
                        )));
                    }
                }
                if h.canary_tokens {
                    self.canary(*req, *room, *status, tokens, out);
                }
                if h.canary_tokens && h.echo_replies && status.is_ok() {
                    if let Some(f) = room.and_then(|r| self.room(r)) {
                        if let Some(d) = reply_error(*req, f.prompt_len, f.max_new_tokens, tokens) {
                            out.push(draft(Invariant::S10, *room, d));
                        }
                    }
                }
            }
            RoomCleared { room, .. } => {
                if let Ok(i) = self.rooms.get().binary_search_by_key(room, |(k, _)| *k) {
                    self.rooms.edit().remove(i);
                }
            }
            DrainAcked { node, room } => {
                let flying: Vec<WriteId> = self
                    .writes
                    .get()
                    .iter()
                    .filter(|w| w.id.writer == *node && w.id.room == *room)
                    .map(|w| w.id)
                    .collect();
                if let Some(w) = flying.first() {
                    out.push(draft(Invariant::S9, Some(*room), format!(
                        "prefill {node} acked the drain of {} while {} of its KV writes were still in flight (first: {w})",
                        self.describe(*room),
                        flying.len()
                    )));
                }
                // Remembered only while the prefill half is live: a node sends for a room
                // use only while it holds its request, so afterwards the fact can decide
                // nothing and would only tell apart runs that are otherwise the same.
                if self
                    .book(*node)
                    .is_some_and(|b| b.open.binary_search(room).is_ok())
                {
                    self.flag(*room, flag::DRAIN_ACKED);
                }
            }
            Fault { node, fault } => {
                if let NodeFault::DrainAckMissing { .. } = fault {
                    if let Some(mut b) = self.book_mut(*node) {
                        b.stopped = true;
                    }
                }
            }
        }
    }

    /// S6 for a half's answers: the first answer of each half is recorded, and a repeat
    /// (the node answering an abort again, after a lost answer) must carry the first
    /// status; a repeat is judged only for this and changes nothing else. Returns
    /// whether `status` repeats an earlier answer of `side`.
    fn repeated_answer(
        &mut self,
        node: NodeId,
        room: RoomKey,
        side: Side,
        status: kvsim_engine::msg::Status,
        out: &mut Drafts,
    ) -> bool {
        let Ok(i) = self.rooms.get().binary_search_by_key(&room, |(k, _)| *k) else {
            return false;
        };
        let half = usize::from(side == Side::Decode);
        match self.rooms.get()[i].1.answered[half] {
            None => {
                self.rooms.edit()[i].1.answered[half] = Some(status);
                false
            }
            Some(first) => {
                if first != status {
                    let what = self.describe(room);
                    out.push(draft(
                        Invariant::S6,
                        Some(room),
                        format!("{node} answered {status} for {what} after answering {first}"),
                    ));
                }
                true
            }
        }
    }

    /// A crashed node's restarted incarnation remembers no answer of the dead one: what
    /// it answers for a room use the dead one answered is its own first answer.
    fn forget_answers(&mut self, node: NodeId) {
        let hit = |f: &RoomFacts| {
            (f.prefill == node && f.answered[0].is_some())
                || (f.decode == node && f.answered[1].is_some())
        };
        if !self.rooms.get().iter().any(|(_, f)| hit(f)) {
            return;
        }
        for (_, f) in self.rooms.edit().iter_mut() {
            if f.prefill == node {
                f.answered[0] = None;
            }
            if f.decode == node {
                f.answered[1] = None;
            }
        }
    }

    /// The black-box canary check of one reply: every token must come from the
    /// request's own prompt (or be generated from it).
    fn canary(
        &self,
        req: RequestId,
        room: Option<RoomKey>,
        status: kvsim_engine::msg::Status,
        tokens: &[kvsim_engine::ids::Token],
        out: &mut Drafts,
    ) {
        for &t in tokens {
            if let Some(owner) = crate::canary::owner(t) {
                if owner != req {
                    let related = self
                        .rooms
                        .get()
                        .iter()
                        .find(|(_, f)| f.req == owner)
                        .map(|(k, _)| *k)
                        .into_iter()
                        .collect();
                    out.push(Draft {
                        related,
                        ..draft(Invariant::S3, room, format!(
                            "canary: the {status} reply to {req} echoes token {t:#010x} from the prompt of {owner}"
                        ))
                    });
                    return;
                }
            }
        }
    }

    /// A room use let go of pages on `node` (`from`: the state they must be in, when
    /// only one is legal).
    #[allow(clippy::too_many_arguments)]
    fn release(
        &mut self,
        node: NodeId,
        room: RoomKey,
        pages: &[PageTag],
        held: &[PageTag],
        unchecked: bool,
        from: Option<PageState>,
        out: &mut Drafts,
    ) {
        // Judge every page first, then change the node's record once for the batch.
        let mut held_sorted = held.to_vec();
        held_sorted.sort();
        let mut changes: Vec<(PageId, bool)> = Vec::with_capacity(pages.len());
        for t in pages {
            let Some(p) = self.book(node).and_then(|b| b.page(t.page)).cloned() else {
                continue;
            };
            let owned = p.owner == Some(room)
                && p.gen == t.gen
                && from.map_or(p.state.is_owned(), |s| p.state == s);
            if !owned {
                let what = if p.state == PageState::Free {
                    "it was already free: freed twice".to_string()
                } else {
                    format!(
                        "it is {} at {} for {}",
                        p.state,
                        p.gen,
                        p.owner.map_or("nobody".into(), |o| self.describe(o))
                    )
                };
                out.push(Draft {
                    related: p.owner.filter(|o| *o != room).into_iter().collect(),
                    pages: vec![(node, t.page)],
                    ..draft(
                        Invariant::S8,
                        Some(room),
                        format!(
                            "{node} freed page {t} for {}, but {what}",
                            self.describe(room)
                        ),
                    )
                });
                if !unchecked {
                    continue;
                }
            }
            let is_held = held_sorted.binary_search(t).is_ok();
            if !unchecked && !is_held && p.holders > 0 {
                out.push(Draft {
                    pages: vec![(node, t.page)],
                    ..draft(
                        Invariant::S2,
                        Some(room),
                        format!(
                            "{node} freed page {t} of {} while another path still held it",
                            self.describe(room)
                        ),
                    )
                });
            }
            let to_free = unchecked || !is_held;
            if to_free {
                self.freed(node, room, *t, out);
            }
            changes.push((t.page, to_free));
        }
        if let Some(mut b) = self.book_mut(node) {
            for (page, to_free) in changes {
                if let Some(p) = b.page_mut(page) {
                    p.owner = None;
                    if to_free {
                        p.state = PageState::Free;
                        p.holders = 0;
                    } else {
                        p.state = PageState::Draining;
                    }
                }
            }
        }
    }

    /// Liveness at the end of a run: everything answered, cleared, drained, returned.
    pub fn at_end(&self, outcome: EndOutcome, detail: &str, out: &mut Drafts) {
        if outcome == EndOutcome::Cut {
            return;
        }
        let first_room = self.rooms.get().first().map(|(k, _)| *k);
        if outcome != EndOutcome::Drained {
            out.push(Draft {
                related: self
                    .rooms
                    .get()
                    .iter()
                    .skip(1)
                    .take(2)
                    .map(|(k, _)| *k)
                    .collect(),
                ..draft(Invariant::L1, first_room, detail.to_string())
            });
        }
        if let Some(p) = self.pending.get().first() {
            let room = self
                .rooms
                .get()
                .iter()
                .find(|(_, f)| f.req == p.req)
                .map(|(k, _)| *k);
            out.push(draft(
                Invariant::L1,
                room,
                format!(
                    "{} request(s) never got a response (first: {})",
                    self.pending.get().len(),
                    p.req
                ),
            ));
        }
        for (i, b) in self.nodes.iter().enumerate() {
            let Some(b) = b.as_ref().map(Shared::get) else {
                continue;
            };
            let node = NodeId(i as u16);
            let flying: Vec<&WriteFacts> = self
                .writes
                .get()
                .iter()
                .filter(|w| w.id.writer == node)
                .collect();
            if !b.open.is_empty() || !flying.is_empty() {
                let room = b
                    .open
                    .first()
                    .copied()
                    .or(flying.first().map(|w| w.id.room));
                out.push(Draft {
                    related: b.open.iter().skip(1).take(2).copied().collect(),
                    ..draft(
                        Invariant::L1,
                        room,
                        format!(
                            "{node} still holds {} requests and {} KV writes in flight (first: {})",
                            b.open.len(),
                            flying.len(),
                            room.map_or("?".into(), |r| self.describe(r))
                        ),
                    )
                });
            }
            if !b.quarantined.is_empty() && !b.stopped {
                out.push(Draft {
                    related: b.quarantined.iter().skip(1).take(2).copied().collect(),
                    ..draft(
                        Invariant::L3,
                        b.quarantined.first().copied(),
                        format!(
                        "decode {node} still quarantines {} rooms and has not stopped (first: {})",
                        b.quarantined.len(),
                        self.describe(b.quarantined[0])
                    ),
                    )
                });
            }
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
            if !held.is_empty() {
                let owner = held.iter().find_map(|(_, p)| p.owner);
                let mut text = String::new();
                let _ = write!(
                    text,
                    "{node} has {} of {} pages not free at the end (first holder: {})",
                    held.len(),
                    b.pages.len() - 1,
                    owner.map_or("none: pages still draining".into(), |r| self.describe(r))
                );
                out.push(Draft {
                    pages: held.iter().take(8).map(|(p, _)| (node, *p)).collect(),
                    ..draft(Invariant::L4, owner, text)
                });
            }
        }
        if let Some((room, _)) = self.rooms.get().first() {
            out.push(Draft {
                related: self
                    .rooms
                    .get()
                    .iter()
                    .skip(1)
                    .take(2)
                    .map(|(k, _)| *k)
                    .collect(),
                ..draft(
                    Invariant::L2,
                    Some(*room),
                    format!(
                        "the router still has {} rooms open (first: {})",
                        self.rooms.get().len(),
                        self.describe(*room)
                    ),
                )
            });
        }
    }
}

/// Must `side` reject, at intake, a request of `prompt_len` tokens asking for
/// `max_new_tokens` more, paired with these prefill and decode nodes? Prefill holds
/// the prompt (a deployment that truncates serves an over-length prompt cut short);
/// decode holds the prompt and the reply. Each against its own `min(context, pool)`.
pub fn must_reject(
    h: &RunHeader,
    side: Side,
    prefill: NodeId,
    decode: NodeId,
    prompt_len: u64,
    max_new_tokens: u32,
) -> bool {
    match side {
        Side::Prefill => !h.allow_auto_truncate && prompt_len > h.limit(prefill),
        Side::Decode => prompt_len.saturating_add(u64::from(max_new_tokens)) > h.limit(decode),
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
    if true_len.is_some_and(|t| t != prompt_len) || sent_tokens != prompt_len {
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

/// S10: what is wrong with a 200 reply to `req` (a `prompt_len`-token canary prompt,
/// `max_new_tokens` asked for), or `None` when it is exactly what echo attention over
/// the request's own prompt yields: one token per step (there is no stop rule), token
/// `s` the prompt token at [`query_position`]`(s, max_new_tokens, prompt_len)`.
pub fn reply_error(
    req: RequestId,
    prompt_len: u64,
    max_new_tokens: u32,
    tokens: &[kvsim_engine::ids::Token],
) -> Option<String> {
    if tokens.len() as u64 != u64::from(max_new_tokens) {
        return Some(format!(
            "the 200 reply to {req} has {} tokens; it asked for {max_new_tokens}",
            tokens.len()
        ));
    }
    for (s, &got) in (0u32..).zip(tokens) {
        let q = query_position(s, max_new_tokens, prompt_len);
        let want = crate::canary::prompt_token(req, q);
        if got != want {
            return Some(format!(
                "token {s} of the 200 reply to {req} is {got:#010x}; echo attention over its own prompt (position {q}) yields {want:#010x}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn answered_ranges_merge_and_answer_membership() {
        let mut s = OracleState {
            nodes: Vec::new(),
            rooms: Shared::new(Vec::new()),
            writes: Shared::new(Vec::new()),
            pending: Shared::new(Vec::new()),
            answered: Shared::new(Vec::new()),
            index: WriteIndex::default(),
        };
        for r in [0u64, 2, 1, 5, 3, 4, 9] {
            assert!(!s.is_answered(RequestId(r)));
            s.answer(RequestId(r));
            assert!(s.is_answered(RequestId(r)));
        }
        assert_eq!(s.answered.get(), &vec![(0, 5), (9, 9)]);
        assert!(!s.is_answered(RequestId(7)));
    }

    #[test]
    fn a_half_answering_again_with_another_status_is_s6() {
        use crate::schema::ClockKind;
        use kvsim_engine::msg::Status;
        use kvsim_engine::world::Topology;
        let topo = Topology {
            prefill_pools: vec![8],
            decode_pools: vec![8],
        };
        let h = RunHeader::new("test", ClockKind::Simulated, &Default::default(), &topo);
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

    #[test]
    fn length_disagreement_names_the_mismatch() {
        assert!(length_disagreement(Some(4), 4, 2, 4, 2, true).is_none());
        assert!(length_disagreement(Some(7), 7, 4, 1, 1, false).is_some());
        assert!(length_disagreement(Some(4), 4, 2, 4, 1, true).is_some_and(|s| s.contains("pages")));
    }
}
