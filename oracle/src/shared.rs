//! `Shared<T>`: an immutable value behind an `Arc`, with its hash computed once.
//!
//! A model state holds three engine nodes and the messages in flight. A transition
//! changes one node and a message or two, yet stateright clones and fingerprints the
//! whole state for every successor. Sharing the parts a transition does not touch
//! makes the clone a handful of reference-count increments, and hashing the stored
//! digest instead of the value makes the fingerprint cost independent of the node's
//! size. It is not interior mutability: [`Shared::update`] copies on write and
//! recomputes the digest, so a `Shared` always hashes as its current value does.
//!
//! Invariant: `digest == hash_of(value)` for every `Shared` (set in `new` and
//! `update`, the only ways to make or change one), so equal values hash equally.

use ahash::RandomState;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
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

#[derive(Clone)]
struct Inner<T> {
    digest: u64,
    value: T,
}

/// A shared, hash-cached value. Cloning shares; [`Shared::update`] copies on write.
pub struct Shared<T>(Arc<Inner<T>>);

impl<T: Hash> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Inner {
            digest: hash_of(&value),
            value,
        }))
    }

    /// The stored digest (equal to `hash_of(self.get())`).
    pub fn digest(&self) -> u64 {
        self.0.digest
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
    /// Change the value: copy it if anyone else shares it, apply `f`, rehash.
    pub fn update<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        let inner = Arc::make_mut(&mut self.0);
        let r = f(&mut inner.value);
        inner.digest = hash_of(&inner.value);
        r
    }

    /// Change the value through a guard: copy it if anyone else shares it now, rehash
    /// when the guard goes (so the invariant holds again before anyone can read it).
    pub fn edit(&mut self) -> Edit<'_, T> {
        Edit(Arc::make_mut(&mut self.0))
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

impl<T: Hash> Drop for Edit<'_, T> {
    fn drop(&mut self) {
        self.0.digest = hash_of(&self.0.value);
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.digest);
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.digest == other.0.digest && self.0.value == other.0.value)
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
    fn an_edit_copies_on_write_and_rehashes_when_done() {
        let a = Shared::new(vec![1u32]);
        let mut b = a.clone();
        b.edit().push(2);
        assert_eq!(a.get(), &vec![1]);
        assert_eq!(b.digest(), hash_of(&vec![1u32, 2]));
    }

    #[test]
    fn update_copies_on_write_and_rehashes() {
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
