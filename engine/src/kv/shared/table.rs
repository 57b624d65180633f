//! The shared record's data and its reads: the [`SharedPool`] itself (page words and
//! the book), its constructors, the queries that read it, its snapshot and invariant
//! check, and the locked helpers the other parts build on. Taking holds and the
//! owner's operations are in sibling modules.

use crate::ids::{Generation, PageId, PageTag, RoomKey};
use crate::invariant::Violation;
use crate::kv::lifecycle::PageState;
use crate::kv::pool::{PagePool, PageRecord, PoolError};
use crate::kv::shared::word::{Word, GENERATION_MAX};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use std::fmt;

/// An operating error of the shared record: a caller asked for something it refuses.
/// It is the pool's error, one definition, so both records refuse in the same words
/// (`engine/tests/shared_vs_pool.rs` compares them); only the shared record's write gate
/// returns [`PoolError::NotWritable`].
pub type SharedError = PoolError;

/// A known race, planted on purpose so that the loom models can be shown to catch it.
/// Test builds only: the release engine has no such switch.
#[cfg(any(test, loom))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedRace {
    /// Taking a hold checks the generation and the state with one load, then adds the
    /// holder with a separate `fetch_add`: the page can be freed (and handed out again)
    /// in between, and the hold then lands on a page nobody owns.
    SplitHoldCheck,
    /// The owner's release reads the holder count with one load, then stores the new
    /// state with a plain store: a hold taken in between is wiped out, and the page is
    /// freed under its holder.
    SplitReleaseCheck,
}

/// The owners and the free list: everything that is not on the hot path.
#[derive(Debug)]
pub(super) struct Book {
    /// Stack of free pages; the last element is handed out next (LIFO reuse).
    pub(super) free: Vec<PageId>,
    /// `owners[i]`: the room use that owns page `i` (index 0 is the padding page).
    pub(super) owners: Vec<Option<RoomKey>>,
}

/// The thread-safe page ownership record of one node. Share it by reference or in an
/// `Arc`; every method takes `&self`.
pub struct SharedPool {
    pub(super) page_size: u32,
    /// The incarnation of the node that owns the record (see [`PagePool::epoch`]).
    pub(super) epoch: u32,
    /// One word per page; index 0 is the padding page and is never touched.
    pub(super) words: Box<[AtomicU64]>,
    pub(super) book: Mutex<Book>,
    #[cfg(any(test, loom))]
    pub(super) planted: Option<PlantedRace>,
}

impl fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snapshot = self.snapshot();
        debug_assert_eq!(snapshot.capacity(), self.capacity());
        debug_assert_eq!(snapshot.epoch(), self.epoch);
        f.debug_tuple("SharedPool").field(&snapshot).finish()
    }
}

impl SharedPool {
    /// A record of `pages` usable pages (ids `1..=pages`) of `page_size` tokens each,
    /// all Free, page 1 handed out first, as [`PagePool::new`].
    pub fn new(pages: u32, page_size: u32) -> Self {
        let pool = Self::with_epoch(pages, page_size, 0);
        debug_assert_eq!(pool.capacity(), pages as usize);
        debug_assert_eq!(pool.epoch, 0, "a first incarnation");
        pool
    }

    /// The record of a node incarnation, as [`PagePool::with_epoch`]: every generation
    /// it hands out lies in `epoch`, so a tag from an earlier incarnation is stale.
    pub fn with_epoch(pages: u32, page_size: u32, epoch: u32) -> Self {
        assert!(page_size > 0, "EngineConfig validates page_size > 0");
        let first = Generation::first_of_epoch(epoch).0;
        assert!(
            first < GENERATION_MAX,
            "epoch {epoch} does not fit the page word's generation bits"
        );
        let words = (0..=pages)
            .map(|_| {
                AtomicU64::new(
                    Word {
                        gen: first,
                        state: PageState::Free,
                        holders: 0,
                    }
                    .pack(),
                )
            })
            .collect();
        let book = Book {
            free: (1..=pages).rev().map(PageId).collect(),
            owners: vec![None; pages as usize + 1],
        };
        debug_assert_eq!(book.free.len(), pages as usize, "every page starts free");
        debug_assert_eq!(
            book.free.last(),
            (pages > 0).then_some(&PageId(1)),
            "page 1 first"
        );
        SharedPool {
            page_size,
            epoch,
            words,
            book: Mutex::new(book),
            #[cfg(any(test, loom))]
            planted: None,
        }
    }

