//! `SharedPool`: the thread-safe form of one node's page ownership record.
//!
//! On real hardware several paths hold one node's pages at once: token generation,
//! offload to host memory, the transfer receiver writing incoming KV, and the abort and
//! error paths. This is the record those threads share. It keeps the same per-page
//! facts as [`PagePool`] (state, generation, owner, holder count, the LIFO free list),
//! moves pages only through [`transition`] with the same let-go and hold rules
//! ([`let_go_op`], [`check_hold`]), and its [`SharedPool::snapshot`] is a `PagePool`,
//! so the two cannot drift apart unseen. It never touches page contents and never
//! spawns a thread; it does not decide when to release (the nodes do).
//!
//! How it is built: each page's generation, state and holder count live in one
//! `AtomicU64` word, changed only by compare-and-swap, so "the generation still
//! matches, the state admits a hold, add a holder" is one atomic step, and so is "drop
//! the last holder of a draining page, make it Free". Taking and releasing a hold (the
//! hot path) touches that word only. The owners and the free list sit behind one lock,
//! the *book*, which every state or generation change also takes: allocation, the
//! owner's operations, and the rare hot-path release that frees a page.
//!
//! Invariant: a page's state and generation change only while the book is locked, and
//! then only by a CAS on its word; a page is on the free list exactly when its state is
//! Free, and gets there exactly once per allocation, pushed by the one thread whose CAS
//! moved it to Free. A hold is taken only for the current generation, so a write
//! tagged with a stale generation is refused and never applied. [`SharedPool::invariants`]
//! checks the partition at any moment, with [`PagePool::invariants`].
//!
//! Under `cfg(loom)` its atomics and lock come from loom (through `src/sync.rs`), and
//! `tests/loom_shared.rs` explores the races between those paths: four models over
//! every interleaving, two (with three busy threads) within a preemption bound.

use super::lifecycle::{
    check_hold, let_go_op, transition, Holders, IllegalTransition, PageOp, PageState,
};
use super::pool::{PagePool, PageRecord, PoolError};
use crate::ids::{Generation, PageId, PageTag, RoomKey};
use crate::invariant::Violation;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use std::fmt;
use std::mem::ManuallyDrop;

/// An operating error of the shared record: a caller asked for something it refuses.
///
/// The variants and messages are [`PoolError`]'s, so both records report a refusal in
/// the same words (and `From<PoolError>` lets tests compare them), plus
/// [`SharedError::NotWritable`] for the write gate that only the shared record has.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedError {
    #[error("pool exhausted: {requested} pages requested, {free} free")]
    Exhausted { requested: usize, free: usize },
    /// The page has been freed and handed out again since the tag was issued: a write
    /// or read with this tag would reach another request's KV.
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
    /// now is unwanted and is not written.
    #[error("page {tag} is {state}: only an owned page accepts a write")]
    NotWritable { tag: PageTag, state: PageState },
}

impl From<PoolError> for SharedError {
    fn from(e: PoolError) -> Self {
        let words = e.to_string();
        let shared = match e {
            PoolError::Exhausted { requested, free } => SharedError::Exhausted { requested, free },
            PoolError::StaleTag { tag, current } => SharedError::StaleTag { tag, current },
            PoolError::NotOwner {
                page,
                caller,
                owner,
            } => SharedError::NotOwner {
                page,
                caller,
                owner,
            },
            PoolError::OutOfRange { page, last } => SharedError::OutOfRange { page, last },
            PoolError::NotHeld { tag } => SharedError::NotHeld { tag },
            PoolError::Illegal { page, source } => SharedError::Illegal { page, source },
        };
        // Both records refuse in the same words (tests/shared_vs_pool.rs compares them).
        debug_assert_eq!(shared.to_string(), words);
        debug_assert!(
            !matches!(shared, SharedError::NotWritable { .. }),
            "the pool has no gate"
        );
        shared
    }
}

/// The most generations one page can go through: the word keeps 45 bits of it. At one
/// allocation of the same page per microsecond that lasts more than a year; running
/// out is a broken limit and panics rather than wrap (a wrapped generation would make
/// a stale tag current again).
pub const GENERATION_MAX: u64 = (1 << (64 - GEN_SHIFT)) - 1;

// Layout of a page word: holders in bits 0..16, the state in bits 16..19, the
// generation in bits 19..64. Holders sit lowest so that the planted race's
// `fetch_add(1)` is a holder increment.
const HOLDERS_MASK: u64 = 0xffff;
const STATE_SHIFT: u32 = 16;
const STATE_MASK: u64 = 0b111;
const GEN_SHIFT: u32 = 19;

/// One page's word, unpacked. Only [`Word::pack`] writes page words, so every word in
/// the record unpacks to a valid state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Word {
    gen: u64,
    state: PageState,
    holders: u16,
}

