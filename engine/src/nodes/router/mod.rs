//! `Router`: pairs each client request with one prefill and one decode node.
//!
//! Like SGLang's mini_lb it assigns a bootstrap room and sends the same request to
//! both halves concurrently, then answers the client once: with the first error
//! either half reports, or with decode's tokens when decode finishes. Unlike mini_lb
//! before #29017 it cancels both halves on any abort, disconnect or failure
//! (defense 6). It owns no pages and does no I/O: inputs arrive through
//! [`Router::handle`], effects leave through the
//! [`Control`](crate::env::Control) part of its driver's `Outbox` (it posts no KV write,
//! so no KV type runs through it).
//!
//! Room numbers come from a bounded table and are reused LIFO; each reuse bumps the
//! room's generation, so a late message for an earlier use is recognisably stale.
//!
//! Two policies ([`RouterPolicy`](crate::config::RouterPolicy)(crate::config::RouterPolicy)): the careful one above, and `sglang-router`, the
//! observable behaviour of SGLang's gateway 0.3.2 (`src/routers/http/pd_router.rs`,
//! `src/core/retry.rs` of sgl-project/sglang): no cancel of the other half, up to
//! five attempts on a retryable status, each in a new room drawn at random from the
//! free rooms with the router's own seeded generator (the real router draws a random
//! room in 0..2^63; a table keeps the nodes' per-room memory bounded), decode's answer
//! or prefill's error. An attempt the router gave up (its request timeout closed the
//! connections) stays in the table, abandoned, until both its halves answered.
//!
//! Invariant: every request the router accepted gets exactly one `Response`; a room is
//! reused only after both halves reported a terminal status for it.

mod careful;
mod flow;
mod policy;
mod rules;
mod sglang;
mod state;
mod vllm;

pub use sglang::SGLANG_MAX_ATTEMPTS;
pub use state::{Router, RouterRoomState};
