//! A process's nodes: start them (all of a topology on loopback, or one node of a
//! deployment), serve clients, report status, and end gracefully.

//!
//! The server's parts: what it is asked to run (`options`), the engine node of each
//! role (`roles`), a node's trace files across its incarnations (`incarnations`), the
//! running nodes (`process`), what carries their KV besides the links (`kv_wire`) and what they report (`report`).

pub(crate) mod incarnations;
pub(crate) mod kv_wire;
pub(crate) mod options;
pub(crate) mod process;
pub(crate) mod report;
pub(crate) mod roles;

pub use options::{KvWire, NodePlan, PromptMode, ServeError, ServeOptions};
pub use process::Server;
pub use report::ExitReport;