impl Word {
    fn pack(self) -> u64 {
        debug_assert!(self.gen <= GENERATION_MAX);
        let code: u64 = match self.state {
            PageState::Free => 0,
            PageState::Reserved => 1,
            PageState::Writing => 2,
            PageState::Ready => 3,
            PageState::Draining => 4,
            PageState::Quarantined => 5,
        };
        let bits = (self.gen << GEN_SHIFT) | (code << STATE_SHIFT) | u64::from(self.holders);
        // The three fields do not bleed into each other.
        debug_assert_eq!(bits & HOLDERS_MASK, u64::from(self.holders));
        debug_assert_eq!((bits >> STATE_SHIFT) & STATE_MASK, code);
        bits
    }

    fn unpack(bits: u64) -> Word {
        let state = match (bits >> STATE_SHIFT) & STATE_MASK {
            0 => PageState::Free,
            1 => PageState::Reserved,
            2 => PageState::Writing,
            3 => PageState::Ready,
            4 => PageState::Draining,
            5 => PageState::Quarantined,
            code => {
                panic!("page word {bits:#x} has state code {code}: only Word::pack writes words")
            }
        };
        let w = Word {
            gen: bits >> GEN_SHIFT,
            state,
            holders: (bits & HOLDERS_MASK) as u16,
        };
        debug_assert!(w.gen <= GENERATION_MAX, "45 bits of generation");
        debug_assert_eq!(w.pack(), bits, "a word packs back to the bits it came from");
        w
    }
}

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
struct Book {
    /// Stack of free pages; the last element is handed out next (LIFO reuse).
    free: Vec<PageId>,
    /// `owners[i]`: the room use that owns page `i` (index 0 is the padding page).
    owners: Vec<Option<RoomKey>>,
}

/// The thread-safe page ownership record of one node. Share it by reference or in an
/// `Arc`; every method takes `&self`.
pub struct SharedPool {
    page_size: u32,
    /// The incarnation of the node that owns the record (see [`PagePool::epoch`]).
    epoch: u32,
    /// One word per page; index 0 is the padding page and is never touched.
    words: Box<[AtomicU64]>,
    book: Mutex<Book>,
    #[cfg(any(test, loom))]
    planted: Option<PlantedRace>,
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

    /// Allocate `n` pages to `owner`, all or nothing, most recently freed first.
    pub fn alloc(&self, n: usize, owner: RoomKey) -> Result<Vec<PageTag>, SharedError> {
        let mut book = self.book();
        if n > book.free.len() {
            return Err(SharedError::Exhausted {
                requested: n,
                free: book.free.len(),
            });
        }
        let mut tags = Vec::with_capacity(n);
        for _ in 0..n {
            let page = book.free.pop().expect("length checked above");
            let slot = &self.words[page.0 as usize];
            let bits = slot.load(Ordering::Acquire);
            let old = Word::unpack(bits);
            // A listed page is Free with no holders: the book lock orders every move to
            // Free before its push, and a hold is refused on a Free page (S1).
            let state = transition(old.state, PageOp::Allocate)
                .unwrap_or_else(|e| panic!("{page} is on the free list but {e}"));
            assert_eq!(old.holders, 0, "{page}: a free page has no holders (S1)");
            assert!(
                old.gen < GENERATION_MAX,
                "{page} has used all {GENERATION_MAX} generations"
            );
            let new = Word {
                gen: old.gen + 1,
                state,
                holders: 0,
            };
            // Nothing but this thread may change a listed page's word: a hold on it is
            // refused, and every other change needs the book lock we hold. A failed CAS
            // is therefore a broken invariant, such as a hold slipped onto a free page.
            if let Err(now) =
                slot.compare_exchange(bits, new.pack(), Ordering::AcqRel, Ordering::Acquire)
            {
                panic!(
                    "{page} changed while on the free list: {:?} became {:?} (S1)",
                    old,
                    Word::unpack(now)
                );
            }
            book.owners[page.0 as usize] = Some(owner);
            tags.push(PageTag {
                page,
                gen: Generation(new.gen),
            });
        }
        debug_assert_eq!(tags.len(), n, "all or nothing");
        debug_assert!(
            tags.iter().all(|t| !book.free.contains(&t.page)),
            "S1: off the free list"
        );
        Ok(tags)
    }

    /// Announce remote writes into `tags` (Reserved -> Writing).
    pub fn expect_write(&self, owner: RoomKey, tags: &[PageTag]) -> Result<(), SharedError> {
        self.owner_op(owner, tags, PageOp::ExpectWrite)?;
        debug_assert!(
            tags.iter().all(|t| self.tag(t.page) == Some(*t)),
            "no generation moved"
        );
        debug_assert!(tags.iter().all(|t| self
            .record(t.page)
            .is_some_and(|r| r.state == PageState::Writing)));
        Ok(())
    }

