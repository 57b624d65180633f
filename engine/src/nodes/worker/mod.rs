//! Worker mode's front ([`WorkerFront`]): what SGLang's worker HTTP front decides in
//! front of one prefill or decode node when the real `sglang-router` drives the
//! nodes (`kvsim serve --worker-http`). No engine router runs there: the router sends
//! the same request, with its `bootstrap_room`, to a prefill worker and a decode
//! worker, and each worker's front plays the router's part for its own half. The
//! front starts the half (the engine's own `PrefillStart` or `DecodeStart`, delivered
//! to the node as from the router), aborts it when its client goes away, turns what
//! the half sends the router (`TokenOut`, `PrefillFinished`, `DecodeFinished`) into
//! the half's answer, and, on a decode node, clears a room once both halves are
//! terminal, traced as the engine router traces it so the audit closes the room; a
//! prefill node's later incarnation ends the prefill halves of its earlier ones (the
//! epoch rule, `epochs.rs`); a killed decode process's open rooms are cleared by
//! the next one (`killed.rs`). The same front stands before vLLM's pair under the
//! real `vllm-router` (`kvsim serve` of a scenario under it): a prefill half's
//! `KvParams` is its answer's `kv_transfer_params` ([`HalfEv::Params`]), and a decode
//! half's `PullStart` comes after its prefill half answered 200.
//!
//! It is a state machine like the nodes: inputs in ([`FrontInput`], and
//! [`WorkerFront::from_node`] for the node's messages to the router), effects out
//! ([`FrontEffect`], in the order issued), no I/O. The runtime parses HTTP into its
//! inputs and carries out its effects (`runtime/src/node/halves.rs`). Not the HTTP
//! worker API itself (`runtime/src/worker/`), nor the nodes behind it.
//!
//! Its parts: the state and the vocabulary (`state.rs`), a half's start, abort and
//! answer (`halves.rs`), room clearing and the epoch rule (`epochs.rs`), the rooms a
//! killed decode process left open and their clearing by its successor (`killed.rs`),
//! a node behind its front under an engine router (`behind.rs`), the pairing of a
//! room's halves between their fronts (`pairing.rs`: decode's registration at
//! prefill's bootstrap, prefill's wait for it, prefill's word that its half ended,
//! engine messages the world carries).

mod behind;
#[cfg(test)]
mod behind_tests;
mod epochs;
mod halves;
mod killed;
mod pairing;
#[cfg(test)]
mod pairing_tests;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use behind::handle_behind;
pub use behind::router_traced;
pub use killed::LeftOpen;
pub use state::{
    pairing_wait_ns, FrontEffect, FrontInput, HalfEv, WorkerFront, EARLY_DONE, MAX_REGISTERED,
};
