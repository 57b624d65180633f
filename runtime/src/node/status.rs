//! What one node reports about itself ([`NodeStatus`], with the counts of its own
//! events, [`NodeCounts`]). Not how the report is asked for (`NodeEvent::Status`) nor
//! how a front renders it.

use kvsim_engine::ids::NodeId;
use kvsim_engine::node::Role;
use serde::Serialize;

/// What one node reports about itself.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub node: NodeId,
    pub role: Role,
    pub epoch: u32,
    /// Free pages and pool size (prefill and decode nodes).
    pub free_pages: Option<usize>,
    pub pool_pages: Option<usize>,
    /// Live rooms (router), requests and quarantined rooms (prefill, decode).
    pub live: usize,
    pub quarantined: usize,
    /// Pages those quarantined rooms hold (decode).
    pub quarantined_pages: usize,
    /// Set when the node stopped itself, was restarted in process, or broke one of
    /// its own invariants.
    pub fault: Option<String>,
    /// Counts of this node's refusals and failures since it started.
    pub counts: NodeCounts,
}

/// What a node's own events counted (the HTTP front's `/metrics`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct NodeCounts {
    /// Decode reads refused because a page's tag did not match (defense 4).
    pub tag_mismatches: u64,
    /// KV writes the receiver refused.
    pub kv_refused: u64,
    /// KV writes whose completion said they failed (the writer's side).
    pub transfers_failed: u64,
}

impl NodeStatus {
    /// Nothing in flight and, for a pool, every page free.
    pub fn quiescent(&self) -> bool {
        self.live == 0 && self.quarantined == 0 && self.free_pages == self.pool_pages
    }
}
