//! kvsim-engine: a miniature disaggregated inference engine as deterministic state machines.

pub mod ids;
pub mod invariant;
pub mod kv;
mod sync;