    /// A record with a known race planted in it (see [`PlantedRace`]), for the test that
    /// shows the loom models catch such a race.
    #[cfg(any(test, loom))]
    pub fn with_planted_race(pages: u32, page_size: u32, race: PlantedRace) -> Self {
        let mut pool = SharedPool::new(pages, page_size);
        assert!(pool.planted.is_none(), "one planted race at a time");
        pool.planted = Some(race);
        debug_assert_eq!(pool.epoch, 0, "a planted race lives in a first incarnation");
        pool
    }

    pub fn page_size(&self) -> u32 {
        debug_assert!(self.page_size > 0, "checked at construction");
        debug_assert!(!self.words.is_empty(), "index 0 is the padding page");
        self.page_size
    }

    /// The incarnation whose generations this record hands out.
    pub fn epoch(&self) -> u32 {
        debug_assert!(Generation::first_of_epoch(self.epoch).0 < GENERATION_MAX);
        debug_assert!(!self.words.is_empty(), "index 0 is the padding page");
        self.epoch
    }

    /// Usable pages (page 0 excluded).
    pub fn capacity(&self) -> usize {
        debug_assert!(!self.words.is_empty(), "index 0 is the padding page");
        let pages = self.words.len() - 1;
        debug_assert!(pages <= u32::MAX as usize, "page ids are 32-bit");
        pages
    }

    pub fn free_count(&self) -> usize {
        let book = self.book();
        debug_assert_eq!(
            book.owners.len(),
            self.words.len(),
            "one owner slot per page"
        );
        debug_assert!(book.free.last().is_none_or(|p| self.slot(*p).is_ok()));
        book.free.len()
    }

    /// The free list, next-to-be-handed-out last.
    pub fn free_list(&self) -> Vec<PageId> {
        let list = self.book().free.clone();
        debug_assert!(
            list.iter().all(|p| self.slot(*p).is_ok()),
            "only pool pages are free"
        );
        debug_assert!(
            !list.contains(&PageId(0)),
            "the padding page is never handed out"
        );
        list
    }

    /// The record of one page as of now (its holder count may change at once).
    pub fn record(&self, page: PageId) -> Option<PageRecord> {
        let book = self.book();
        let record = self.record_locked(&book, page);
        debug_assert_eq!(record.is_some(), self.slot(page).is_ok());
        debug_assert!(record
            .as_ref()
            .is_none_or(|r| r.state != PageState::Free || r.owner.is_none()));
        record
    }

    /// The current tag of a page, without taking the book lock.
    pub fn tag(&self, page: PageId) -> Option<PageTag> {
        let slot = self.slot(page).ok()?;
        let w = Word::unpack(slot.load(Ordering::Acquire));
        debug_assert!(page.0 >= 1, "slot refuses the padding page");
        // A generation never goes below its incarnation's first.
        debug_assert!(w.gen >= Generation::first_of_epoch(self.epoch).0);
        Some(PageTag {
            page,
            gen: Generation(w.gen),
        })
    }

    /// Is `tag` current (same generation) and owned by `owner` right now?
    pub fn owns(&self, owner: RoomKey, tag: PageTag) -> bool {
        let owns = self
            .record(tag.page)
            .is_some_and(|r| r.gen == tag.gen && r.owner == Some(owner) && r.state.is_owned());
        debug_assert!(!owns || self.slot(tag.page).is_ok());
        debug_assert!(
            !owns || tag.gen.0 > Generation::first_of_epoch(self.epoch).0,
            "allocated"
        );
        owns
    }

