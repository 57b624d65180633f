//! The pool's self-check ([`PagePool::violations`], [`PagePool::invariants`]): the
//! partition of pages (S1) and the free list's entries (S8), read from the record.
//! It changes nothing.

use super::*;

impl PagePool {
    /// The pool's own consistency, as S1 (partition) and S8 (each free page listed
    /// once): every problem, not only the first, so one cannot hide another. This is
    /// the record's self-check (engine tests and the hand-stepped driver call it);
    /// oracles judge S1 and S8 from the trace, never from here.
    ///
    /// One pass over the free list and one over the records, with a bitset for
    /// "listed" (no per-page counters).
    pub fn violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let n = self.capacity();
        let mut listed = vec![0u64; n / 64 + 1];
        let mut twice = std::collections::BTreeSet::new();
        for &p in &self.free {
            let i = p.0 as usize;
            if i == 0 || i > n {
                out.push(Violation::new(
                    Invariant::S1,
                    format!("free list holds {p}, not a pool page"),
                ));
                continue;
            }
            let (w, bit) = (i / 64, 1u64 << (i % 64));
            if listed[w] & bit != 0 {
                twice.insert(p);
            }
            listed[w] |= bit;
        }
        for p in twice {
            let times = self.free.iter().filter(|q| **q == p).count();
            out.push(Violation::new(
                Invariant::S8,
                format!("{p} is on the free list {times} times: it was freed twice"),
            ));
        }
        // Every record is in exactly one state, so the per-state counts add up to the
        // pool by construction; what can break is a record disagreeing with the list.
        for (i, rec) in self.pages.iter().enumerate().skip(1) {
            let is_listed = (listed[i / 64] >> (i % 64)) & 1 == 1;
            let ok = match rec.state {
                PageState::Free => is_listed && rec.owner.is_none() && rec.holders == 0,
                PageState::Reserved
                | PageState::Writing
                | PageState::Ready
                | PageState::Quarantined => !is_listed && rec.owner.is_some(),
                PageState::Draining => !is_listed && rec.owner.is_none() && rec.holders > 0,
            };
            if !ok {
                let page = PageId(i as u32);
                out.push(Violation::new(
                    Invariant::S1,
                    format!(
                        "{page}@{} is {} with owner {:?}, {} holders, {} on the free list",
                        rec.gen,
                        rec.state,
                        rec.owner,
                        rec.holders,
                        if is_listed { "listed" } else { "not listed" }
                    ),
                ));
            }
        }
        out
    }

    /// [`PagePool::violations`], as a result: the first problem, if any.
    pub fn invariants(&self) -> Result<(), Violation> {
        match self.violations().into_iter().next() {
            Some(v) => Err(v),
            None => Ok(()),
        }
    }
}
