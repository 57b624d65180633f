//! `PrefillNode`: runs prompts and pushes their KV to decode.
//!
//! The SGLang prefill scheduler and its KV manager in one state machine:
//! intake (length check, defense 1) -> bootstrap (wait for decode's page list, M5) ->
//! waiting queue (allocate source pages) -> forward (one scheduler tick) -> send KV in
//! bounded chunks (M6) with at most `max_inflight_chunks` writes in flight -> conclude
//! (M7) -> inflight poll on the next tick (release source pages, answer the router).
//! Decode's drain requests (M8) are acked only once every write for that exact room use
//! has completed (defense 3); source pages are held by their in-flight sends, so a
//! release while a send still reads them leaves them Draining, never Free.
//!
//! It is not a transport: it posts each write through its outbox
//! (`Outbox::post_write`) and the world carries it; each write gets exactly one
//! completion (`WriteDone`, as an RDMA reliable connection gives one completion per
//! work request, success or error).
//!
//! Invariant: a request rejected at intake never gets a sender, pages or a transfer;
//! a room's drain ack is sent only when it has no write in flight.

mod dispatch;
mod failure;
mod forward;
mod queries;
mod start;
mod state;
mod writes;

pub use state::{PrefillNode, PrefillPhase};
