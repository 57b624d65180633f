//! KV page ownership: the lifecycle table and the per-node allocator.
//!
//! This module decides who owns which page and when a page may be reused. It does
//! not hold KV contents (see [`crate::gpu`]) and does no I/O.

pub mod landing;
pub mod lifecycle;
pub mod pool;
pub mod records;
pub mod shared;

pub use landing::{land, land_with, Refusal, WriteGate};
pub use lifecycle::{transition, IllegalTransition, PageOp, PageState, TRANSITIONS};
pub use pool::{PageChange, PagePool, PageRecord, PoolError};
pub use records::{PageRecords, SharedRecord};
