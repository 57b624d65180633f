//! Holds on page generations: taking one for another path ([`SharedPool::hold`]),
//! the read and write guards ([`ReadGuard`], [`WriteGuard`]) and the hot path that
//! adds and drops a holder with one compare-and-swap. The owner's operations are in
//! [`ops`](crate::kv::shared::ops).

use crate::ids::{Generation, PageTag, RoomKey};
use crate::kv::lifecycle::{check_hold, transition, PageOp, PageState};
#[cfg(any(test, loom))]
use crate::kv::shared::table::PlantedRace;
use crate::kv::shared::table::{SharedError, SharedPool};
use crate::kv::shared::word::Word;
use crate::sync::{AtomicU64, Ordering};
use std::fmt;
use std::mem::ManuallyDrop;

impl SharedPool {
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
    /// every driver, docs/DECISIONS.md "Writes into quarantined pages"). A write
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
    pub(super) fn owned_by<'a>(
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

    /// The hot path: add a holder if the generation matches and `admit` accepts the
    /// state, as one CAS on the page word.
    #[inline]
    pub(super) fn take_hold(
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
    pub(super) fn unhold_last(&self, slot: &AtomicU64, tag: PageTag) -> Result<bool, SharedError> {
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
