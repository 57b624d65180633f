//! The page rules judged as a page moves through its lifecycle on one node: handing
//! out, reserving, marking, quarantines, holds, writes, zeroing and sends (S1, S2,
//! S8). It does not judge landings, reads or releases
//! ([`crate::check::pages::landing`], [`crate::check::pages::release`]).

use crate::check::book::Provenance;
use crate::check::pages::nodes::{insert_sorted, remove_sorted, Pages};
use crate::check::rooms::Rooms;
use crate::check::{draft, Drafts};
use crate::schema::RunHeader;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::{lifecycle, PageOp, PageState};

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
                    p.landed = false;
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
                    Ok(to) if p.gen == t.gen && p.owner == Some(room) => {
                        p.state = to;
                        p.landed &= matches!(to, PageState::Writing | PageState::Ready);
                    }
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
                        p.landed = false;
                    }
                }
            }
        }
    }

    /// `node` wrote `tokens` tokens of `room`'s KV from offset `start` into `pages`,
    /// meant for the sequence positions from `pos` where the trace says: S2 when one of
    /// them is no longer the room's; the provenance follows the write, each page with
    /// the position its slot 0 was meant for.
    pub fn written(
        &mut self,
        rooms: &Rooms,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        (start, tokens, pos): (u64, u64, Option<u64>),
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
        let ps = u64::from(h.page_size);
        for (i, (t, slots)) in page_runs(pages, ps, start, tokens).enumerate() {
            // Page `first + i` of the list holds offsets from `(first + i) * ps`, and
            // offset `start` is position `pos`.
            let first = start / ps.max(1);
            let offset = (first + i as u64) * ps;
            let at = pos.and_then(|pos| (pos + offset).checked_sub(start));
            if let Some(p) = b.page_mut(t.page) {
                p.prov = p.prov.after_writes(room, at, slots);
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
