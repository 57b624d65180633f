//! `PageRecords`: the one record of page ownership a node decides with, whichever form
//! it takes.
//!
//! A node keeps exactly one ownership record. Under the simulator, the model checker
//! and the hand-stepped driver it is a [`PagePool`] (single-threaded, hashable); under
//! the hardware runtime it is a [`SharedRecord`], a handle on a [`SharedPool`] that the
//! node's transfer thread gates its KV writes with at the same time. The decode node
//! is generic over this trait, so its decisions and the transfer thread's gate read
//! the same facts: there is no second record that could disagree.
//!
//! Both forms journal their changes the same way ([`PageChange`], drained by the node
//! into trace events in order), move pages only through [`super::lifecycle`], and
//! report refusals in the same words (`tests/shared_vs_pool.rs` checks the two records
//! against each other, operation by operation, through this trait).

use super::landing::WriteGate;
use super::lifecycle::PageState;
use super::pool::{PageChange, PagePool, PageRecord};
use super::shared::{SharedPool, WriteGuard};
use crate::ids::{Generation, PageId, PageTag, RoomKey};
use crate::invariant::Violation;
use crate::trace::ReleaseKind;
use std::fmt;
use std::sync::Arc;

/// The owner's side of a node's page ownership record (the operations a node's
/// decisions take), implemented by [`PagePool`] and [`SharedRecord`].
pub trait PageRecords: WriteGate {
    /// A refusal, in the record's words.
    type Error: fmt::Display + fmt::Debug;

    /// Usable pages (page 0 excluded).
    fn capacity(&self) -> usize;
    /// The incarnation whose generations the record hands out.
    fn epoch(&self) -> u32;
    /// The record of one page as of now.
    fn page(&self, page: PageId) -> Option<PageRecord>;
    /// Is `tag` current and owned by `owner` right now?
    fn owns(&self, owner: RoomKey, tag: PageTag) -> bool;
    /// Allocate `n` pages to `owner`, all or nothing.
    fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, Self::Error>;
    /// Reserved -> Writing.
    fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error>;
    /// -> Ready.
    fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error>;
    /// The owner lets go (held pages drain).
    fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error>;
    /// The owner aborted while writes may land.
    fn quarantine(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error>;
    /// The writer's drain ack releases a quarantine.
    fn release_quarantined(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error>;
    /// Upstream's unchecked free (bug switches only).
    fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]);
    /// Hand every change journaled since the last call to `f`, oldest first.
    fn drain_changes(&mut self, f: impl FnMut(PageChange));
    /// Run `f` on the whole record as a [`PagePool`] (the pool itself, or a snapshot).
    fn with_pool<R>(&self, f: impl FnOnce(&PagePool) -> R) -> R;
    /// A fresh, full record of the same size for incarnation `epoch`, journaling.
    fn restarted(&self, epoch: u32) -> Self
    where
        Self: Sized;

    /// S1/S8 of the record ([`PagePool::invariants`]).
    fn invariants(&self) -> Result<(), Violation> {
        self.with_pool(PagePool::invariants)
    }
}

impl PageRecords for PagePool {
    type Error = super::pool::PoolError;

