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
//! [`PagePool`]: crate::kv::pool::PagePool
//! [`PagePool::invariants`]: crate::kv::pool::PagePool::invariants
//! [`transition`]: crate::kv::lifecycle::transition
//! [`let_go_op`]: crate::kv::lifecycle::let_go_op
//! [`check_hold`]: crate::kv::lifecycle::check_hold
//!
//! Under `cfg(loom)` its atomics and lock come from loom (through `src/sync.rs`), and
//! `tests/loom_shared.rs` explores the races between those paths: four models over
//! every interleaving, two (with three busy threads) within a preemption bound.

mod holds;
mod ops;
mod table;
#[cfg(all(test, not(loom)))]
mod tests;
mod word;

pub use holds::{ReadGuard, WriteGuard};
#[cfg(any(test, loom))]
pub use table::PlantedRace;
pub use table::{SharedError, SharedPool};
pub use word::GENERATION_MAX;
