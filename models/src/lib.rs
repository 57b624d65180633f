//! kvsim-models: stateright models of the prefill-to-decode handoff, on the engine's
//! own nodes.
//!
//! Every transition of a model calls the engine's real `Router`, `PrefillNode` and
//! `DecodeNode` (with `SymbolicGpu`, whose per-page provenance decides S3) through
//! their one input handler, and applies the effects they record in an `Outbox`. Only
//! the environment is written here: clients that send normal, over-length and
//! aborting requests; a network of FIFO channels that may lose, duplicate and reorder
//! control messages, and on which KV writes and their completions are messages too
//! (late or failed, never lost or duplicated), so a write that lands after an abort
//! is explored; timers that fire in any order; and, in `crash-race`, one crash of
//! the prefill or the decode node with an immediate restart into a new incarnation
//! (the simulator's semantics: its timers die, messages to it are lost, a KV write to
//! it fails back to its writer, its own writes in flight are flushed, and a write
//! addressed to a dead incarnation's pages fails). A timer always may fire once
//! nothing else can happen; one that fires while a message is still in flight or a
//! scheduler tick is pending (a premature timeout: the network was slower than the
//! timer) is a bounded fault like a lost message, because unbounded premature timeouts
//! multiply the space a hundredfold. The oracle is the simulator's (`kvsim_oracle`'s
//! `OracleState`), evaluated inside each transition.
//!
//! Why a hand-written [`stateright::Model`] rather than an `ActorModel`: the engine's
//! nodes already are actors with their own message and timer vocabulary, and wrapping
//! them in stateright's actor runtime would re-encode both (its `Out` and timer types)
//! for nothing. More importantly, a hand-written model decides in `actions()` which
//! steps are enabled (a message at the head of its channel, a fault with budget left,
//! a timeout that is not premature or has budget) so a disabled step costs no clone of
//! the state; an `ActorModel` generates a successor for every deliverable envelope and
//! timer and only then finds that nothing changed. And the model can share the nodes
//! a transition does not touch ([`shared::Shared`]), so a successor costs one node
//! clone, not three.
//!
//! Speed: a handler is a pure function of (node, input), so the model computes each
//! distinct node step once per thread and reuses its effect when another
//! interleaving takes the same step ([`memo`]); more than 99 % of the steps of the
//! standard models are such repeats. Every oracle check still runs on every
//! transition. [`check::MemoMode`] turns the cache off or verifies every reuse.
//!
//! The standard models, their bounds and their pinned state counts are in
//! [`spec::ModelSpec`] and this crate's tests; `kvsim check` runs them
//! ([`check::check`]); every counterexample is a [`schedule::Schedule`] that
//! [`replay::replay`] runs through the simulator's nodes and oracle.

pub mod check;
pub mod memo;
pub mod model;
pub mod replay;
pub mod schedule;
pub use kvsim_oracle::shared;
pub mod model_state;
pub mod spec;
mod standard;
mod standard_ranks;
mod standard_rooms;
mod standard_vllm;
pub mod two_phase;
pub mod view;

pub use check::{
    check, check_with_progress, CheckOptions, CheckReport, MemoMode, Progress, Verdict,
};
pub use model::{names, representative, HandoffModel, StepLog};
pub use model_state::{Action, Envelope, State};
pub use schedule::Schedule;
pub use spec::{ClientSpec, FaultBounds, ModelSpec, SpecError};
