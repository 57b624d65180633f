//! kvsim-engine: a miniature disaggregated inference engine as deterministic state
//! machines.
//!
//! The [`router::Router`], [`prefill::PrefillNode`] and [`decode::DecodeNode`] run the
//! prefill-to-decode handoff of SGLang's disaggregated serving (bootstrap room, page
//! list, chunked KV writes, completion, abort and drain acks) with its defenses
//! (`config::Defenses`) and, behind [`bugs::BugSet`], the historical bugs. The crate is
//! pure: it does no I/O, reads no clock, starts no thread and draws no random number.
//! Time, delivery and randomness belong to the driver, through [`env::Env`]; KV memory
//! and compute belong to the node's [`gpu::Gpu`]. Same inputs in the same order give
//! the same effects, bit for bit.
//!
//! Drive a node with [`node::Node::handle`]; effects leave through the `Env` in the
//! order they were issued (messages, timers, trace events interleaved as called).

pub mod bugs;
pub mod compute;
pub mod config;
pub mod counters;
pub mod decode;
pub mod env;
pub mod gpu;
pub mod harness;
pub mod ids;
pub mod invariant;
pub mod kv;
pub mod msg;
pub mod node;
pub mod prefill;
pub mod retired;
pub mod router;
pub mod shared_cfg;
mod sync;
pub mod trace;
pub mod world;

pub use bugs::{Bug, BugSet};
pub use config::{ConfigError, Defenses, EngineConfig, RouterPolicy};
pub use counters::Counters;
pub use env::{Clock, Effect, Env, Input, Network, Outbox, Timer, TimerOp, Trace};
pub use ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomId, RoomKey, TenantId, Token, WriteId,
};
pub use invariant::{Invariant, Violation};
pub use msg::{Msg, Status, TransferOutcome, Why};
pub use node::{Node, Role};
pub use shared_cfg::Cfg;
pub use trace::TraceEvent;
