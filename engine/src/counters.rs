//! `Counters`: what a node counts for operators (metrics), outside its state.
//!
//! Counts only ever grow, so keeping them in a node's hashed state would make every
//! refusal a new model-checker state for nothing. Like [`crate::Cfg`], they are part of
//! a node's value but not of its state: `Hash` and `Eq` ignore them. Nothing in the
//! engine reads them back to decide anything.

use crate::ids::{NodeId, RoomKey};
use crate::msg::Msg;
use crate::trace::{NodeFault, Trace, TraceEvent};
use std::hash::{Hash, Hasher};

#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Messages about a room refused because they came from a node that is not that
    /// room's peer.
    pub peer_refused: u64,
    /// Decode reads the page-tag check refused (defense 4).
    pub tag_mismatches: u64,
    /// KV writes the receiver's software refused (landing-time tag check, malformed
    /// writes), on a transport whose receiver copies each write; on one-sided RDMA the
    /// NIC refuses (the world traces `KvRefused`) and no software counts it.
    pub writes_refused: u64,
    /// Transfers decode failed (failure reports, verification, timeouts).
    pub transfers_failed: u64,
    /// Faults the node reported about itself.
    pub faults: u64,
}

impl Hash for Counters {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

impl PartialEq for Counters {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Counters {}

impl Counters {
    /// `node` refuses message `kind` about `room` from `from`, a node that is not that
    /// room's peer: count it and say so. Every node refuses the same way.
    pub fn refuse_peer<E: Trace + ?Sized>(
        &mut self,
        env: &mut E,
        node: NodeId,
        from: NodeId,
        room: Option<RoomKey>,
        kind: &str,
        reason: String,
    ) {
        self.peer_refused += 1;
        env.trace(TraceEvent::PeerRefused {
            node,
            from,
            room,
            msg: kind.to_string(),
            reason,
        });
    }

    /// `node`'s peer check of `msg` from `from` gave `verdict`: a refusal is counted and
    /// stated ([`Counters::refuse_peer`]). `true`: the message is admitted.
    pub fn admit_peer<E: Trace + ?Sized>(
        &mut self,
        env: &mut E,
        (node, from): (NodeId, NodeId),
        msg: &Msg,
        verdict: Result<(), String>,
    ) -> bool {
        let before = self.peer_refused;
        let admitted = match verdict {
            Ok(()) => true,
            Err(reason) => {
                self.refuse_peer(env, node, from, msg.room(), msg.kind(), reason);
                false
            }
        };
        // Counter bookkeeping, not page safety: debug only.
        debug_assert_eq!(self.peer_refused, before + u64::from(!admitted));
        admitted
    }

    /// `node` reports a fault of its own (drivers act on it): count it and say so.
    pub fn fault<E: Trace>(&mut self, env: &mut E, node: NodeId, fault: NodeFault) {
        self.faults += 1;
        env.trace(TraceEvent::Fault { node, fault });
    }
}
