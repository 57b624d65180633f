//! `DecodeNode`: receives KV from prefill and generates the reply.
//!
//! The SGLang decode scheduler, transfer queue and receiving NIC in one state
//! machine: intake (its own length check) -> prealloc queue (reserve pages for the
//! prompt length it was told plus the reply, send the page list, M5) -> transfer (KV
//! writes land, each acknowledged to the writer) -> verify on completion (defense 2)
//! -> running batch (echo attention with the page-tag check, defense 4; stream
//! tokens) -> finish and release. On abort or failure while a transfer may still
//! write, pages are quarantined until prefill acks that this exact room use drained
//! (defense 3); a drain ack that never comes fails the node loudly instead of
//! releasing.
//!
//! It is not the transport: a KV write is a message handled here the way a receiver
//! thread would handle it, and it is refused (never applied) when a destination tag is
//! stale or not the room's, as long as page tags are on.
//!
//! Invariant: a quarantined page returns to the pool only after the drain ack for its
//! own room use; a request attends only over pages whose tags it was given.

mod admission;
mod dispatch;
mod landing;
mod queries;
mod release;
mod state;
mod steps;

pub use state::{DecodeNode, DecodePhase};
