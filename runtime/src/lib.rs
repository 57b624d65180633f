//! kvsim-runtime: the engine's unchanged nodes on operating-system threads, a
//! monotonic clock and TCP.
//!
//! One event loop per node ([`node::NodeLoop`], over the seam of its inputs and outputs,
//! [`seam::NodeRuntime`], so it also runs in process), a decode node's KV writes landed
//! off its connections through the node's shared ownership record ([`landing`]), TCP
//! between nodes with length-prefixed frames of the engine's own serde messages, a KV
//! write's payload following its head as raw bytes ([`wire`], [`net`]),
//! a line-delimited JSON client endpoint ([`client`]), and per-node trace files in the
//! documented schema with wall-clock timestamps ([`trace`]). No engine logic lives
//! here: what a failed send means, how a write lands and what a node decides all come
//! from `kvsim-engine`.

pub mod bench;
pub mod client;
pub mod clock;
pub mod device;
pub mod gather;
pub mod gpu;
pub mod http;
pub mod http_client;
pub mod kvpath;
pub mod landing;
pub mod net;
#[cfg(feature = "nixl")]
pub mod nixl;
pub mod node;
pub mod seam;
pub mod server;
pub mod sync;
pub mod tokenizer;
pub mod trace;
pub mod wire;
pub mod worker;

pub use client::{Answer, Client};
pub use node::{NodeStatus, Reply};
pub use server::{ExitReport, NodePlan, PromptMode, ServeError, ServeOptions, Server};