    fn capacity(&self) -> usize {
        let pages = PagePool::capacity(self);
        // The pool's shape, fixed at construction: debug only.
        debug_assert!(pages == 0 || PagePool::record(self, page_id(pages)).is_some());
        debug_assert!(PagePool::record(self, page_id(pages + 1)).is_none());
        pages
    }
    fn epoch(&self) -> u32 {
        let epoch = PagePool::epoch(self);
        let ends = [1, PagePool::capacity(self)].map(page_id);
        // Two sample pages and Generation's arithmetic, fixed at construction: debug only.
        debug_assert!(
            ends.iter()
                .all(|&p| PagePool::record(self, p).is_none_or(|r| r.gen.epoch() == epoch)),
            "every generation of the pool lies in its incarnation"
        );
        debug_assert!(Generation::first_of_epoch(epoch).epoch() == epoch);
        epoch
    }
    fn page(&self, page: PageId) -> Option<PageRecord> {
        let record = self.record(page).cloned();
        // Restates record()'s indexing: debug only.
        debug_assert_eq!(record.is_some(), in_range(page, PagePool::capacity(self)));
        assert!(record.as_ref().is_none_or(free_has_no_owner));
        record
    }
    fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        let owns = PagePool::owns(self, owner, tag);
        // Restates owns(), which needs a record: debug only.
        debug_assert!(!owns || in_range(tag.page, PagePool::capacity(self)));
        assert!(!owns || tag.gen.epoch() == PagePool::epoch(self));
        owns
    }
    fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, Self::Error> {
        let pages = PagePool::alloc(self, n, owner)?;
        assert_eq!(pages.len(), n, "all or nothing");
        assert!(pages.iter().all(|&t| PagePool::owns(self, owner, t)));
        Ok(pages)
    }
    fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::expect_write(self, owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Writing));
        assert!(tags.iter().all(|&t| PagePool::owns(self, owner, t)));
        Ok(())
    }
    fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::mark_ready(self, owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Ready));
        assert!(tags.iter().all(|&t| PagePool::owns(self, owner, t)));
        Ok(())
    }
    fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::release(self, owner, tags)?;
        assert!(all_in(self, tags, let_go));
        assert!(tags.iter().all(|&t| !PagePool::owns(self, owner, t)));
        Ok(())
    }
    fn quarantine(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::quarantine(self, owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Quarantined));
        assert!(all_in(self, tags, |r| r.owner == Some(owner)));
        Ok(())
    }
    fn release_quarantined(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::release_quarantined(self, owner, tags)?;
        assert!(all_in(self, tags, let_go));
        assert!(tags.iter().all(|&t| !PagePool::owns(self, owner, t)));
        Ok(())
    }
    fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]) {
        let before = self.free_count();
        PagePool::free_unchecked(self, room, tags);
        let named = tags
            .iter()
            .filter(|t| in_range(t.page, PagePool::capacity(self)));
        // Only bug switches reach free_unchecked: debug only.
        debug_assert_eq!(
            self.free_count(),
            before + named.count(),
            "every page is listed"
        );
        debug_assert!(all_in(self, tags, |r| r.state == PageState::Free));
    }
    fn drain_changes(&mut self, mut f: impl FnMut(PageChange)) {
        let mut drained = 0usize;
        self.take_changes().for_each(|c| {
            // O(pages squared) per change, over the whole journal: debug only.
            debug_assert!(moved_within(&c), "{c:?} names a page it did not move");
            drained += 1;
            f(c)
        });
        // Restates the drain and the journal switch: debug only.
        debug_assert_eq!(
            self.take_changes().len(),
            0,
            "the journal is empty once drained"
        );
        debug_assert!(
            drained == 0 || self.journaling(),
            "only a journaling pool journals"
        );
    }
    fn with_pool<R>(&self, f: impl FnOnce(&PagePool) -> R) -> R {
        let (pages, free) = (PagePool::capacity(self), self.free_count());
        let out = f(self);
        // A read through &self leaves the pool as it is, as its type says: debug only.
        debug_assert_eq!(
            PagePool::capacity(self),
            pages,
            "a read leaves the pool as it is"
        );
        debug_assert_eq!(self.free_count(), free);
        out
    }
    fn restarted(&self, epoch: u32) -> Self {
        let fresh = PagePool::with_epoch(self.capacity() as u32, self.page_size(), epoch).journal();
        // Restates the construction above: debug only.
        debug_assert_eq!(
            fresh.free_count(),
            PagePool::capacity(self),
            "a fresh pool is all free"
        );
        debug_assert_eq!(PagePool::epoch(&fresh), epoch);
        fresh
    }
}

/// A node's handle on its [`SharedPool`]: the owner's operations, journaled for the
/// node's trace, on the record that the node's transfer thread gates writes with
/// ([`SharedRecord::shared`]). Clone the `Arc`, never the record.
#[derive(Debug)]
pub struct SharedRecord {
    pool: Arc<SharedPool>,
    journal: Vec<PageChange>,
}

impl SharedRecord {
    pub fn new(pool: Arc<SharedPool>) -> Self {
        assert!(pool.page_size() > 0, "a record of pages of no tokens");
        assert!(pool.capacity() < u32::MAX as usize, "page ids are 32-bit");
        SharedRecord {
            pool,
            journal: Vec::new(),
        }
    }