    /// The pages hold the owner's verified KV (-> Ready).
    pub fn mark_ready(&self, owner: RoomKey, tags: &[PageTag]) -> Result<(), SharedError> {
        self.owner_op(owner, tags, PageOp::MarkReady)?;
        debug_assert!(
            tags.iter().all(|t| self.tag(t.page) == Some(*t)),
            "no generation moved"
        );
        debug_assert!(tags.iter().all(|t| self
            .record(t.page)
            .is_some_and(|r| r.state == PageState::Ready)));
        Ok(())
    }

    /// The owner aborted while remote writes may still land: keep the pages out of
    /// circulation until [`SharedPool::release_quarantined`].
    pub fn quarantine(&self, owner: RoomKey, tags: &[PageTag]) -> Result<(), SharedError> {
        self.owner_op(owner, tags, PageOp::Quarantine)?;
        debug_assert!(
            tags.iter().all(|t| self.tag(t.page) == Some(*t)),
            "no generation moved"
        );
        debug_assert!(tags.iter().all(|t| self
            .record(t.page)
            .is_some_and(|r| r.state == PageState::Quarantined)));
        Ok(())
    }

    /// The owner lets go of its pages. Held pages go to Draining and return to Free
    /// when their last holder lets go. Only the owner may release (S8). Returns how
    /// many pages this call put back on the free list.
    pub fn release(&self, owner: RoomKey, tags: &[PageTag]) -> Result<usize, SharedError> {
        let freed = self.let_go_all(owner, tags, PageOp::Release)?;
        debug_assert!(freed <= tags.len());
        debug_assert!(
            tags.iter().all(|t| !self.owns(owner, *t)),
            "S8: the owner let go"
        );
        Ok(freed)
    }

    /// The writer acked that its writes for `owner` have drained: quarantined pages
    /// return to Free (or Draining while held). Returns how many pages this call put
    /// back on the free list.
    pub fn release_quarantined(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
    ) -> Result<usize, SharedError> {
        let freed = self.let_go_all(owner, tags, PageOp::DrainAcked)?;
        debug_assert!(freed <= tags.len());
        debug_assert!(tags
            .iter()
            .all(|t| self.record(t.page).is_some_and(|r| r.owner.is_none())));
        Ok(freed)
    }

    /// Take a hold on a page for another path (a send reading it, an offload). Refused
    /// for a stale tag, and for a page that is neither owned nor quarantined.
    /// Prefer [`SharedPool::begin_read`], whose guard cannot forget to let go.
    #[inline]
    pub fn hold(&self, tag: PageTag) -> Result<(), SharedError> {
        let held = self.take_hold(tag, |state| {
            check_hold(state).map_err(|source| SharedError::Illegal {
                page: tag.page,
                source,
            })
        });
        // While held the generation stays and the holder is counted.
        debug_assert!(held.is_err() || self.tag(tag.page) == Some(tag));
        debug_assert!(
            held.is_err()
                || self
                    .record(tag.page)
                    .is_some_and(|r| r.state != PageState::Free)
        );
        held
    }

    /// Let go of a hold. A draining page whose last holder lets go returns to Free;
    /// the result says whether this call did that.
    #[inline]
    pub fn unhold(&self, tag: PageTag) -> Result<bool, SharedError> {
        let slot = self.slot(tag.page)?;
        let mut bits = slot.load(Ordering::Acquire);
        loop {
            let w = Word::unpack(bits);
            Self::check_gen(w, tag)?;
            if w.holders == 0 {
                return Err(SharedError::NotHeld { tag });
            }
            // A held page is never on the free list, so never Free (S1).
            debug_assert_ne!(w.state, PageState::Free, "{tag} is held while free");
            debug_assert!(w.holders >= 1);
            if w.holders == 1 && w.state == PageState::Draining {
                // Freeing the page changes its state: that takes the book lock.
                return self.unhold_last(slot, tag);
            }
            let next = Word {
                holders: w.holders - 1,
                ..w
            };
            // Release: what this path did with the page happens before whoever frees
            // and reuses it.
            match slot.compare_exchange_weak(
                bits,
                next.pack(),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(false),
                Err(now) => bits = now,
            }
        }
    }

