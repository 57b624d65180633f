//! `PagePool`: one node's paged KV allocator with ownership tags.
//!
//! It re-creates SGLang's `PagedTokenToKVPoolAllocator` where that matters for safety:
//! a fixed number of pages sized once at startup, page 0 reserved as padding, and
//! **LIFO reuse** (the page freed last is handed out first), which is exactly what
//! makes a stale page dangerous. Unlike upstream it records, per page, a lifecycle
//! state, an owner, a generation that changes on every allocation and a holder count,
//! and it moves a page only through the legal-transition table in
//! [`super::lifecycle`]. It never touches page contents (that is the `Gpu`'s job), and
//! it is not thread-safe.
//!
//! Invariant (checked by [`PagePool::invariants`]): every page other than page 0 is on
//! the free list exactly once and in state Free, or off it and in exactly one other
//! state with an owner (Reserved/Writing/Ready/Quarantined) or with holders (Draining).

use super::lifecycle::{
    check_hold, let_go_op, transition, Holders, IllegalTransition, PageOp, PageState,
};
use crate::ids::{Generation, NodeId, PageId, PageTag, RoomKey};
use crate::invariant::{Invariant, Violation};
use crate::trace::{ReleaseKind, TraceEvent};

/// A change of page records, as the pool journals it for its node to trace (see
/// [`PagePool::journal`]). One entry per pool operation, listing every page it moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageChange {
    Reserved {
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    ExpectWrite {
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    Ready {
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    Released {
        room: RoomKey,
        pages: Vec<PageTag>,
        how: ReleaseKind,
        held: Vec<PageTag>,
    },
    Quarantined {
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    QuarantineReleased {
        room: RoomKey,
        pages: Vec<PageTag>,
        held: Vec<PageTag>,
    },
    Held {
        pages: Vec<PageTag>,
    },
    Unheld {
        pages: Vec<PageTag>,
        freed: Vec<PageTag>,
    },
}

impl PageChange {
    /// The trace event of this change on `node`. A quarantine release names the room use
    /// whose drain ack caused it (`acked`; the released room itself when `None`).
    pub fn into_event(self, node: NodeId, acked: Option<RoomKey>) -> TraceEvent {
        match self {
            PageChange::Reserved { room, pages } => TraceEvent::PagesReserved { node, room, pages },
            PageChange::ExpectWrite { room, pages } => {
                TraceEvent::PagesExpectWrite { node, room, pages }
            }
            PageChange::Ready { room, pages } => TraceEvent::PagesReady { node, room, pages },
            PageChange::Released {
                room,
                pages,
                how,
                held,
            } => TraceEvent::PagesReleased {
                node,
                room,
                pages,
                how,
                held,
            },
            PageChange::Quarantined { room, pages } => {
                TraceEvent::Quarantined { node, room, pages }
            }
            PageChange::QuarantineReleased { room, pages, held } => {
                TraceEvent::QuarantineReleased {
                    node,
                    room,
                    pages,
                    acked: acked.unwrap_or(room),
                    held,
                }
            }
            PageChange::Held { pages } => TraceEvent::PagesHeld { node, pages },
            PageChange::Unheld { pages, freed } => TraceEvent::PagesUnheld { node, pages, freed },
        }
    }
}

/// The journal of changes not yet traced. It is part of a pool's value but not of its
/// state: nodes drain it within the handler call that filled it, so between calls it is
/// empty, and `Hash`/`Eq` ignore it.
#[derive(Clone, Debug, Default)]
struct Journal {
    on: bool,
    changes: Vec<PageChange>,
}

impl std::hash::Hash for Journal {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl PartialEq for Journal {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Journal {}

/// The ownership record of one page.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PageRecord {
    pub state: PageState,
    /// Changes on every allocation; a [`PageTag`] with another generation is stale.
    pub gen: Generation,
    /// The room use that owns the page (also kept while quarantined).
    pub owner: Option<RoomKey>,
    /// Paths other than the owner that hold the page (a send reading it, an offload).
    pub holders: u16,
}

/// An operating error of the pool: a caller asked for something the record refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("pool exhausted: {requested} pages requested, {free} free")]
    Exhausted { requested: usize, free: usize },
    #[error("stale page tag {tag}: the page now has generation {current}")]
    StaleTag { tag: PageTag, current: Generation },
    #[error("page {page} is not owned by {caller} (owner: {owner:?})")]
    NotOwner {
        page: PageId,
        caller: RoomKey,
        owner: Option<RoomKey>,
    },
    #[error("page {page} is not a pool page (pool has pages 1..={last})")]
    OutOfRange { page: PageId, last: u32 },
    #[error("page {tag} has no holder to release")]
    NotHeld { tag: PageTag },
    #[error("page {page}: {source}")]
    Illegal {
        page: PageId,
        source: IllegalTransition,
    },
    /// The tag is current, but its owner has let go (or aborted): KV arriving for it
    /// now is unwanted and is not written. Only the shared record's write gate
    /// ([`crate::kv::shared::SharedPool::begin_write`]) refuses this way.
    #[error("page {tag} is {state}: only an owned page accepts a write")]
    NotWritable { tag: PageTag, state: PageState },
}

/// The paged allocator of one node.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PagePool {
    page_size: u32,
    /// Index 0 is the padding page and is never handed out.
    pages: Vec<PageRecord>,
    /// Stack of free pages; the last element is handed out next (LIFO reuse).
    free: Vec<PageId>,
    /// The incarnation of the node that owns the pool (0 until a restart).
    epoch: u32,
    journal: Journal,
}

impl PagePool {
    /// A pool of `pages` usable pages (ids `1..=pages`) of `page_size` tokens each.
    pub fn new(pages: u32, page_size: u32) -> Self {
        Self::with_epoch(pages, page_size, 0)
    }

    /// The pool of a node incarnation: every generation it hands out lies in `epoch`
    /// (see [`Generation::first_of_epoch`]), so a node restarted with a higher epoch
    /// never repeats a generation of an earlier incarnation.
    pub fn with_epoch(pages: u32, page_size: u32, epoch: u32) -> Self {
        assert!(page_size > 0, "EngineConfig validates page_size > 0");
        let mut records = Vec::with_capacity(pages as usize + 1);
        for _ in 0..=pages {
            records.push(PageRecord {
                state: PageState::Free,
                gen: Generation::first_of_epoch(epoch),
                owner: None,
                holders: 0,
            });
        }
        // Page 0 is padding: permanently "reserved" to nobody, never on the free list.
        records[0].state = PageState::Reserved;
        // Like upstream's `arange(1, n+1)` popped from the front: page 1 goes first.
        let free = (1..=pages).rev().map(PageId).collect();
        PagePool {
            page_size,
            pages: records,
            free,
            epoch,
            journal: Journal::default(),
        }
    }

    /// Journal every change from now on, for [`PagePool::take_changes`]. Nodes turn it
    /// on so that every page movement becomes a trace event in the order it happened.
    pub fn journal(mut self) -> Self {
        self.journal.on = true;
        self
    }

    /// Whether the pool journals its changes ([`PagePool::journal`]).
    pub fn journaling(&self) -> bool {
        self.journal.on
    }

    /// The changes made since the last call, oldest first.
    pub fn take_changes(&mut self) -> std::vec::Drain<'_, PageChange> {
        self.journal.changes.drain(..)
    }

    fn log(&mut self, change: PageChange) {
        if self.journal.on {
            self.journal.changes.push(change);
        }
    }

    /// Journal a hold. Holds come one page at a time: a run of them is one change,
    /// extended in place (no list is built when the journal is off or the run goes on).
    fn log_held(&mut self, tag: PageTag) {
        if !self.journal.on {
            return;
        }
        match self.journal.changes.last_mut() {
            Some(PageChange::Held { pages }) => pages.push(tag),
            _ => self
                .journal
                .changes
                .push(PageChange::Held { pages: vec![tag] }),
        }
    }

    /// Journal an unhold (and the page it freed, if any), merged into a run as
    /// [`PagePool::log_held`] does.
    fn log_unheld(&mut self, tag: PageTag, freed: Option<PageTag>) {
        if !self.journal.on {
            return;
        }
        match self.journal.changes.last_mut() {
            Some(PageChange::Unheld { pages, freed: f }) => {
                pages.push(tag);
                f.extend(freed);
            }
            _ => self.journal.changes.push(PageChange::Unheld {
                pages: vec![tag],
                freed: freed.into_iter().collect(),
            }),
        }
    }

    /// A pool assembled from the records of pages `1..` and a free list (next out last)
    /// taken elsewhere: the concurrent record's snapshot. Page 0's padding record is
    /// added here, as in [`PagePool::new`], so that the result compares with `==` to a
    /// pool that lived through the same operations, and is checked by the same
    /// [`PagePool::invariants`].
    pub(crate) fn from_parts(
        page_size: u32,
        records: Vec<PageRecord>,
        free: Vec<PageId>,
        epoch: u32,
    ) -> Self {
        let mut pages = Vec::with_capacity(records.len() + 1);
        pages.push(PageRecord {
            state: PageState::Reserved,
            gen: Generation::first_of_epoch(epoch),
            owner: None,
            holders: 0,
        });
        pages.extend(records);
        PagePool {
            page_size,
            pages,
            free,
            epoch,
            journal: Journal::default(),
        }
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// The incarnation whose generations this pool hands out.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Usable pages (page 0 excluded).
    pub fn capacity(&self) -> usize {
        self.pages.len() - 1
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The record of one page.
    pub fn record(&self, page: PageId) -> Option<&PageRecord> {
        if page.0 == 0 {
            return None;
        }
        self.pages.get(page.0 as usize)
    }

    /// Every page record with its id, page 0 excluded, in page order.
    pub fn records(&self) -> impl Iterator<Item = (PageId, &PageRecord)> {
        self.pages
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, r)| (PageId(i as u32), r))
    }

    /// The free list, next-to-be-handed-out last.
    pub fn free_list(&self) -> &[PageId] {
        &self.free
    }

    /// The current tag of a page.
    pub fn tag(&self, page: PageId) -> Option<PageTag> {
        self.record(page).map(|r| PageTag { page, gen: r.gen })
    }

    /// Is `tag` current (same generation) and owned by `owner` right now?
    pub fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        self.record(tag.page)
            .is_some_and(|r| r.gen == tag.gen && r.owner == Some(owner) && r.state.is_owned())
    }

    /// Allocate `n` pages to `owner`, all or nothing, most recently freed first.
    pub fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, PoolError> {
        if n > self.free.len() {
            return Err(PoolError::Exhausted {
                requested: n,
                free: self.free.len(),
            });
        }
        let mut tags = Vec::with_capacity(n);
        for _ in 0..n {
            let page = self.free.pop().expect("length checked above");
            let rec = &mut self.pages[page.0 as usize];
            rec.state = transition(rec.state, PageOp::Allocate)
                .map_err(|source| PoolError::Illegal { page, source })?;
            assert_eq!(rec.holders, 0, "a free page has no holders (S1)");
            rec.gen = Generation(rec.gen.0 + 1);
            assert_eq!(
                rec.gen.epoch(),
                self.epoch,
                "2^32 allocations of one page within one incarnation would leave its epoch"
            );
            rec.owner = Some(owner);
            tags.push(PageTag { page, gen: rec.gen });
        }
        assert_eq!(
            tags.len(),
            n,
            "an allocation hands out exactly what it was asked"
        );
        assert!(tags.iter().all(|t| self.owns(owner, *t)));
        self.log(PageChange::Reserved {
            room: owner,
            pages: tags.clone(),
        });
        Ok(tags)
    }

    /// Is the page of `tag` in `state` (at `tag`'s generation)?
    fn state_is(&self, tag: PageTag, state: PageState) -> bool {
        self.record(tag.page)
            .is_some_and(|r| r.gen == tag.gen && r.state == state)
    }

    fn checked(&mut self, tag: PageTag) -> Result<&mut PageRecord, PoolError> {
        let last = self.capacity() as u32;
        if tag.page.0 == 0 || tag.page.0 > last {
            return Err(PoolError::OutOfRange {
                page: tag.page,
                last,
            });
        }
        let rec = &mut self.pages[tag.page.0 as usize];
        if rec.gen != tag.gen {
            return Err(PoolError::StaleTag {
                tag,
                current: rec.gen,
            });
        }
        Ok(rec)
    }

    fn owned_mut(&mut self, owner: RoomKey, tag: PageTag) -> Result<&mut PageRecord, PoolError> {
        let rec = self.checked(tag)?;
        if rec.owner != Some(owner) {
            return Err(PoolError::NotOwner {
                page: tag.page,
                caller: owner,
                owner: rec.owner,
            });
        }
        Ok(rec)
    }

    fn apply(&mut self, owner: RoomKey, tag: PageTag, op: PageOp) -> Result<(), PoolError> {
        let rec = self.owned_mut(owner, tag)?;
        rec.state = transition(rec.state, op).map_err(|source| PoolError::Illegal {
            page: tag.page,
            source,
        })?;
        Ok(())
    }

    /// Check that every tag is owned by `owner` before any of them is changed, so a
    /// multi-page operation either applies to all pages or to none.
    fn precheck(&self, owner: RoomKey, tags: &[PageTag], op: PageOp) -> Result<(), PoolError> {
        let last = self.capacity() as u32;
        for &tag in tags {
            if tag.page.0 == 0 || tag.page.0 > last {
                return Err(PoolError::OutOfRange {
                    page: tag.page,
                    last,
                });
            }
            let rec = &self.pages[tag.page.0 as usize];
            if rec.gen != tag.gen {
                return Err(PoolError::StaleTag {
                    tag,
                    current: rec.gen,
                });
            }
            if rec.owner != Some(owner) {
                return Err(PoolError::NotOwner {
                    page: tag.page,
                    caller: owner,
                    owner: rec.owner,
                });
            }
            let op = let_go_op(op, Holders::counted(rec.holders));
            transition(rec.state, op).map_err(|source| PoolError::Illegal {
                page: tag.page,
                source,
            })?;
        }
        Ok(())
    }

    /// Announce remote writes into `tags` (Reserved -> Writing).
    pub fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), PoolError> {
        self.precheck(owner, tags, PageOp::ExpectWrite)?;
        for &t in tags {
            self.apply(owner, t, PageOp::ExpectWrite)?;
        }
        assert!(
            tags.iter().all(|t| self.owns(owner, *t)),
            "still the owner's"
        );
        assert!(tags.iter().all(|t| self.state_is(*t, PageState::Writing)));
        self.log(PageChange::ExpectWrite {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }

    /// The pages hold the owner's verified KV (-> Ready).
    pub fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), PoolError> {
        self.precheck(owner, tags, PageOp::MarkReady)?;
        for &t in tags {
            self.apply(owner, t, PageOp::MarkReady)?;
        }
        assert!(
            tags.iter().all(|t| self.owns(owner, *t)),
            "still the owner's"
        );
        assert!(tags.iter().all(|t| self.state_is(*t, PageState::Ready)));
        self.log(PageChange::Ready {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }

    /// Take a hold on a page for another path (a send reading it). Refused for a stale
    /// tag: a path can only hold the page generation it was given.
    pub fn hold(&mut self, tag: PageTag) -> Result<(), PoolError> {
        let rec = self.checked(tag)?;
        check_hold(rec.state).map_err(|source| PoolError::Illegal {
            page: tag.page,
            source,
        })?;
        rec.holders = rec
            .holders
            .checked_add(1)
            .expect("holder count bounded by in-flight limit");
        assert!(rec.holders >= 1 && rec.gen == tag.gen);
        assert_ne!(rec.state, PageState::Free, "a held page is never free");
        self.log_held(tag);
        Ok(())
    }

    /// Let go of a hold. A draining page whose last holder lets go returns to Free.
    pub fn unhold(&mut self, tag: PageTag) -> Result<(), PoolError> {
        let rec = self.checked(tag)?;
        if rec.holders == 0 {
            return Err(PoolError::NotHeld { tag });
        }
        rec.holders -= 1;
        let mut freed = None;
        if rec.holders == 0 && rec.state == PageState::Draining {
            rec.state = transition(rec.state, PageOp::LastHolderGone).map_err(|source| {
                PoolError::Illegal {
                    page: tag.page,
                    source,
                }
            })?;
            self.free.push(tag.page);
            freed = Some(tag);
        }
        assert!(freed.is_none() || self.free.last() == Some(&tag.page));
        assert!(
            self.free.len() <= self.capacity(),
            "the free list is a set of pages"
        );
        self.log_unheld(tag, freed);
        Ok(())
    }

    /// Pages owned by or quarantined for `owner`.
    pub fn pages_of(&self, owner: RoomKey) -> Vec<PageTag> {
        self.records()
            .filter(|(_, r)| r.owner == Some(owner))
            .map(|(page, r)| PageTag { page, gen: r.gen })
            .collect()
    }
}

mod audit;
mod release;
#[cfg(test)]
mod tests;
