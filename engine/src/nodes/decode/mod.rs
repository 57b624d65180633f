//! `DecodeNode`: receives KV from prefill and generates the reply.
//!
//! The SGLang decode scheduler and transfer queue in one state machine: intake (its
//! own length check) -> prealloc queue (reserve pages for the prompt length it was told
//! plus the reply, send the page list, M5) -> transfer (KV writes land in its pages;
//! it learns that the transfer concluded from prefill's `KvDone`, M7) -> verify on
//! completion over what its pages store (defense 2)
//! -> running batch (echo attention with the page-tag check, defense 4; stream
//! tokens) -> finish and release. On abort or failure while a transfer may still
//! write, pages are quarantined until prefill acks that this exact room use drained
//! (defense 3); a drain ack that never comes fails the node loudly instead of
//! releasing.
//!
//! It is not the transport, nor the receiving NIC: a KV write never enters its
//! handlers. The world lands it (`world::receive`, by the transport's row): on
//! one-sided RDMA the NIC places it and the writer's NIC completes it, with nothing run
//! here; on a two-sided transport the receiver's copy checks it (the peer rule, the
//! landing gate) and hands the node the landing (`Input::Landed`), which it traces and
//! completes.
//!
//! Invariant: a quarantined page returns to the pool only after the drain ack for its
//! own room use; a request attends only over pages whose tags it was given.

mod admission;
mod dispatch;
mod handles;
mod landing;
mod pull;
mod queries;
mod release;
mod state;
mod steps;

pub use handles::handle_count;
pub use state::{DecodeNode, DecodePhase};