    /// Hold the page for reading (an offload, a send). The hold is taken only if `tag`
    /// is current and the page owned or quarantined, in one atomic step; the guard lets
    /// go when dropped, and the page cannot be freed or handed out again before that.
    #[inline]
    pub fn begin_read(&self, tag: PageTag) -> Result<ReadGuard<'_>, SharedError> {
        self.hold(tag)?;
        let guard = ReadGuard(Hold { pool: self, tag });
        debug_assert_eq!(guard.tag(), tag);
        debug_assert!(
            self.tag(tag.page) == Some(tag),
            "a held page keeps its generation"
        );
        Ok(guard)
    }

    /// Hold the page for writing incoming KV into it. Refused, and so never applied,
    /// when `tag` is stale ([`SharedError::StaleTag`]) or the page's owner has let go
    /// ([`SharedError::NotWritable`]). A quarantined page still accepts it: quarantine
    /// is the state in which the writer's writes may still land (the one rule for
    /// every driver, docs/ARCHITECTURE.md "Writes into quarantined pages"). A write
    /// that began before an abort keeps its hold until the guard drops, so the page is
    /// not reused under it.
    #[inline]
    pub fn begin_write(&self, tag: PageTag) -> Result<WriteGuard<'_>, SharedError> {
        self.take_hold(tag, |state| {
            if state.is_owned() || state == PageState::Quarantined {
                Ok(())
            } else {
                Err(SharedError::NotWritable { tag, state })
            }
        })?;
        let guard = WriteGuard(Hold { pool: self, tag });
        debug_assert_eq!(guard.tag(), tag);
        debug_assert!(
            self.tag(tag.page) == Some(tag),
            "a held page keeps its generation"
        );
        Ok(guard)
    }

    /// [`SharedPool::begin_write_for`] for a remote KV write landing (`kv::land`'s gate):
    /// also refused, in the same one atomic step, when the page is `Ready` (decode
    /// accepted its room's transfer, so no write of the room is still due, and decode
    /// appends its own KV to the last page).
    pub fn begin_landing_for(
        &self,
        owner: RoomKey,
        tag: PageTag,
    ) -> Result<WriteGuard<'_>, SharedError> {
        self.take_hold(tag, |state| {
            if state.takes_remote_writes() {
                Ok(())
            } else {
                Err(SharedError::NotWritable { tag, state })
            }
        })?;
        let guard = self.owned_by(owner, WriteGuard(Hold { pool: self, tag }))?;
        debug_assert_eq!(guard.tag(), tag);
        // Held, the page cannot go back to Free under the landing.
        debug_assert!(self
            .record(tag.page)
            .is_some_and(|r| r.state != PageState::Free));
        Ok(guard)
    }

    /// [`SharedPool::begin_write`] for a write of room use `owner`: also refused when
    /// the page (current generation) belongs to another room use. The hold is taken
    /// first, so the owner read afterwards is the one of the held generation (an owner
    /// changes only with a new generation, or to none when it lets go).
    pub fn begin_write_for(
        &self,
        owner: RoomKey,
        tag: PageTag,
    ) -> Result<WriteGuard<'_>, SharedError> {
        let guard = self.begin_write(tag)?;
        let guard = self.owned_by(owner, guard)?;
        debug_assert_eq!(guard.tag(), tag);
        debug_assert!(
            self.record(tag.page)
                .is_some_and(|r| r.state != PageState::Free),
            "held"
        );
        Ok(guard)
    }

    /// Keep `guard` only when its page (held at its generation) belongs to `owner`.
    fn owned_by<'a>(
        &'a self,
        owner: RoomKey,
        guard: WriteGuard<'a>,
    ) -> Result<WriteGuard<'a>, SharedError> {
        let tag = guard.0.tag;
        debug_assert!(self.slot(tag.page).is_ok(), "a guard holds a pool page");
        let current = self.book().owners[tag.page.0 as usize];
        if current != Some(owner) {
            // Drop the guard before reporting (it lets go of the hold).
            drop(guard);
            return Err(SharedError::NotOwner {
                page: tag.page,
                caller: owner,
                owner: current,
            });
        }
        // The owner read is the held generation's: an owner changes only with a new one.
        debug_assert!(
            self.tag(tag.page) == Some(tag),
            "the held generation is current"
        );
        Ok(guard)
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

    fn book(&self) -> MutexGuard<'_, Book> {
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

    fn slot(&self, page: PageId) -> Result<&AtomicU64, SharedError> {
        let last = self.capacity() as u32;
        if page.0 == 0 || page.0 > last {
            return Err(SharedError::OutOfRange { page, last });
        }
        debug_assert!(page.0 >= 1 && (page.0 as usize) < self.words.len());
        debug_assert_eq!(last as usize + 1, self.words.len(), "page 0 pads the words");
        Ok(&self.words[page.0 as usize])
    }

    fn check_gen(w: Word, tag: PageTag) -> Result<(), SharedError> {
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

    fn record_locked(&self, book: &Book, page: PageId) -> Option<PageRecord> {
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

    /// The hot path: add a holder if the generation matches and `admit` accepts the
    /// state, as one CAS on the page word.
    #[inline]
    fn take_hold(
        &self,
        tag: PageTag,
        admit: impl Fn(PageState) -> Result<(), SharedError>,
    ) -> Result<(), SharedError> {
        let slot = self.slot(tag.page)?;
        debug_assert!(std::ptr::eq(slot, &self.words[tag.page.0 as usize]));
        #[cfg(any(test, loom))]
        if self.planted == Some(PlantedRace::SplitHoldCheck) {
            // The planted race: check with one load, add with another operation.
            let w = Word::unpack(slot.load(Ordering::Acquire));
            Self::check_gen(w, tag)?;
            admit(w.state)?;
            slot.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        let mut bits = slot.load(Ordering::Acquire);
        loop {
            let w = Word::unpack(bits);
            Self::check_gen(w, tag)?;
            admit(w.state)?;
            // No admitted state is Free: a hold on a free page would outlive its owner.
            debug_assert_ne!(
                w.state,
                PageState::Free,
                "{tag}: a hold admitted on a free page"
            );
            let next = Word {
                holders: w
                    .holders
                    .checked_add(1)
                    .expect("holder count bounded by in-flight limit"),
                ..w
            };
            // Acquire: the holder sees the KV the owner made Ready before it.
            match slot.compare_exchange_weak(
                bits,
                next.pack(),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => bits = now,
            }
        }
    }

    /// The last holder of a draining page lets go: under the book lock, move it to Free
    /// and push it, so no observer sees a Free page off the list.
    fn unhold_last(&self, slot: &AtomicU64, tag: PageTag) -> Result<bool, SharedError> {
        let mut book = self.book();
        let mut bits = slot.load(Ordering::Acquire);
        loop {
            let w = Word::unpack(bits);
            Self::check_gen(w, tag)?;
            if w.holders == 0 {
                return Err(SharedError::NotHeld { tag });
            }
            let last = w.holders == 1 && w.state == PageState::Draining;
            debug_assert_ne!(w.state, PageState::Free, "{tag} is held while free");
            let next = if last {
                let state = transition(w.state, PageOp::LastHolderGone).map_err(|source| {
                    SharedError::Illegal {
                        page: tag.page,
                        source,
                    }
                })?;
                Word {
                    state,
                    holders: 0,
                    ..w
                }
            } else {
                Word {
                    holders: w.holders - 1,
                    ..w
                }
            };
            match slot.compare_exchange_weak(bits, next.pack(), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if next.state == PageState::Free {
                        debug_assert!(!book.free.contains(&tag.page), "{tag} listed twice (S8)");
                        debug_assert!(book.owners[tag.page.0 as usize].is_none());
                        book.free.push(tag.page);
                    }
                    return Ok(next.state == PageState::Free);
                }
                Err(now) => bits = now,
            }
        }
    }

    /// Check that every tag is owned by `owner` and admits `op` before any is changed,
    /// so a multi-page operation applies to all pages or to none. Called with the book
    /// locked: states and generations cannot change until it is unlocked.
    fn precheck(
        &self,
        book: &Book,
        owner: RoomKey,
        tags: &[PageTag],
        op: PageOp,
    ) -> Result<(), SharedError> {
        debug_assert!(
            op != PageOp::Allocate,
            "allocation takes pages off the free list"
        );
        for &tag in tags {
            let w = Word::unpack(self.slot(tag.page)?.load(Ordering::Acquire));
            Self::check_gen(w, tag)?;
            Self::check_owner(book, owner, tag)?;
            let to = transition(w.state, let_go_op(op, Holders::counted(w.holders))).map_err(
                |source| SharedError::Illegal {
                    page: tag.page,
                    source,
                },
            )?;
            debug_assert!(
                to != PageState::Free || w.holders == 0,
                "{tag} freed under a holder"
            );
        }
        Ok(())
    }

    fn check_owner(book: &Book, owner: RoomKey, tag: PageTag) -> Result<(), SharedError> {
        debug_assert_ne!(tag.page.0, 0, "the padding page has no owner");
        let current = book.owners[tag.page.0 as usize];
        debug_assert!(current.is_none() || book.free.last().is_none_or(|p| *p != tag.page));
        if current == Some(owner) {
            Ok(())
        } else {
            Err(SharedError::NotOwner {
                page: tag.page,
                caller: owner,
                owner: current,
            })
        }
    }

    /// One owner operation on one page, with the book locked: check as the pool does
    /// (range, generation, owner, table), then CAS the new state in. Holders may come
    /// and go meanwhile, so the operation is re-derived from each word seen. Returns
    /// the page's new state.
    fn apply_locked(
        &self,
        book: &mut Book,
        owner: RoomKey,
        tag: PageTag,
        op: PageOp,
    ) -> Result<PageState, SharedError> {
        let slot = self.slot(tag.page)?;
        #[cfg(any(test, loom))]
        if self.planted == Some(PlantedRace::SplitReleaseCheck) {
            // The planted race: decide from one load, write with a plain store.
            let w = Word::unpack(slot.load(Ordering::Acquire));
            let state = self.checked_next(book, owner, tag, op, w)?;
            let holders = if state == PageState::Free {
                0
            } else {
                w.holders
            };
            slot.store(
                Word {
                    state,
                    holders,
                    ..w
                }
                .pack(),
                Ordering::Release,
            );
            return Ok(state);
        }
        let mut bits = slot.load(Ordering::Acquire);
        loop {
            let w = Word::unpack(bits);
            let state = self.checked_next(book, owner, tag, op, w)?;
            let next = Word { state, ..w };
            // An owner operation moves the state only: generation and holders stay.
            debug_assert_eq!((next.gen, next.holders), (w.gen, w.holders));
            debug_assert!(
                state != PageState::Free || w.holders == 0,
                "{tag} freed under a holder"
            );
            match slot.compare_exchange_weak(bits, next.pack(), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(state),
                Err(now) => bits = now,
            }
        }
    }

    fn checked_next(
        &self,
        book: &Book,
        owner: RoomKey,
        tag: PageTag,
        op: PageOp,
        w: Word,
    ) -> Result<PageState, SharedError> {
        Self::check_gen(w, tag)?;
        Self::check_owner(book, owner, tag)?;
        let held = Holders::counted(w.holders);
        let next =
            transition(w.state, let_go_op(op, held)).map_err(|source| SharedError::Illegal {
                page: tag.page,
                source,
            })?;
        // The owner's record is consulted: only its pages (owned or quarantined) move.
        debug_assert!(w.state.is_owned() || w.state == PageState::Quarantined);
        debug_assert!(
            held == Holders::Absent || next != PageState::Free,
            "{tag} freed under a holder"
        );
        Ok(next)
    }

    fn owner_op(&self, owner: RoomKey, tags: &[PageTag], op: PageOp) -> Result<(), SharedError> {
        debug_assert!(
            matches!(
                op,
                PageOp::ExpectWrite | PageOp::MarkReady | PageOp::Quarantine
            ),
            "{op:?} lets go of pages: let_go_all"
        );
        let mut book = self.book();
        self.precheck(&book, owner, tags, op)?;
        for &tag in tags {
            let state = self.apply_locked(&mut book, owner, tag, op)?;
            // The page stays the owner's (a quarantine too, until the drain ack).
            debug_assert!(state.is_owned() || state == PageState::Quarantined);
            debug_assert_eq!(book.owners[tag.page.0 as usize], Some(owner));
        }
        Ok(())
    }

    /// Release or drain-ack, in the pool's order: highest page first, so the lowest
    /// freed page ends on top of the free list and is handed out next.
    fn let_go_all(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
        op: PageOp,
    ) -> Result<usize, SharedError> {
        debug_assert!(
            matches!(op, PageOp::Release | PageOp::DrainAcked),
            "{op:?} lets go of nothing"
        );
        let (freed, held) = self.let_go_detailed(owner, tags, op)?;
        debug_assert!(
            freed + held.len() <= tags.len(),
            "each page freed or draining, once"
        );
        Ok(freed)
    }

    /// [`SharedPool::let_go_all`], also naming the pages that went to Draining (still
    /// held), in page order, as the pool's journal does.
    fn let_go_detailed(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
        op: PageOp,
    ) -> Result<(usize, Vec<PageTag>), SharedError> {
        let mut book = self.book();
        self.precheck(&book, owner, tags, op)?;
        let mut sorted = tags.to_vec();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.page));
        let mut freed = 0;
        let mut held = Vec::new();
        for tag in sorted {
            let state = self.apply_locked(&mut book, owner, tag, op)?;
            book.owners[tag.page.0 as usize] = None;
            if state == PageState::Free {
                debug_assert!(!book.free.contains(&tag.page), "{tag} listed twice (S8)");
                book.free.push(tag.page);
                freed += 1;
            } else {
                debug_assert_eq!(state, PageState::Draining, "{tag}: let go but {state}");
                held.push(tag);
            }
        }
        held.sort();
        debug_assert_eq!(
            freed + held.len(),
            tags.len(),
            "each page freed or draining"
        );
        Ok((freed, held))
    }

    /// The owner lets go; returns the pages that went to Draining (see
    /// [`SharedPool::release`]).
    pub fn release_held(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
    ) -> Result<Vec<PageTag>, SharedError> {
        let (freed, held) = self.let_go_detailed(owner, tags, PageOp::Release)?;
        debug_assert_eq!(
            freed + held.len(),
            tags.len(),
            "each page freed or draining"
        );
        debug_assert!(held.windows(2).all(|w| w[0] < w[1]), "in page order");
        Ok(held)
    }

    /// The drain ack's release; returns the pages that went to Draining (see
    /// [`SharedPool::release_quarantined`]).
    pub fn release_quarantined_held(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
    ) -> Result<Vec<PageTag>, SharedError> {
        let (freed, held) = self.let_go_detailed(owner, tags, PageOp::DrainAcked)?;
        debug_assert_eq!(
            freed + held.len(),
            tags.len(),
            "each page freed or draining"
        );
        debug_assert!(held.windows(2).all(|w| w[0] < w[1]), "in page order");
        Ok(held)
    }

    /// Upstream's unchecked `free()`, as [`PagePool::free_unchecked`]: every named page
    /// goes to the free list whatever its state, owner or holders. Only bug switches
    /// call it; the result is what upstream would produce, duplicates included, which
    /// [`SharedPool::invariants`] then reports. A holder still holding such a page
    /// fails loudly when it lets go (its hold was wiped out).
    pub fn free_unchecked(&self, tags: &[PageTag]) {
        let mut book = self.book();
        let mut sorted = tags.to_vec();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.page));
        for t in sorted {
            let Ok(slot) = self.slot(t.page) else {
                continue;
            };
            let w = Word::unpack(slot.load(Ordering::Acquire));
            slot.store(
                Word {
                    state: PageState::Free,
                    holders: 0,
                    ..w
                }
                .pack(),
                Ordering::Release,
            );
            book.owners[t.page.0 as usize] = None;
            book.free.push(t.page);
            debug_assert_eq!(
                Word::unpack(slot.load(Ordering::Acquire)).state,
                PageState::Free
            );
        }
        // Upstream's free lists every named pool page, duplicates included.
        debug_assert!(book.free.len() >= tags.iter().filter(|t| self.slot(t.page).is_ok()).count());
        debug_assert_eq!(book.owners.len(), self.words.len());
    }
}

