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
use super::pool::{PageChange, PagePool, PageRecord};
use super::shared::SharedPool;
use crate::ids::{PageId, PageTag, RoomKey};
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
    type Error = super::PoolError;

    fn capacity(&self) -> usize {
        PagePool::capacity(self)
    }
    fn epoch(&self) -> u32 {
        PagePool::epoch(self)
    }
    fn page(&self, page: PageId) -> Option<PageRecord> {
        self.record(page).cloned()
    }
    fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        PagePool::owns(self, owner, tag)
    }
    fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, Self::Error> {
        PagePool::alloc(self, n, owner)
    }
    fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::expect_write(self, owner, tags)
    }
    fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::mark_ready(self, owner, tags)
    }
    fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::release(self, owner, tags)
    }
    fn quarantine(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::quarantine(self, owner, tags)
    }
    fn release_quarantined(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        PagePool::release_quarantined(self, owner, tags)
    }
    fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]) {
        PagePool::free_unchecked(self, room, tags)
    }
    fn drain_changes(&mut self, f: impl FnMut(PageChange)) {
        self.take_changes().for_each(f)
    }
    fn with_pool<R>(&self, f: impl FnOnce(&PagePool) -> R) -> R {
        f(self)
    }
    fn restarted(&self, epoch: u32) -> Self {
        PagePool::with_epoch(self.capacity() as u32, self.page_size(), epoch).journal()
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
        SharedRecord {
            pool,
            journal: Vec::new(),
        }
    }

    /// The record itself, for the transfer thread's gate.
    pub fn shared(&self) -> &Arc<SharedPool> {
        &self.pool
    }
}

impl PageRecords for SharedRecord {
    type Error = super::shared::SharedError;

    fn capacity(&self) -> usize {
        self.pool.capacity()
    }
    fn epoch(&self) -> u32 {
        self.pool.epoch()
    }
    fn page(&self, page: PageId) -> Option<PageRecord> {
        self.pool.record(page)
    }
    fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        self.pool.owns(owner, tag)
    }
    fn alloc(&mut self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, Self::Error> {
        let pages = self.pool.alloc(n, owner)?;
        self.journal.push(PageChange::Reserved {
            room: owner,
            pages: pages.clone(),
        });
        Ok(pages)
    }
    fn expect_write(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        self.pool.expect_write(owner, tags)?;
        self.journal.push(PageChange::ExpectWrite {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn mark_ready(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        self.pool.mark_ready(owner, tags)?;
        self.journal.push(PageChange::Ready {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        let held = self.pool.release_held(owner, tags)?;
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
        self.journal.push(PageChange::Quarantined {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }
    fn release_quarantined(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), Self::Error> {
        let held = self.pool.release_quarantined_held(owner, tags)?;
        self.journal.push(PageChange::QuarantineReleased {
            room: owner,
            pages: tags.to_vec(),
            held,
        });
        Ok(())
    }
    fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]) {
        self.pool.free_unchecked(tags);
        self.journal.push(PageChange::Released {
            room,
            pages: tags.to_vec(),
            how: ReleaseKind::Unchecked,
            held: Vec::new(),
        });
    }
    fn drain_changes(&mut self, f: impl FnMut(PageChange)) {
        self.journal.drain(..).for_each(f)
    }
    fn with_pool<R>(&self, f: impl FnOnce(&PagePool) -> R) -> R {
        f(&self.pool.snapshot())
    }
    fn restarted(&self, epoch: u32) -> Self {
        SharedRecord::new(Arc::new(SharedPool::with_epoch(
            self.pool.capacity() as u32,
            self.pool.page_size(),
            epoch,
        )))
    }
}
