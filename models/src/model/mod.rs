//! `HandoffModel`: the stateright model whose transitions call the engine's own nodes.
//!
//! Each action is one environment decision (a client submits or disconnects, the
//! network delivers, loses, duplicates or fails a message, a timer fires, a node
//! crashes). Its transition feeds exactly one input to one real node through the
//! node's handler with an `Outbox`, then carries out the recorded effects in the
//! order the handler issued them through the world module every driver uses
//! (`kvsim_engine::world`: sends go in flight, timers are set or cancelled with the
//! world's timer semantics, events go to the oracle), and decides what the world does
//! to a message with the same rules as the simulator (`world::arrival`,
//! `world::crash_fate`). Nothing about the engine is re-specified here: only the
//! environment's choices are model-side.
//!
//! Oracle. The state carries the oracle's model of the run (`kvsim_oracle::
//! OracleState`, the one implementation of every invariant that the simulator and
//! `kvsim audit` use), fed the same records the simulator's trace holds: engine
//! events, client submits, failed writes, crashes and restarts. A transition whose
//! records produce a finding (a violation, or a hazard a defense had to stop) sets the
//! invariant's bit in [`Book::violations`](crate::model_state::Book::violations); the `always` properties read those bits,
//! and the quiescence property asks the oracle's end-of-run check (L1-L4) of every
//! state where nothing is left to do.
//!
//! The files: `handoff` holds the model's data and its initial state; `actions` is
//! its `stateright::Model` face (which actions a state enables); `tx` carries one
//! action out through the nodes, with `delivery` (messages that arrive, fail or land
//! altered) and `crash` (a node's crash and restart); `properties` are the `always`
//! and `sometimes` conditions, under the [`names`] the CLI and the tests use.

mod actions;
mod crash;
mod delivery;
mod handoff;
pub mod names;
mod properties;
mod tx;

pub use handoff::{representative, HandoffModel};
pub use tx::StepLog;