/// A hold on one page generation, let go when dropped.
struct Hold<'a> {
    pool: &'a SharedPool,
    tag: PageTag,
}

impl Hold<'_> {
    /// Let go; true when this returned the page to the free list.
    #[inline]
    fn end(&self) -> bool {
        let (pool, tag) = (self.pool, self.tag);
        // A hold was taken at the current generation of an allocated page.
        debug_assert!(
            tag.gen.0 > Generation::first_of_epoch(pool.epoch).0,
            "{tag} never allocated"
        );
        debug_assert!(pool.slot(tag.page).is_ok(), "a hold is on a pool page");
        match self.pool.unhold(self.tag) {
            Ok(freed) => freed,
            // While the hold exists the page cannot be reallocated (its generation stays)
            // and its holder count is at least one, so this is a broken invariant.
            Err(e) if !std::thread::panicking() => {
                panic!("letting go of a held page failed: {e} (the hold was lost)")
            }
            Err(_) => false,
        }
    }
}

impl Drop for Hold<'_> {
    #[inline]
    fn drop(&mut self) {
        debug_assert_ne!(self.tag.page.0, 0, "the padding page is never held");
        debug_assert!(
            self.pool.slot(self.tag.page).is_ok(),
            "a hold is on a pool page"
        );
        self.end();
    }
}

