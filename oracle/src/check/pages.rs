//! The pages checker: per node, every page's lifecycle state, generation, owner,
//! holders and provenance (who wrote its slots), plus the node's open halves, its
//! quarantines and whether it stopped itself; the node books of the oracle.
//!
//! It judges the page rules: a page handed to a second room use or moved against the
//! lifecycle table (S1), a free by a non-owner or a second free (S8), a write into a
//! page its room lost, a send of a page its room does not own, a free under another
//! path's hold, a stray landing judged by its effect (S2), a read of slots the room
//! never wrote (S3). Invariant: page 0 is padding and never changes; a node's pool
//! keeps its size across restarts; the open halves and quarantines are sorted sets.

pub use super::book::{NodeBook, PageFact, Provenance};
use super::rooms::Rooms;
use super::writes::Writes;
use super::{draft, Drafts};
use crate::schema::RunHeader;
use crate::shared::{Edit, Shared};
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::{lifecycle, PageOp, PageState};
use kvsim_engine::node::Role;
use kvsim_engine::trace::Side;
use std::sync::Arc;

/// The node books. Index = node id (the client and unknown ids have no book); each
/// book is shared and hashed as one part.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Pages {
    /// Shared with the parent state's copy (a model state's clone copies no list);
    /// hashes and compares as the slice it holds.
    pub nodes: Arc<[Option<Shared<NodeBook>>]>,
}

/// Guard of a book being changed: checks the book's invariants when it goes.
pub struct BookEdit<'a>(Edit<'a, NodeBook>);

impl std::ops::Deref for BookEdit<'_> {
    type Target = NodeBook;
    fn deref(&self) -> &NodeBook {
        &self.0
    }
}
impl std::ops::DerefMut for BookEdit<'_> {
    fn deref_mut(&mut self) -> &mut NodeBook {
        &mut self.0
    }
}
impl Drop for BookEdit<'_> {
    fn drop(&mut self) {
        self.0.check();
    }
}

/// Insert `room` in the sorted set `set` (no change if it is there).
fn insert_sorted(set: &mut Vec<RoomKey>, room: RoomKey) {
    if let Err(i) = set.binary_search(&room) {
        set.insert(i, room);
    }
}

/// Remove `room` from the sorted set `set` (no change if it is not there).
fn remove_sorted(set: &mut Vec<RoomKey>, room: RoomKey) {
    if let Ok(i) = set.binary_search(&room) {
        set.remove(i);
    }
}

