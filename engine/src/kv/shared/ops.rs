//! The owner's operations on the shared record: allocation, expecting a write,
//! marking ready, quarantine and release (checked against the owner, under the book),
//! and letting go of pages whose holds are gone. Holds and guards are in
//! [`holds`](crate::kv::shared::holds).

use crate::ids::{Generation, PageTag, RoomKey};
use crate::kv::lifecycle::{let_go_op, transition, Holders, PageOp, PageState};
#[cfg(any(test, loom))]
use crate::kv::shared::table::PlantedRace;
use crate::kv::shared::table::{Book, SharedError, SharedPool};
use crate::kv::shared::word::{Word, GENERATION_MAX};
use crate::sync::Ordering;

impl SharedPool {
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

    /// Check that every tag is owned by `owner` and admits `op` before any is changed,
    /// so a multi-page operation applies to all pages or to none. Called with the book
    /// locked: states and generations cannot change until it is unlocked.
    pub(super) fn precheck(
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

    pub(super) fn check_owner(
        book: &Book,
        owner: RoomKey,
        tag: PageTag,
    ) -> Result<(), SharedError> {
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
    pub(super) fn apply_locked(
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

    pub(super) fn checked_next(
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

    pub(super) fn owner_op(
        &self,
        owner: RoomKey,
        tags: &[PageTag],
        op: PageOp,
    ) -> Result<(), SharedError> {
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
    pub(super) fn let_go_all(
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
    pub(super) fn let_go_detailed(
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

    /// Upstream's unchecked `free()`, as [`PagePool::free_unchecked`](crate::kv::pool::PagePool::free_unchecked): every named page
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
