//! The synchronisation primitives of the engine's concurrent parts, from one place.
//!
//! Under `cfg(loom)` they come from loom, whose model checker then explores the
//! interleavings of every thread that uses them; otherwise they come from std. This
//! module holds no logic and is not a general toolbox: it re-exports only what the
//! engine uses.
//!
//! Invariant: no engine code names `std::sync` atomics or locks directly. A primitive
//! taken from around this module would be invisible to loom, and the loom models would
//! pass without having checked it.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
