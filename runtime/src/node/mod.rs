//! One node's event loop.
//!
//! The loop owns the node (an unchanged engine state machine, the engine's own
//! [`Node`](kvsim_engine::node::Node)), its timers and the loop's own rules. It takes
//! one [`NodeEvent`] at a time from its runtime (a message read off a connection, a
//! fired timer, a landing reported by the node's landing, a send that failed, a
//! client's request) and feeds the node one input, then carries out the node's
//! effects in the order issued through [`kvsim_engine::world::apply`]. Channels, the
//! clock, the links to peers and the trace file are behind
//! [`NodeRuntime`](crate::seam::NodeRuntime) ([`crate::seam`]), so the loop also runs
//! in process.
//! What a failed send means (a KV write fails back with one failed completion, any
//! other message is lost) is [`kvsim_engine::world::arrival`]'s rule, as in every
//! driver.
//!
//! A decode node's KV writes do not pass through its loop: they land off its
//! connections ([`crate::landing`]) by the engine's landing rule, gated by the node's
//! one ownership record (the `SharedPool` its loop decides with), concurrently with
//! the loop, and each landing is reported to the loop, where the node traces it and
//! completes the write.
//!
//! The loop's parts, each a module: its inputs (`event`), the answers a client hears
//! (`reply`), what a node reports (`status`), how one input steps the node
//! (`step`), what carries out the node's effects (`io`), the loop's turns
//! (`node_loop`), which of a router's tokens reach a client's stream as they are
//! made (`stream`), and worker mode's halves (`halves`).

pub(crate) mod event;
mod halves;
pub(crate) mod io;
pub(crate) mod node_loop;
pub(crate) mod reply;
pub(crate) mod status;
pub(crate) mod step;
mod stream;

pub use crate::landing::{transfer_thread, LandingRecord, WireLanding};
pub use event::NodeEvent;
pub use io::Io;
pub use node_loop::NodeLoop;
pub use reply::{Reply, ReplyEv, ReplySink};
pub use status::{NodeCounts, NodeStatus};
pub use step::{RuntimeNode, IDLE_PASS_NS};

use crate::clock::wall_ns;

/// Wall-clock time, re-exported for the server's reports.
pub fn now_wall_ns() -> u64 {
    wall_ns()
}