    /// Pages owned by or quarantined for `owner`, in page order.
    pub fn pages_of(&self, owner: RoomKey) -> Vec<PageTag> {
        let book = self.book();
        let pages: Vec<PageTag> = (1..self.words.len())
            .filter(|&i| book.owners[i] == Some(owner))
            .map(|i| PageTag {
                page: PageId(i as u32),
                gen: Generation(Word::unpack(self.words[i].load(Ordering::Acquire)).gen),
            })
            .collect();
        debug_assert!(
            pages.windows(2).all(|w| w[0].page < w[1].page),
            "in page order"
        );
        debug_assert!(
            pages.iter().all(|t| !book.free.contains(&t.page)),
            "S1: none is free"
        );
        pages
    }

    /// The whole record as a [`PagePool`], read under the book lock: states, owners,
    /// generations and the free list are consistent with each other; each holder count
    /// is the one its word had when read.
    pub fn snapshot(&self) -> PagePool {
        let book = self.book();
        let records = (1..self.words.len())
            .map(|i| {
                self.record_locked(&book, PageId(i as u32))
                    .expect("every index 1..len is a pool page")
            })
            .collect();
        let snapshot = PagePool::from_parts(self.page_size, records, book.free.clone(), self.epoch);
        debug_assert_eq!(snapshot.capacity(), self.words.len() - 1);
        debug_assert_eq!(snapshot.free_count(), book.free.len());
        snapshot
    }

    /// S1 (partition) and S8 (each free page listed once), checked by
    /// [`PagePool::invariants`] on a [`SharedPool::snapshot`]. Safe to call while other
    /// threads use the record: every move to or from Free happens under the book lock.
    pub fn invariants(&self) -> Result<(), Violation> {
        let snapshot = self.snapshot();
        let verdict = snapshot.invariants();
        // A whole record lists exactly its Free pages, each once (S8).
        debug_assert!(
            verdict.is_err()
                || snapshot.free_count()
                    == snapshot
                        .records()
                        .filter(|(_, r)| r.state == PageState::Free)
                        .count()
        );
        debug_assert_eq!(snapshot.epoch(), self.epoch);
        verdict
    }

    pub(super) fn book(&self) -> MutexGuard<'_, Book> {
        // A poisoned book means a thread panicked on a broken invariant while changing
        // it; carrying on could hand out a page twice, so every user fails loudly too.
        let book = self
            .book
            .lock()
            .expect("page book poisoned: a thread panicked on a broken invariant");
        debug_assert_eq!(
            book.owners.len(),
            self.words.len(),
            "one owner slot per page"
        );
        debug_assert!(
            book.owners.first().is_some_and(Option::is_none),
            "page 0 has no owner"
        );
        book
    }

    pub(super) fn slot(&self, page: PageId) -> Result<&AtomicU64, SharedError> {
        let last = self.capacity() as u32;
        if page.0 == 0 || page.0 > last {
            return Err(SharedError::OutOfRange { page, last });
        }
        debug_assert!(page.0 >= 1 && (page.0 as usize) < self.words.len());
        debug_assert_eq!(last as usize + 1, self.words.len(), "page 0 pads the words");
        Ok(&self.words[page.0 as usize])
    }

    pub(super) fn check_gen(w: Word, tag: PageTag) -> Result<(), SharedError> {
        debug_assert!(
            w.gen <= GENERATION_MAX,
            "an unpacked generation fits its bits"
        );
        // Every caller found the page's slot first: the padding page never gets here.
        debug_assert_ne!(tag.page.0, 0, "the padding page has no tags");
        if w.gen == tag.gen.0 {
            Ok(())
        } else {
            Err(SharedError::StaleTag {
                tag,
                current: Generation(w.gen),
            })
        }
    }

    pub(super) fn record_locked(&self, book: &Book, page: PageId) -> Option<PageRecord> {
        let slot = self.slot(page).ok()?;
        let w = Word::unpack(slot.load(Ordering::Acquire));
        let owner = book.owners[page.0 as usize];
        // Under the book lock: a Free or Draining page has no owner, an owned one has.
        debug_assert!(!matches!(w.state, PageState::Free | PageState::Draining) || owner.is_none());
        debug_assert!(
            !w.state.is_owned() || owner.is_some(),
            "{page} is owned by no one"
        );
        Some(PageRecord {
            state: w.state,
            gen: Generation(w.gen),
            owner,
            holders: w.holders,
        })
    }
}
