//! The runtime's threads, channels, locks and atomics, from one place.
//!
//! Built normally they are std's. Under `RUSTFLAGS="--cfg shuttle"` they are shuttle's
//! (awslabs' randomized concurrency tester): every thread the runtime starts is then a
//! task of shuttle's seeded scheduler, every lock, channel operation and atomic access
//! a point where it may switch tasks, so `tests/schedules.rs` runs the nodes' real
//! loops, device threads and landings over interleavings a seed chooses and a printed
//! schedule replays. Time is the scheduler's too then ([`crate::clock::Clock`] and
//! `timeline`). This module holds no logic of its own and re-exports only what the
//! runtime uses; `Arc` is std's in both builds (shuttle's is std's).
//!
//! Invariant: no runtime module names `std::sync`'s channels, locks or atomics, or
//! `std::thread`, directly (`runtime/clippy.toml` refuses them): a primitive taken from
//! around this module is invisible to shuttle, and a schedule test would pass without
//! having scheduled it. The engine's shared page record (`kv::shared`) keeps std's
//! atomics under shuttle: each of its operations is one step of a schedule here, and
//! its interleavings inside are loom's business (`engine/tests/loom_shared.rs`).

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