    /// The record itself, for the transfer thread's gate.
    pub fn shared(&self) -> &Arc<SharedPool> {
        // The node's handle and the transfer thread's share one record, never a copy.
        // Restates Arc and the constructor: debug only.
        debug_assert!(Arc::strong_count(&self.pool) >= 1);
        debug_assert!(self.pool.page_size() > 0);
        &self.pool
    }
}

impl WriteGate for SharedRecord {
    type Guard<'a> = WriteGuard<'a>;

    fn admit(&self, room: RoomKey, t: PageTag) -> Result<WriteGuard<'_>, String> {
        self.shared().admit(room, t)
    }
}

impl PageRecords for SharedRecord {
    type Error = super::shared::SharedError;

    fn capacity(&self) -> usize {
        let pages = self.pool.capacity();
        // The record's shape, fixed at construction: debug only.
        debug_assert!(pages == 0 || self.pool.record(page_id(pages)).is_some());
        debug_assert!(self.pool.record(page_id(pages + 1)).is_none());
        pages
    }
    fn epoch(&self) -> u32 {
        let epoch = self.pool.epoch();
        let ends = [1, self.pool.capacity()].map(page_id);
        // Two sample pages and Generation's arithmetic, fixed at construction: debug only.
        debug_assert!(
            ends.iter()
                .all(|&p| self.pool.tag(p).is_none_or(|t| t.gen.epoch() == epoch)),
            "every generation of the record lies in its incarnation"
        );
        debug_assert!(Generation::first_of_epoch(epoch).epoch() == epoch);
        epoch
    }
    fn page(&self, page: PageId) -> Option<PageRecord> {
        let record = self.pool.record(page);
        // Restates record()'s range: debug only.
        debug_assert_eq!(record.is_some(), in_range(page, self.pool.capacity()));
        assert!(record.as_ref().is_none_or(free_has_no_owner));
        record
    }
    fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        let owns = self.pool.owns(owner, tag);
        // Restates owns(), which needs a record: debug only.
        debug_assert!(!owns || in_range(tag.page, self.pool.capacity()));
        assert!(!owns || tag.gen.epoch() == self.pool.epoch());
        owns
    }
    fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, Self::Error> {
        let pages = self.pool.alloc(n, owner)?;
        assert_eq!(pages.len(), n, "all or nothing");
        assert!(pages.iter().all(|&t| self.pool.owns(owner, t)));
        self.journal.push(PageChange::Reserved {
            room: owner,
            pages: pages.clone(),
        });
        Ok(pages)
    }
    fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        self.pool.expect_write(owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Writing));
        assert!(tags.iter().all(|&t| self.pool.owns(owner, t)));
        self.journal.push(PageChange::ExpectWrite {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        self.pool.mark_ready(owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Ready));
        assert!(tags.iter().all(|&t| self.pool.owns(owner, t)));
        self.journal.push(PageChange::Ready {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        let held = self.pool.release_held(owner, tags)?;
        // A page left Draining may go Free at once on the transfer thread: both let go.
        assert!(all_in(self, tags, let_go));
        // O(held x tags): debug only.
        debug_assert!(
            held.iter().all(|h| tags.contains(h)),
            "only released pages drain"
        );
        self.journal.push(PageChange::Released {
            room: owner,
            pages: tags.to_vec(),
            how: ReleaseKind::Owner,
            held,
        });
        Ok(())
    }
    fn quarantine(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        self.pool.quarantine(owner, tags)?;
        assert!(all_in(self, tags, |r| r.state == PageState::Quarantined));
        assert!(all_in(self, tags, |r| r.owner == Some(owner)));
        self.journal.push(PageChange::Quarantined {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn release_quarantined(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        let held = self.pool.release_quarantined_held(owner, tags)?;
        assert!(all_in(self, tags, let_go));
        // O(held x tags): debug only.
        debug_assert!(
            held.iter().all(|h| tags.contains(h)),
            "only released pages drain"
        );
        self.journal.push(PageChange::QuarantineReleased {
            room: owner,
            pages: tags.to_vec(),
            held,
        });
        Ok(())
    }
    fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]) {
        let before = self.pool.free_count();
        self.pool.free_unchecked(tags);
        // The transfer thread may free a draining page meanwhile: the list only grows.
        let named = tags
            .iter()
            .filter(|t| in_range(t.page, self.pool.capacity()));
        // Only bug switches reach free_unchecked: debug only.
        debug_assert!(
            self.pool.free_count() >= before + named.count(),
            "every page is listed"
        );
        debug_assert!(all_in(self, tags, |r| r.state == PageState::Free));
        self.journal.push(PageChange::Released {
            room,
            pages: tags.to_vec(),
            how: ReleaseKind::Unchecked,
            held: Vec::new(),
        });
    }
    fn drain_changes(&mut self, f: impl FnMut(PageChange)) {
        // O(journal): debug only.
        debug_assert!(
            self.journal.iter().all(moved_within),
            "a change names a page it did not move"
        );
        self.journal.drain(..).for_each(f);
        // Restates the drain: debug only.
        debug_assert!(self.journal.is_empty(), "the journal is empty once drained");
    }
    fn with_pool<R>(&self, f: impl FnOnce(&PagePool) -> R) -> R {
        let snapshot = self.pool.snapshot();
        // Restates snapshot(): debug only.
        debug_assert_eq!(snapshot.capacity(), self.pool.capacity());
        debug_assert_eq!(snapshot.epoch(), self.pool.epoch());
        f(&snapshot)
    }
    fn restarted(&self, epoch: u32) -> Self {
        let fresh = SharedRecord::new(Arc::new(SharedPool::with_epoch(
            self.pool.capacity() as u32,
            self.pool.page_size(),
            epoch,
        )));
        // Restates the construction above: debug only.
        debug_assert_eq!(
            fresh.pool.free_count(),
            self.pool.capacity(),
            "a fresh record is all free"
        );
        debug_assert_eq!(fresh.pool.epoch(), epoch);
        fresh
    }
}

/// Page `n`.
fn page_id(n: usize) -> PageId {
    assert!(n <= u32::MAX as usize, "page ids are 32-bit");
    PageId(n as u32)
}

/// Is `page` one of a record's `capacity` usable pages (page 0 is padding)?
fn in_range(page: PageId, capacity: usize) -> bool {
    page.0 >= 1 && page.0 as usize <= capacity
}

/// S1: a page on the free list belongs to no room use.
fn free_has_no_owner(r: &PageRecord) -> bool {
    r.state != PageState::Free || r.owner.is_none()
}

/// The owner let go of the page: free, or draining under a holder, owned by no one.
fn let_go(r: &PageRecord) -> bool {
    matches!(r.state, PageState::Free | PageState::Draining) && r.owner.is_none()
}

/// Every page of `tags` has a record and `holds` of it.
fn all_in(rec: &impl PageRecords, tags: &[PageTag], holds: impl Fn(&PageRecord) -> bool) -> bool {
    tags.iter()
        .all(|t| rec.page(t.page).is_some_and(|r| holds(&r)))
}

/// A change's pages still held (or freed by an unhold) are among the pages it moved.
fn moved_within(c: &PageChange) -> bool {
    match c {
        PageChange::Released { pages, held, .. }
        | PageChange::QuarantineReleased { pages, held, .. } => {
            held.iter().all(|h| pages.contains(h))
        }
        PageChange::Unheld { pages, freed } => freed.iter().all(|f| pages.contains(f)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both records refuse a remote write into a page whose transfer was accepted,
    /// take it while the transfer is open and again once the room is quarantined.
    #[test]
    fn a_write_into_a_ready_page_is_refused_by_both_records() {
        fn check<R: PageRecords>(mut r: R) {
            let room = RoomKey::new(1, 1);
            let tags = r.alloc(1, room).unwrap();
            r.expect_write(room, &tags).unwrap();
            assert!(r.admit(room, tags[0]).is_ok());
            r.mark_ready(room, &tags).unwrap();
            assert_eq!(
                r.admit(room, tags[0]).err(),
                Some("page is Ready".to_string())
            );
            r.quarantine(room, &tags).unwrap();
            assert!(r.admit(room, tags[0]).is_ok());
        }
        check(PagePool::new(4, 16));
        check(SharedRecord::new(Arc::new(SharedPool::new(4, 16))));
    }
}
