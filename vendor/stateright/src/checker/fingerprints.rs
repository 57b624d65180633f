//! kvsim patch: the set of fingerprints the BFS and DFS checkers have generated.
//!
//! Upstream keeps them in a `DashSet` (DFS) or a `DashMap` from each fingerprint to
//! its parent's (BFS; the parent is never read since paths are rebuilt from action
//! indices). Both are hashbrown tables behind sharded `RwLock`s: an insert reads a
//! control group and then a slot, two cache misses on a table far larger than the
//! cache. This set is open addressing with linear probing over the fingerprints
//! themselves (a slot is one `u64`, 0 marks it empty: a `Fingerprint` is never 0),
//! so an insert costs one miss, and [`FingerprintSet::prefetch`] lets a checker
//! start that miss while it computes the next successor. A thread count of one gets
//! one shard; more threads get sixteen shards per thread so that their locks rarely
//! meet.
//!
//! Invariant: every shard's table is at most three quarters full, so a probe ends at
//! an empty slot; `len` is the number of fingerprints inserted (each once).

use crate::Fingerprint;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// One shard: its table under a lock, and the table's base and mask readable without
/// the lock (for prefetching only: they may be momentarily out of date).
struct Shard {
    table: Mutex<Table>,
    base: AtomicPtr<u64>,
    mask: AtomicUsize,
}

struct Table {
    slots: Vec<u64>,
    len: usize,
}

/// Slots a shard starts with (a power of two).
const INITIAL_SLOTS: usize = 1 << 10;

impl Table {
    fn with_slots(n: usize) -> Self {
        debug_assert!(n.is_power_of_two());
        Table {
            slots: vec![0; n],
            len: 0,
        }
    }

    /// Insert `fp` (nonzero); `true` if it was not there.
    #[inline]
    fn insert(&mut self, fp: u64) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = fp as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == fp {
                return false;
            }
            if slot == 0 {
                self.slots[i] = fp;
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    /// More than three quarters full after one more insert?
    fn needs_growth(&self) -> bool {
        (self.len + 1) * 4 > self.slots.len() * 3
    }

    /// Twice the slots, every fingerprint moved over.
    fn grown(&self) -> Self {
        let mut next = Table::with_slots(self.slots.len() * 2);
        for &fp in self.slots.iter().filter(|&&fp| fp != 0) {
            next.insert(fp);
        }
        debug_assert_eq!(next.len, self.len);
        next
    }
}

pub(crate) struct FingerprintSet {
    shards: Box<[Shard]>,
    /// `fp >> shift` is the shard of `fp` (64 with one shard: see [`Self::shard`]).
    shift: u32,
    len: AtomicUsize,
}

impl FingerprintSet {
    /// A set for a checker with `threads` threads.
    pub(crate) fn new(threads: usize) -> Self {
        let count = if threads <= 1 {
            1
        } else {
            (threads * 16).next_power_of_two()
        };
        let shards = (0..count)
            .map(|_| {
                let mut table = Table::with_slots(INITIAL_SLOTS);
                Shard {
                    base: AtomicPtr::new(table.slots.as_mut_ptr()),
                    mask: AtomicUsize::new(INITIAL_SLOTS - 1),
                    table: Mutex::new(table),
                }
            })
            .collect();
        FingerprintSet {
            shards,
            shift: 64 - count.trailing_zeros(),
            len: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn shard(&self, fp: u64) -> &Shard {
        // The top bits pick the shard, the low bits the slot, so the two are
        // independent. `checked_shr`: a shift of 64 (one shard) is shard 0.
        &self.shards[fp.checked_shr(self.shift).unwrap_or(0) as usize]
    }

    /// Insert a fingerprint; `true` if it was not in the set.
    #[inline]
    pub(crate) fn insert(&self, fp: Fingerprint) -> bool {
        let fp = fp.get();
        let shard = self.shard(fp);
        let mut table = shard.table.lock();
        if table.needs_growth() {
            *table = table.grown();
            shard
                .base
                .store(table.slots.as_mut_ptr(), Ordering::Relaxed);
            shard.mask.store(table.slots.len() - 1, Ordering::Relaxed);
        }
        let new = table.insert(fp);
        if new {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    /// Ask the processor to bring `fp`'s first slot into the cache (a hint: it reads
    /// nothing and never faults, even if the table has just been replaced).
    #[inline]
    pub(crate) fn prefetch(&self, fp: Fingerprint) {
        let fp = fp.get();
        let shard = self.shard(fp);
        let base = shard.base.load(Ordering::Relaxed);
        let slot = base.wrapping_add(fp as usize & shard.mask.load(Ordering::Relaxed));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `_mm_prefetch` only hints the cache; it does not dereference the
        // pointer in the language's sense and does not fault on any address.
        unsafe {
            std::arch::x86_64::_mm_prefetch(slot as *const i8, std::arch::x86_64::_MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// Fingerprints inserted.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn fp(n: u64) -> Fingerprint {
        Fingerprint::new(n).unwrap()
    }

    #[test]
    fn inserts_each_fingerprint_once_across_growth() {
        for threads in [1, 3] {
            let set = FingerprintSet::new(threads);
            // Spread over the shards and clustered in the low bits, past several
            // growths of a shard.
            for n in 1..20_000u64 {
                let v = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                assert!(set.insert(fp(v)), "{n} new");
                set.prefetch(fp(v ^ 2));
            }
            for n in 1..20_000u64 {
                let v = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                assert!(!set.insert(fp(v)), "{n} seen");
            }
            assert_eq!(set.len(), 19_999);
            for n in 1..5_000u64 {
                assert!(set.insert(fp(n << 1)), "{n} low bits");
            }
            assert_eq!(set.len(), 19_999 + 4_999);
        }
    }
}
