//! How a room use lets go of pages ([`Release`], [`Pages::release`]): S8 for a free
//! by a non-owner or a second free, S2 for a free under another path's hold or under
//! a write still reading it. It does not judge landings or reads
//! ([`crate::check::pages::landing`]).

use crate::check::book::PageFact;
use crate::check::pages::nodes::Pages;
use crate::check::rooms::Rooms;
use crate::check::writes::Writes;
use crate::check::{draft, Drafts};
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::PageState;

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
                    p.landed = false;
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
