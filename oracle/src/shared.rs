//! `Shared<T>`: an immutable value behind an `Arc`, with its hash computed once.
//!
//! A model state holds three engine nodes and the messages in flight. A transition
//! changes one node and a message or two, yet stateright clones and fingerprints the
//! whole state for every successor. Sharing the parts a transition does not touch
//! makes the clone a handful of reference-count increments, and hashing the stored
//! digest instead of the value makes the fingerprint cost independent of the node's
//! size. [`Shared::update`] and [`Shared::edit`] copy on write and mark the digest
//! stale; the digest is computed the first time anyone asks for it (hashing,
//! [`Shared::digest`]), so a driver that never fingerprints states (the simulator,
//! `kvsim audit`) never pays for it, and a part edited several times in one
//! transition is hashed once.
//!
//! Invariant: whenever a digest is stored it equals `hash_of(value)` (with `0`, the
//! "not yet computed" mark, stored as `1`), so equal values hash equally. The cache is
//! an atomic written with the one value the current contents hash to, so threads that
//! race to fill it store the same number; contents change only through `&mut self`
//! on an unshared copy.

use ahash::RandomState;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// Fixed keys: digests must not vary between runs, or pinned state counts could not
/// be reproduced (stateright's own fingerprints use fixed keys for the same reason).
const HASHER: RandomState = RandomState::with_seeds(
    0x6b76_7369_6d2d_6d6f,
    0x6465_6c73_2d73_6861,
    0x7265_642d_6469_6765,
    0x7374_2d6b_6579_7321,
);

/// The digest of a value, as `Shared` stores it.
pub fn hash_of<T: Hash>(value: &T) -> u64 {
    HASHER.hash_one(value)
}

/// The stored form of "digest not computed since the last change".
const STALE: u64 = 0;

struct Inner<T> {
    /// `STALE`, or the digest of `value` (never `STALE` itself, see [`digest_of`]).
    digest: AtomicU64,
    value: T,
}

impl<T: Clone> Clone for Inner<T> {
    fn clone(&self) -> Self {
        Inner {
            digest: AtomicU64::new(self.digest.load(AtomicOrdering::Relaxed)),
            value: self.value.clone(),
        }
    }
}

impl<T> Inner<T> {
    fn fresh(value: T) -> Self {
        Inner {
            digest: AtomicU64::new(STALE),
            value,
        }
    }

    /// The contents changed: the stored digest no longer describes them.
    fn mark_stale(&mut self) {
        *self.digest.get_mut() = STALE;
    }
}

/// A value's digest as a cache stores it: `hash_of`, with `STALE` moved to 1.
fn digest_of<T: Hash>(value: &T) -> u64 {
    match hash_of(value) {
        STALE => 1,
        h => h,
    }
}

/// A shared, hash-cached value. Cloning shares; [`Shared::update`] copies on write.
pub struct Shared<T>(Arc<Inner<T>>);

impl<T> Shared<T> {
    /// Where the shared value lives (for a cache prefetch hint; never dereferenced).
    pub fn as_ptr(&self) -> *const u8 {
        Arc::as_ptr(&self.0).cast()
    }
}

impl<T: Hash> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Inner::fresh(value)))
    }

    /// The digest of the current value (`hash_of(self.get())`, or 1 where that is 0),
    /// computed on first use after a change and kept.
    pub fn digest(&self) -> u64 {
        let stored = self.0.digest.load(AtomicOrdering::Relaxed);
        if stored != STALE {
            return stored;
        }
        let fresh = digest_of(&self.0.value);
        self.0.digest.store(fresh, AtomicOrdering::Relaxed);
        fresh
    }
}

impl<T> Shared<T> {
    pub fn get(&self) -> &T {
        &self.0.value
    }

    /// The same allocation (so certainly the same value).
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: Hash + Clone> Shared<T> {
    /// Change the value: copy it if anyone else shares it, apply `f`, mark the digest
    /// stale.
    pub fn update<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        let inner = Arc::make_mut(&mut self.0);
        inner.mark_stale();
        f(&mut inner.value)
    }

    /// Change the value through a guard: copy it if anyone else shares it now; the
    /// digest is stale from here (the next reader computes it).
    pub fn edit(&mut self) -> Edit<'_, T> {
        let inner = Arc::make_mut(&mut self.0);
        inner.mark_stale();
        Edit(inner)
    }
}

/// A `Shared` being changed (see [`Shared::edit`]).
pub struct Edit<'a, T: Hash>(&'a mut Inner<T>);

impl<T: Hash> std::ops::Deref for Edit<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T: Hash> std::ops::DerefMut for Edit<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.value
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.digest());
    }
}

impl<T> Shared<T> {
    /// The digest if one is stored (none since the last change otherwise).
    fn stored_digest(&self) -> Option<u64> {
        match self.0.digest.load(AtomicOrdering::Relaxed) {
            STALE => None,
            d => Some(d),
        }
    }
}

/// Two stored digests that differ prove the values differ; anything else compares the
/// values (equality never computes a digest).
impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        if Arc::ptr_eq(&self.0, &other.0) {
            return true;
        }
        if let (Some(a), Some(b)) = (self.stored_digest(), other.stored_digest()) {
            if a != b {
                return false;
            }
        }
        self.0.value == other.0.value
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: Ord> PartialOrd for Shared<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Ordered by value, so a sorted collection of `Shared` is canonical.
impl<T: Ord> Ord for Shared<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            Ordering::Equal
        } else {
            self.0.value.cmp(&other.0.value)
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.value.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_copies_on_write_and_the_digest_follows() {
        let a = Shared::new(vec![1u32]);
        let mut b = a.clone();
        b.edit().push(2);
        assert_eq!(a.get(), &vec![1]);
        assert_eq!(b.digest(), hash_of(&vec![1u32, 2]));
        assert_eq!(a.digest(), hash_of(&vec![1u32]));
    }

    #[test]
    fn a_digest_read_before_an_edit_is_not_kept_after_it() {
        let mut a = Shared::new(vec![1u32]);
        assert_eq!(a.digest(), hash_of(&vec![1u32]));
        a.edit().push(2);
        assert_eq!(a.digest(), hash_of(&vec![1u32, 2]));
        a.update(|v| v.push(3));
        assert_eq!(a.digest(), hash_of(&vec![1u32, 2, 3]));
        assert_eq!(a, Shared::new(vec![1u32, 2, 3]));
    }

    #[test]
    fn update_copies_on_write_and_the_digest_follows() {
        let a = Shared::new(vec![1u32, 2]);
        let mut b = a.clone();
        b.update(|v| v.push(3));
        assert_eq!(a.get(), &vec![1, 2]);
        assert_eq!(b.get(), &vec![1, 2, 3]);
        assert_eq!(b.digest(), hash_of(&vec![1u32, 2, 3]));
        assert_ne!(a, b);
        assert_eq!(Shared::new(vec![1u32, 2, 3]), b);
    }
}
