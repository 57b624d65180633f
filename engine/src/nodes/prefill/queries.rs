//! The prefill node's invariants and its read-only queries for drivers and tests.
//! It changes no state.

use super::state::{Phase, PrefillNode, PrefillPhase};
use crate::gpu::Gpu;
use crate::ids::{NodeId, RoomKey};
use crate::invariant::{Invariant, Violation};
use crate::msg::TransferOutcome;

impl<G: Gpu> PrefillNode<G> {
    /// S1/S8 on the pool, and every page owned by a live request or draining.
    pub fn invariants(&self) -> Result<(), Violation> {
        self.pool.invariants()?;
        for (page, rec) in self.pool.records() {
            if let Some(owner) = rec.owner {
                if !self.requests.contains_key(&owner) {
                    return Err(Violation::new(
                        Invariant::S1,
                        format!(
                            "prefill {}: {page} is owned by {owner}, which is not live",
                            self.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The phase of a live room use, `None` when this node has no request for it.
    pub fn room_phase(&self, room: RoomKey) -> Option<PrefillPhase> {
        Some(match &self.requests.get(&room)?.phase {
            Phase::Bootstrapping => PrefillPhase::Bootstrapping,
            Phase::Waiting { .. } => PrefillPhase::Waiting,
            Phase::Forward { pages, .. } => PrefillPhase::Forward {
                pages: pages.clone(),
            },
            Phase::Sending {
                next_page,
                in_flight,
                ..
            } => PrefillPhase::Sending {
                next_page: *next_page,
                in_flight: *in_flight,
            },
            Phase::Inflight { outcome, .. } => PrefillPhase::Inflight {
                success: matches!(outcome, TransferOutcome::Success { .. }),
            },
        })
    }

    /// The nodes whose page lists for a room use are kept, when they arrived before
    /// the room's start message.
    /// The decode node still owed the news that `room` failed here (its page list has
    /// not come yet), if any.
    pub fn owes_failure_to(&self, room: RoomKey) -> Option<NodeId> {
        self.owed_failure
            .get(room.room)
            .filter(|(gen, _)| *gen == room.gen)
            .map(|(_, decode)| *decode)
    }

    pub fn early_meta_from(&self, room: RoomKey) -> Vec<NodeId> {
        self.early_meta
            .range((room, NodeId(0))..=(room, NodeId(u16::MAX)))
            .map(|((_, from), _)| *from)
            .collect()
    }

    /// The node a drain ack for this room use is owed to, if one was asked for and
    /// not yet sent.
    pub fn drain_owed_to(&self, room: RoomKey) -> Option<NodeId> {
        self.outstanding.get(&room)?.drain_requested_by
    }

    /// Whether this node retired the room use (any message for it is stale).
    pub fn is_retired(&self, room: RoomKey) -> bool {
        self.is_stale(room)
    }
}