impl Pages {
    /// The same books, shared (see [`OracleState::same_parts`]).
    pub(crate) fn same_parts(&self, other: &Pages) -> bool {
        Arc::ptr_eq(&self.nodes, &other.nodes)
    }

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
        Pages {
            nodes: nodes.into(),
        }
    }

    pub fn book(&self, n: NodeId) -> Option<&NodeBook> {
        self.nodes
            .get(n.0 as usize)
            .and_then(Option::as_ref)
            .map(Shared::get)
    }

    fn book_mut(&mut self, n: NodeId) -> Option<BookEdit<'_>> {
        // The list is copied (if shared) only when there is a book to edit.
        self.nodes.get(n.0 as usize)?.as_ref()?;
        Arc::make_mut(&mut self.nodes)[n.0 as usize]
            .as_mut()
            .map(|s| BookEdit(s.edit()))
    }

    /// Every node with a book, with its id.
    pub fn books(&self) -> impl Iterator<Item = (NodeId, &NodeBook)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((NodeId(i as u16), b.as_ref()?.get())))
    }

    /// The incarnation `node` is in (`None`: no book).
    pub fn epoch(&self, node: NodeId) -> Option<u32> {
        self.book(node).map(|b| b.epoch)
    }

    /// The side a node serves (`None` for the router and unknown nodes).
    pub fn side_of(&self, node: NodeId) -> Option<Side> {
        match self.book(node)?.role {
            Role::Prefill => Some(Side::Prefill),
            Role::Decode => Some(Side::Decode),
            Role::Router => None,
        }
    }

    /// Is `room`'s half on `node` admitted and not answered?
    pub fn is_open(&self, node: NodeId, room: RoomKey) -> bool {
        self.book(node)
            .is_some_and(|b| b.open.binary_search(&room).is_ok())
    }

    /// `node` admitted its half of `room`.
    pub fn admitted(&mut self, node: NodeId, room: RoomKey) {
        if self
            .book(node)
            .is_some_and(|b| b.open.binary_search(&room).is_err())
        {
            if let Some(mut b) = self.book_mut(node) {
                insert_sorted(&mut b.open, room);
            }
        }
    }

    /// `node` answered its half of `room`.
    pub fn answered(&mut self, node: NodeId, room: RoomKey) {
        if self.is_open(node, room) {
            if let Some(mut b) = self.book_mut(node) {
                remove_sorted(&mut b.open, room);
            }
        }
    }

    /// `node` stopped itself loudly.
    pub fn stopped(&mut self, node: NodeId) {
        if let Some(mut b) = self.book_mut(node) {
            b.stopped = true;
        }
    }

    /// `node` crashed: it holds no half and no quarantine any more.
    pub fn crashed(&mut self, node: NodeId) {
        if let Some(mut b) = self.book_mut(node) {
            b.open.clear();
            b.quarantined.clear();
        }
    }

    /// `node` restarted in `epoch`: a new incarnation, an empty pool in the new epoch.
    /// KV memory is not zeroed, so what each page held (its provenance) stays.
    pub fn restarted(&mut self, node: NodeId, epoch: u32) {
        if let Some(mut b) = self.book_mut(node) {
            let fresh = NodeBook::new(b.role, b.pool_pages() as u32, epoch);
            let old = std::mem::replace(&mut *b, fresh);
            debug_assert_eq!(old.pages.len(), b.pages.len(), "a restart keeps the pool");
            for (p, o) in b.pages.iter_mut().zip(old.pages) {
                p.prov = o.prov;
            }
        }
    }

    /// What each node still does for `room`: the half it has not answered, the pages
    /// it still owns for it (quarantined pages are let go). Empty when every node is
    /// done with it (bounded cleanup, L6).
    pub fn still_working(&self, room: RoomKey) -> Vec<(NodeId, String)> {
        let mut out = Vec::new();
        for (node, b) in self.books() {
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

    /// The pages `node` has for `room`, at their generations.
    pub fn owned_by(&self, node: NodeId, room: RoomKey) -> Vec<PageTag> {
        self.book(node).map_or(Vec::new(), |b| {
            b.pages
                .iter()
                .enumerate()
                .filter(|(_, p)| p.owner == Some(room))
                .map(|(i, p)| PageTag {
                    page: PageId(i as u32),
                    gen: p.gen,
                })
                .collect()
        })
    }
}

/// The page rules, judged as the events come.
impl Pages {
    /// S1 when `node` hands page `t` to `room` though the page is not free at an older
    /// generation (run for each page of a reservation, before [`Pages::reserve`]).
    pub fn handed_out(
        &self,
        rooms: &Rooms,
        node: NodeId,
        room: RoomKey,
        t: PageTag,
        out: &mut Drafts,
    ) {
        match self.book(node).and_then(|b| b.page(t.page)) {
            Some(p) if p.state == PageState::Free && t.gen > p.gen => {}
            Some(p) => out.push(
                draft(
                    Invariant::S1,
                    Some(room),
                    format!(
                        "{node} handed page {t} to {}, but it is {} at {} for {}",
                        rooms.describe(room),
                        p.state,
                        p.gen,
                        p.owner.map_or("nobody".into(), |o| rooms.describe(o))
                    ),
                )
                .with_related(p.owner.filter(|o| *o != room))
                .on_page(node, t.page),
            ),
            None => out.push(draft(
                Invariant::S1,
                Some(room),
                format!(
                    "{node} handed page {t}, which is not a pool page, to {}",
                    rooms.describe(room)
                ),
            )),
        }
    }

    /// Record a reservation: one change of the node's book for the whole batch.
    pub fn reserve(&mut self, node: NodeId, room: RoomKey, pages: &[PageTag]) {
        if let Some(mut b) = self.book_mut(node) {
            for t in pages {
                if let Some(p) = b.page_mut(t.page) {
                    p.state = PageState::Reserved;
                    p.gen = t.gen;
                    p.owner = Some(room);
                    p.holders = 0;
                }
            }
        }
    }

    /// Move pages of `room` on `node` by `op` (S1 when the record would not allow it).
    pub fn mark(
        &mut self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
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
            out.push(
                draft(
                    Invariant::S1,
                    Some(room),
                    format!(
                        "{node} moved page {t} of {} by {op:?}, but {why}",
                        rooms.describe(room)
                    ),
                )
                .on_page(node, t.page),
            );
        }
    }

    /// `node` quarantined `room`'s pages (S1 as [`Pages::mark`]).
    pub fn quarantine(
        &mut self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        out: &mut Drafts,
    ) {
        self.mark(rooms, (node, room), pages, PageOp::Quarantine, out);
        if let Some(mut b) = self.book_mut(node) {
            insert_sorted(&mut b.quarantined, room);
        }
    }

    /// `node` lifted the quarantine of `room` (its pages are released next).
    pub fn lift_quarantine(&mut self, node: NodeId, room: RoomKey) {
        if let Some(mut b) = self.book_mut(node) {
            remove_sorted(&mut b.quarantined, room);
        }
    }

    /// `node` took a hold on `pages` (S1 when no room use owns one at that generation).
    pub fn hold(&mut self, node: NodeId, pages: &[PageTag], out: &mut Drafts) {
        let mut bad = None;
        if let Some(mut b) = self.book_mut(node) {
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
            out.push(
                draft(
                    Invariant::S1,
                    None,
                    format!(
                        "{node} took a hold on page {t}, which no room use owns at that generation"
                    ),
                )
                .on_page(node, t.page),
            );
        }
    }

    /// `node` let go of its holds on `pages`; `freed` went back to Free with them.
    pub fn unhold(&mut self, node: NodeId, pages: &[PageTag], freed: &[PageTag]) {
        if let Some(mut b) = self.book_mut(node) {
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

    /// `node` wrote `tokens` tokens of `room`'s KV from position `start` into `pages`:
    /// S2 when one of them is no longer the room's; the provenance follows the write.
    pub fn written(
        &mut self,
        rooms: &Rooms,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        (start, tokens): (u64, u64),
        out: &mut Drafts,
    ) {
        let lost = self
            .book(node)
            .and_then(|b| pages.iter().find(|t| !b.owns(room, t)));
        if let Some(t) = lost {
            let now = rooms.describe(room);
            out.push(
                draft(
                    Invariant::S2,
                    Some(room),
                    format!(
                        "{node} wrote KV of {now} into page {t}, which its room no longer owns"
                    ),
                )
                .on_page(node, t.page),
            );
        }
        let Some(mut b) = self.book_mut(node) else {
            return;
        };
        for (t, slots) in page_runs(pages, u64::from(h.page_size), start, tokens) {
            if let Some(p) = b.page_mut(t.page) {
                p.prov = p.prov.after_writes(room, slots);
                // Written by `room` now: its own bytes, not a stray landing's.
                p.stray = false;
            }
        }
    }

    /// `node` zeroed `pages`: they hold nobody's KV.
    pub fn zeroed(&mut self, node: NodeId, pages: &[PageId]) {
        if let Some(mut b) = self.book_mut(node) {
            for &pg in pages {
                if let Some(p) = b.page_mut(pg) {
                    p.prov = Provenance::default();
                    p.stray = false;
                }
            }
        }
    }

    /// Prefill `node` sends `src` for `room`: S2 when its room does not own one of
    /// them. Returns the provenance of each source page, which the write carries.
    pub fn sending(
        &self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        src: &[PageTag],
        out: &mut Drafts,
    ) -> std::sync::Arc<[Provenance]> {
        let book = self.book(node);
        if let Some(t) = src.iter().find(|t| !book.is_some_and(|b| b.owns(room, t))) {
            out.push(
                draft(
                    Invariant::S2,
                    Some(room),
                    format!(
                        "prefill {node} sends page {t} for {}, which its room does not own",
                        rooms.describe(room)
                    ),
                )
                .on_page(node, t.page),
            );
        }
        src.iter()
            .map(|t| {
                book.and_then(|b| b.page(t.page))
                    .map(|p| p.prov)
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// Landings, reads and releases: the page rules that meet the writes in flight.
impl Pages {
    /// S2 on a write's destination: the first page that no longer belongs to its room.
    pub fn write_target_breach(
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

    /// A KV write of `room` landed in `dst` on `node`, carrying `prov` for each page
    /// (`None`: the send is not in the trace, a trace of the receiver only, and the
    /// write is taken as the room's, every slot). Pages the write reached although they
    /// are not its room use's (nothing checked it before it landed: a one-sided
    /// transport, or no landing gate) hold stray bytes, judged by their effect.
    pub fn landed(
        &mut self,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        dst: &[PageTag],
        prov: Option<&[Provenance]>,
    ) {
        let strays: Vec<PageTag> = dst
            .iter()
            .filter(|t| self.write_target_breach(node, room, &[**t]).is_some())
            .copied()
            .collect();
        let whole = Provenance {
            writer: Some(room),
            lo: 0,
            hi: h.page_size,
        };
        if let Some(mut b) = self.book_mut(node) {
            for (i, t) in dst.iter().enumerate() {
                let prov = prov.and_then(|p| p.get(i).copied()).unwrap_or(whole);
                if let Some(p) = b.page_mut(t.page) {
                    p.prov = p.prov.after_landing(prov);
                    p.stray = strays.contains(t) || (p.stray && p.prov.writer != Some(room));
                }
            }
        }
    }

    /// Decode `node`'s landing gate refused `write` aimed at `dst`: S2 detected when a
    /// page of `dst` is no longer the room's (nothing landed).
    pub fn landing_refused(
        &self,
        rooms: &Rooms,
        node: NodeId,
        write: kvsim_engine::ids::WriteId,
        dst: &[PageTag],
        out: &mut Drafts,
    ) {
        let room = write.room;
        if let Some((t, now)) = self.write_target_breach(node, room, dst) {
            out.push(draft(Invariant::S2, Some(room), format!(
                    "decode {node}'s landing-time tag check refused the KV write {write} for {} aimed at page {t} (it is {now}): nothing landed",
                    rooms.describe(room)
                )).detected(Some("landing_gate")).on_page(node, t.page));
        }
    }

    /// S2 judged by its effect: `room` on `node` reads (`detected_by` `None`), or a
    /// defense refuses (the read-time tag check, verification), `pages`, and one of them
    /// holds stray bytes (a write that landed unchecked when the page was not its
    /// room's, `PageFact::stray`). A read that accepts them is the violation; a refusal
    /// is the detection. Either way the bytes have had their one effect: the flag clears.
    pub fn stray_effect(
        &mut self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        // Stray bytes are rare: a read over pages that hold none changes nothing, so
        // the book is not copied (the model checker shares it between states).
        let any_stray = self.book(node).is_some_and(|b| {
            pages
                .iter()
                .any(|t| b.page(t.page).is_some_and(|p| p.stray))
        });
        if !any_stray {
            return;
        }
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
        let whose = writer.map_or("an unknown room use".to_string(), |w| rooms.describe(w));
        let what = match detected_by {
            None => format!("decode {node} read it for {}", rooms.describe(room)),
            Some(d) => format!(
                "{d} refused it for {} before any of it was read",
                rooms.describe(room)
            ),
        };
        out.push(draft(Invariant::S2, Some(room), format!(
                "a KV write of {whose} landed unchecked in decode {node} page {t} after the page left that room (no landing gate), and {what}"
            )).detected(detected_by).with_related(writer).on_page(node, t.page));
    }

    /// S3: the first attended page whose slots `0..need` were not all written by
    /// `room`, with its provenance.
    fn isolation_breach(
        &self,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
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

    /// S3 on a read of `seq_len` positions of `room` over `pages` on decode `node`
    /// (`detected_by`: the defense that refused the read, if one did).
    pub fn read(
        &self,
        (rooms, h): (&Rooms, &RunHeader),
        (node, room): (NodeId, RoomKey),
        (seq_len, pages): (u64, &[PageTag]),
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        let Some((i, t, prov)) = self.isolation_breach(h, (node, room), seq_len, pages) else {
            return;
        };
        let whose = match prov.writer {
            Some(w) if w == room => format!("only slots {}..{} are its own", prov.lo, prov.hi),
            Some(w) => format!("it holds KV written by {}", rooms.describe(w)),
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
        let detail = format!(
            "decode {node} {verb} page {t} (positions {start}..{end}) for {} but {whose}",
            rooms.describe(room)
        );
        out.push(
            draft(Invariant::S3, Some(room), detail)
                .detected(detected_by)
                .with_related(prov.writer.filter(|w| *w != room))
                .on_page(node, t.page),
        );
    }
}

/// The slots that positions `start..start + tokens` fill in each of `pages` (`ps`
/// slots a page, position `pos` in page `pos / ps`), page by page in order; the run
/// stops at the first position past the page list.
fn page_runs(
    pages: &[PageTag],
    ps: u64,
    start: u64,
    tokens: u64,
) -> impl Iterator<Item = (&PageTag, std::ops::Range<u32>)> {
    let end = start.saturating_add(tokens);
    let first = start.checked_div(ps).map_or(usize::MAX, |i| i as usize);
    pages
        .iter()
        .enumerate()
        .skip(first)
        .map(move |(i, t)| {
            let lo = (i as u64 * ps).max(start);
            let hi = ((i as u64 + 1) * ps).min(end);
            (t, lo, hi)
        })
        .take_while(|&(_, lo, hi)| lo < hi)
        .map(move |(t, lo, hi)| (t, (lo % ps) as u32..((hi - 1) % ps) as u32 + 1))
}

/// How a room use lets go of pages (see [`Pages::release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release<'a> {
    /// Pages another path still holds: they drain instead of going back to Free.
    pub held: &'a [PageTag],
    /// Freed without the ownership check (`ReleaseKind::Unchecked`): every page goes
    /// back to Free, whatever it was.
    pub unchecked: bool,
    /// The state the pages must be in, when only one is legal.
    pub from: Option<PageState>,
}

impl Pages {
    /// A room use let go of pages on `node`: S8 for a page it does not own (a second
    /// free), S2 for a page freed under another path's hold or under a write still
    /// reading it ([`Writes::freed`]). Every page is judged first, then the node's book
    /// changes once for the batch.
    pub fn release(
        &mut self,
        (rooms, writes): (&Rooms, &Writes),
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        how: Release<'_>,
        out: &mut Drafts,
    ) {
        let mut held_sorted = how.held.to_vec();
        held_sorted.sort();
        let mut changes: Vec<(PageId, bool)> = Vec::with_capacity(pages.len());
        for t in pages {
            let Some(p) = self.book(node).and_then(|b| b.page(t.page)) else {
                continue;
            };
            let owned = p.owner == Some(room)
                && p.gen == t.gen
                && how.from.map_or(p.state.is_owned(), |s| p.state == s);
            if !owned {
                freed_unowned(rooms, (node, room), *t, p, out);
                if !how.unchecked {
                    continue;
                }
            }
            let is_held = held_sorted.binary_search(t).is_ok();
            if !how.unchecked && !is_held && p.holders > 0 {
                out.push(
                    draft(
                        Invariant::S2,
                        Some(room),
                        format!(
                            "{node} freed page {t} of {} while another path still held it",
                            rooms.describe(room)
                        ),
                    )
                    .on_page(node, t.page),
                );
            }
            let to_free = how.unchecked || !is_held;
            if to_free {
                writes.freed(rooms, node, room, *t, out);
            }
            changes.push((t.page, to_free));
        }
        self.apply_release(node, changes);
    }

    /// The book's side of a release: each page `(page, to_free)` loses its owner and
    /// goes back to Free (`to_free`) or drains until its holds go.
    fn apply_release(&mut self, node: NodeId, changes: Vec<(PageId, bool)>) {
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
}

/// S8: `node` freed page `t` for `room`, which the room does not own (`p` is what the
/// page is).
fn freed_unowned(
    rooms: &Rooms,
    (node, room): (NodeId, RoomKey),
    t: PageTag,
    p: &PageFact,
    out: &mut Drafts,
) {
    let what = if p.state == PageState::Free {
        "it was already free: freed twice".to_string()
    } else {
        format!(
            "it is {} at {} for {}",
            p.state,
            p.gen,
            p.owner.map_or("nobody".into(), |o| rooms.describe(o))
        )
    };
    out.push(
        draft(
            Invariant::S8,
            Some(room),
            format!(
                "{node} freed page {t} for {}, but {what}",
                rooms.describe(room)
            ),
        )
        .with_related(p.owner.filter(|o| *o != room))
        .on_page(node, t.page),
    );
}