/// Proof that the holder may read one page generation; see [`SharedPool::begin_read`].
#[must_use = "dropping the guard lets go of the hold at once"]
pub struct ReadGuard<'a>(Hold<'a>);

/// Proof that the holder may write one page generation; see [`SharedPool::begin_write`].
#[must_use = "dropping the guard lets go of the hold at once"]
pub struct WriteGuard<'a>(Hold<'a>);

macro_rules! guard_api {
    ($guard:ident) => {
        impl $guard<'_> {
            /// The page generation this guard holds.
            pub fn tag(&self) -> PageTag {
                debug_assert_ne!(self.0.tag.page.0, 0, "the padding page is never held");
                debug_assert!(
                    self.0.pool.slot(self.0.tag.page).is_ok(),
                    "a guard holds a pool page"
                );
                self.0.tag
            }

            /// Let go now, and learn whether this returned the page to the free list
            /// (the owner had released it, and this was its last holder).
            pub fn finish(self) -> bool {
                let this = ManuallyDrop::new(self);
                let tag = this.0.tag;
                debug_assert_ne!(tag.page.0, 0, "the padding page is never held");
                debug_assert!(
                    this.0.pool.slot(tag.page).is_ok(),
                    "a guard holds a pool page"
                );
                this.0.end()
            }
        }

        impl fmt::Debug for $guard<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                debug_assert_ne!(self.0.tag.page.0, 0, "the padding page is never held");
                debug_assert!(self.0.pool.slot(self.0.tag.page).is_ok());
                write!(f, concat!(stringify!($guard), "({})"), self.0.tag)
            }
        }
    };
}
guard_api!(ReadGuard);
guard_api!(WriteGuard);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const A: RoomKey = RoomKey::new(1, 1);
    const B: RoomKey = RoomKey::new(2, 1);

    fn ok(pool: &SharedPool) {
        if let Err(v) = pool.invariants() {
            panic!("{v}");
        }
    }

    #[test]
    fn word_round_trips() {
        for state in super::super::lifecycle::ALL_STATES {
            for (gen, holders) in [(0, 0), (1, 1), (GENERATION_MAX, u16::MAX), (12345, 7)] {
                let w = Word {
                    gen,
                    state,
                    holders,
                };
                assert_eq!(Word::unpack(w.pack()), w);
            }
        }
    }

    /// LIFO reuse, generations and the free list as the single-threaded pool has them.
    #[test]
    fn alloc_release_reuse() {
        let pool = SharedPool::new(3, 16);
        let a = pool.alloc(2, A).unwrap();
        assert_eq!(
            a.iter().map(|t| (t.page.0, t.gen.0)).collect::<Vec<_>>(),
            [(1, 1), (2, 1)]
        );
        ok(&pool);
        assert_eq!(pool.release(A, &a), Ok(2));
        ok(&pool);
        let b = pool.alloc(1, B).unwrap();
        assert_eq!((b[0].page.0, b[0].gen.0), (1, 2), "lowest freed page first");
        assert!(pool.owns(B, b[0]) && !pool.owns(A, a[0]));
        assert_eq!(
            pool.alloc(3, B),
            Err(SharedError::Exhausted {
                requested: 3,
                free: 2
            })
        );
        ok(&pool);
    }

    /// A write with a tag from before a reallocation is refused and changes nothing.
    #[test]
    fn stale_write_is_refused() {
        let pool = SharedPool::new(1, 16);
        let old = pool.alloc(1, A).unwrap()[0];
        pool.release(A, &[old]).unwrap();
        assert_eq!(
            pool.begin_write(old).unwrap_err(),
            SharedError::NotWritable {
                tag: old,
                state: PageState::Free
            }
        );
        let new = pool.alloc(1, B).unwrap()[0];
        let before = pool.snapshot();
        assert_eq!(
            pool.begin_write(old).unwrap_err(),
            SharedError::StaleTag {
                tag: old,
                current: new.gen
            }
        );
        assert_eq!(pool.snapshot(), before);
        let guard = pool.begin_write(new).unwrap();
        assert_eq!(guard.tag(), new);
        assert!(!guard.finish());
        ok(&pool);
    }

    /// A held page released by its owner drains, and the guard's drop frees it once.
    #[test]
    fn last_guard_frees_a_released_page() {
        let pool = SharedPool::new(2, 16);
        let t = pool.alloc(1, A).unwrap()[0];
        let r1 = pool.begin_read(t).unwrap();
        let r2 = pool.begin_read(t).unwrap();
        assert_eq!(pool.release(A, &[t]), Ok(0));
        assert_eq!(pool.record(t.page).unwrap().state, PageState::Draining);
        assert!(
            pool.begin_read(t).is_err(),
            "no new hold on a draining page"
        );
        ok(&pool);
        assert!(!r1.finish());
        drop(r2);
        assert_eq!(pool.record(t.page).unwrap().state, PageState::Free);
        assert_eq!(pool.free_list().last(), Some(&t.page));
        ok(&pool);
        assert_eq!(pool.unhold(t), Err(SharedError::NotHeld { tag: t }));
    }

    /// Quarantine still accepts the room's own writes (they may land until the drain
    /// ack), refuses another room's, and keeps the page until the drain ack and its
    /// last holder; after the ack no write is accepted.
    #[test]
    fn quarantine_holds_the_page_until_acked_and_unheld() {
        let pool = SharedPool::new(1, 16);
        let t = pool.alloc(1, A).unwrap()[0];
        pool.expect_write(A, &[t]).unwrap();
        let w = pool.begin_write(t).unwrap();
        pool.quarantine(A, &[t]).unwrap();
        let late = pool
            .begin_write_for(A, t)
            .expect("a quarantined page takes its room's write");
        assert!(matches!(
            pool.begin_write_for(B, t),
            Err(SharedError::NotOwner { owner: Some(A), .. })
        ));
        drop(late);
        assert_eq!(
            pool.release(A, &[t]).unwrap_err().to_string(),
            "page p1: illegal page transition: ReleaseHeld from Quarantined"
        );
        assert_eq!(pool.release_quarantined(A, &[t]), Ok(0));
        assert!(matches!(
            pool.begin_write(t),
            Err(SharedError::NotWritable {
                state: PageState::Draining,
                ..
            })
        ));
        assert_eq!(
            pool.alloc(1, B).unwrap_err(),
            SharedError::Exhausted {
                requested: 1,
                free: 0
            }
        );
        assert!(w.finish());
        assert_eq!(pool.alloc(1, B).unwrap()[0].gen, Generation(2));
        ok(&pool);
    }

    /// Both planted races still behave on one thread: only an interleaving exposes them,
    /// which is why the loom models are the test that catches them.
    #[test]
    fn planted_races_are_invisible_on_one_thread() {
        for race in [PlantedRace::SplitHoldCheck, PlantedRace::SplitReleaseCheck] {
            let pool = SharedPool::with_planted_race(2, 16, race);
            let t = pool.alloc(1, A).unwrap()[0];
            let g = pool.begin_write(t).unwrap();
            assert_eq!(pool.release(A, &[t]), Ok(0));
            assert!(g.finish());
            assert!(pool.begin_write(t).is_err());
            ok(&pool);
        }
    }

    #[test]
    fn out_of_range_and_padding_page() {
        let pool = SharedPool::new(2, 16);
        let p0 = PageTag {
            page: PageId(0),
            gen: Generation(0),
        };
        assert_eq!(
            pool.hold(p0),
            Err(SharedError::OutOfRange {
                page: PageId(0),
                last: 2
            })
        );
        assert_eq!(pool.tag(PageId(3)), None);
        assert_eq!(pool.record(PageId(0)), None);
    }
}
