//! The world around the nodes, stated once: the topology, how a driver carries out a
//! node's effects, and what the network, the NICs, the timers and a crash do.
//!
//! Every driver goes through here: the simulator (virtual time, seeded faults), the
//! model checker (every interleaving, bounded faults), the counterexample replayer and
//! the hand-stepped test driver ([`crate::harness`]); the hardware runtime uses the
//! parts that are not real I/O (the topology, the fates of writes at a crash). Nothing
//! here reads a clock or draws a random number: a driver decides *when* and *whether*
//! (a delay, a loss, an injected failure), and these functions say *what follows*.
//!
//! The fault model is RDMA's for KV writes (a write lands once or fails with exactly
//! one failed completion to its writer, never silently lost or duplicated; a
//! completion is the writer NIC's own report and no partition loses it) and an
//! unreliable network for control messages (lost, duplicated, delayed, reordered).
//! A crashed node's incarnation dies with its timers, its memory registrations (KV
//! writes to it fail back; control messages and completions to it reach its restarted
//! incarnation late, which must ignore what belongs to the dead one) and its NIC's
//! queue (its own writes are flushed, never applied); a write addressed with page tags of an earlier incarnation of its
//! receiver fails, because the memory registration it names is gone.

mod apply;
mod arrival;
mod collide;
mod crash;
mod data_faults;
pub(crate) mod read;
mod receive;
mod timers;
mod topology;
mod writes;

#[cfg(test)]
mod tests;

pub use crate::msg::Carried;
pub use crate::step::{step, Stepper};
pub use crate::transport::KvTransport;
pub use apply::{apply, Driver};
pub use arrival::{
    arrival, failed_completion, poster, transport, write_arrival, Arrival, Arriving, DropReason,
    Transport, WriteFailure,
};
pub use collide::{colliding_prompt, colliding_starts, COLLIDING_REQ};
pub use crash::{
    crash_failure, crash_fate, restart, CrashFate, CrashWalk, Flying, Incarnation, Travel,
};
#[cfg(feature = "testing")]
pub use data_faults::{alter, duplicate_completion, stale_landing, WriteHistory};
pub use data_faults::{Altered, DataFault, DUPLICATE_WINDOW};
pub use read::{is_read_response, serve_read};
pub use receive::{copy_in, receive, Receiver};
pub use timers::Timers;
pub use topology::{Topology, ROUTER};
pub use writes::WritesInFlight;
