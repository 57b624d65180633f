//! The READ handles of a pulled room, one per remote prefill rank (`EngineConfig::ranks`),
//! and the count that says the transfer ended: vLLM's NIXL connector under
//! heterogeneous TP (`_read_blocks_for_req` posts one transfer handle per remote TP
//! rank; the request's receive is done, or failed, only when every handle has been
//! polled to a final state, as vLLM #56104 made it). Rank `r` of `n` reads the room's
//! pages at positions `r, r + n, r + 2n, ...` of the page list: its slice (vLLM's
//! slice is a head range of every block; kvsim's KV has no heads, so a slice is a set
//! of whole pages: what the invariants judge, which destination bytes each handle
//! writes and when, is the same). With one rank there is one handle, the whole list.
//! Decode posts and counts them (`pull.rs`); this module is the count alone.
//!
//! The count is where the four issue-37 class-1 switches live (`bugs.rs`):
//! `first-failed-handle-frees`, `failed-slice-counted-twice`,
//! `rejected-scatter-returns-ok`, `failed-handle-skipped`.

use crate::bugs::{Bug, BugSet};
use std::collections::BTreeSet;

/// The READ handles of one pulled room use still to be counted, and whether one that
/// was counted failed.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct Handles {
    /// The ranks whose handle has not completed (a handle's `WriteId::chunk` is its rank).
    pending: BTreeSet<u32>,
    failed: bool,
}

/// What counting one handle's completion decided for its room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Count {
    /// Not this room's pending handle (a repeat, a stale or unknown one): nothing.
    Ignored,
    /// Counted; sibling handles are still pending.
    Waiting,
    /// Every handle is counted (or the count says so): the transfer ended, `ok` when
    /// no counted handle failed.
    Ended { ok: bool },
}

/// The slice of rank `rank` of `ranks`: the pages at positions `rank`, `rank + ranks`,
/// ... of a page list of `len` pages.
pub(super) fn slice(len: usize, ranks: u32, rank: u32) -> impl Iterator<Item = usize> {
    (rank as usize..len).step_by(ranks.max(1) as usize)
}

/// How many handles a pull of `len` pages posts with `ranks` ranks: one per rank with
/// a page to read (at least one, so an empty pull still completes once). The prefill
/// counts as many notifications ([`crate::prefill_vllm`]).
pub fn handle_count(len: usize, ranks: u32) -> u32 {
    (ranks.max(1) as usize).min(len.max(1)) as u32
}

impl Handles {
    /// `n` handles, ranks `0..n`, none counted.
    pub(super) fn new(n: u32) -> Handles {
        Handles {
            pending: (0..n).collect(),
            failed: false,
        }
    }

    /// Count the completion of handle `rank` (`ok`: its bytes landed). The defended
    /// count removes the handle once and ends the transfer when none is pending,
    /// failed if any failed: a failure is reported, and the pages let go, only once
    /// every sibling handle has stopped (vLLM #56104's fix).
    pub(super) fn count(&mut self, rank: u32, ok: bool, bugs: BugSet) -> Count {
        if !self.pending.contains(&rank) {
            return Count::Ignored;
        }
        if !ok && bugs.has(Bug::FailedHandleSkipped) {
            // vLLM #50754: logged (a log line, no event), neither counted nor failed.
            return Count::Waiting;
        }
        self.pending.remove(&rank);
        // Mooncake #3000: a handle that wrote nothing reports OK.
        if !ok && !bugs.has(Bug::RejectedScatterReturnsOk) {
            self.failed = true;
        }
        if !ok && bugs.has(Bug::FailedSliceCountedTwice) {
            // Mooncake #1865: the failed handle is counted again, for a sibling.
            if let Some(sibling) = self.pending.iter().next().copied() {
                self.pending.remove(&sibling);
            }
        }
        // vLLM #56104 before its fix: the first failed handle ends the count.
        let first_failure_ends = !ok && bugs.has(Bug::FirstFailedHandleFrees);
        if !self.pending.is_empty() && !first_failure_ends {
            return Count::Waiting;
        }
        Count::Ended { ok: !self.failed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_list_once() {
        let mut seen: Vec<usize> = (0..3).flat_map(|r| slice(7, 3, r)).collect();
        seen.sort();
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
        assert_eq!(handle_count(7, 3), 3);
        assert_eq!(handle_count(2, 3), 2);
        assert_eq!(handle_count(0, 3), 1);
        assert_eq!(handle_count(5, 1), 1);
    }

    #[test]
    fn the_defended_count_ends_once_every_handle_stopped() {
        let mut h = Handles::new(3);
        assert_eq!(h.count(1, false, BugSet::NONE), Count::Waiting);
        assert_eq!(h.count(1, true, BugSet::NONE), Count::Ignored);
        assert_eq!(h.count(0, true, BugSet::NONE), Count::Waiting);
        assert_eq!(h.count(2, true, BugSet::NONE), Count::Ended { ok: false });
    }

    #[test]
    fn each_switch_changes_the_count_its_way() {
        let one = |b: Bug| BugSet::NONE.with(b);
        let mut h = Handles::new(3);
        let b = one(Bug::FirstFailedHandleFrees);
        assert_eq!(h.count(0, false, b), Count::Ended { ok: false });
        let mut h = Handles::new(3);
        let b = one(Bug::FailedSliceCountedTwice);
        assert_eq!(h.count(0, false, b), Count::Waiting);
        assert_eq!(h.count(2, true, b), Count::Ended { ok: false });
        let mut h = Handles::new(2);
        let b = one(Bug::RejectedScatterReturnsOk);
        assert_eq!(h.count(0, false, b), Count::Waiting);
        assert_eq!(h.count(1, true, b), Count::Ended { ok: true });
        let mut h = Handles::new(2);
        let b = one(Bug::FailedHandleSkipped);
        assert_eq!(h.count(0, false, b), Count::Waiting);
        assert_eq!(h.count(1, true, b), Count::Waiting);
    }
}
