//! The runtime's threads, channels, locks and atomics, from one place.
//!
//! Built normally they are std's, re-exported, and nothing else is here. Under
//! `RUSTFLAGS="--cfg shuttle"` they are shuttle's (awslabs' randomized concurrency
//! tester): every thread the runtime starts is then a task of shuttle's seeded
//! scheduler, every lock, channel operation and atomic access a point where it may
//! switch tasks, so `tests/schedules.rs` runs the nodes' real loops, device threads and
//! landings over interleavings a seed chooses and a printed schedule replays. Then its
//! channels also count what they hold (`channel`), and time is the scheduler's too: a
//! timeline ([`crate::clock::Clock`], `timeline`). `Arc` is std's in both builds
//! (shuttle's is std's).
//!
//! Invariant: no runtime module names `std::sync`'s channels, locks or atomics, or
//! `std::thread`, directly (`tests/sync_facade.rs` fails on one): a primitive taken
//! from around this module is invisible to shuttle, and a schedule test would pass
//! without having scheduled it. The engine's shared page record (`kv::shared`) keeps
//! std's atomics under shuttle: each of its operations is one step of a schedule here,
//! and its interleavings inside are loom's business (`engine/tests/loom_shared.rs`).

#[cfg(shuttle)]
mod channel;
#[cfg(shuttle)]
pub(crate) mod timeline;

pub use std::sync::Arc;

#[cfg(not(shuttle))]
pub use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

#[cfg(shuttle)]
pub use shuttle::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

/// Atomics.
pub mod atomic {
    #[cfg(not(shuttle))]
    pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

    #[cfg(shuttle)]
    pub use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
}

/// Channels.
pub mod mpsc {
    #[cfg(not(shuttle))]
    pub use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};

    #[cfg(shuttle)]
    pub use super::channel::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
}

/// Threads.
pub mod thread {
    #[cfg(not(shuttle))]
    pub use std::thread::{sleep, spawn, yield_now, Builder, JoinHandle};

    #[cfg(shuttle)]
    pub use shuttle::thread::{sleep, spawn, yield_now, Builder, JoinHandle};
}
