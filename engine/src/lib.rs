//! kvsim-engine: a miniature disaggregated inference engine as deterministic state machines.

pub mod bugs;
pub mod config;
pub mod env;
pub mod gpu;
pub mod ids;
pub mod invariant;
pub mod kv;
pub mod msg;
pub mod trace;
