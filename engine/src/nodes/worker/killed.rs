//! What a killed decode front leaves behind: the rooms its stand-in for the router
//! opened and never cleared, read back from its own events ([`LeftOpen`]), and their
//! clearing by the next incarnation's process. Not the front's live clearing
//! (`epochs.rs`).

use crate::ids::{NodeId, RoomKey};
use crate::trace::TraceEvent;
use std::collections::BTreeMap;

/// The rooms a decode node's worker front opened (`routed` by the router it stands
/// in for, this node the decode half) and did not clear, fed the events of a killed
/// process's trace in order. A restart in process keeps the front, so only the rooms
/// still open at the kill died with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeftOpen {
    decode: NodeId,
    open: BTreeMap<RoomKey, NodeId>,
}

impl LeftOpen {
    /// The rooms decode node `decode`'s front left open.
    pub fn new(decode: NodeId) -> Self {
        LeftOpen {
            decode,
            open: BTreeMap::new(),
        }
    }

    /// One engine event of the killed process's trace.
    pub fn event(&mut self, ev: &TraceEvent) {
        match *ev {
            TraceEvent::Routed {
                node, room, decode, ..
            } if node != self.decode && decode == self.decode => {
                self.open.insert(room, node);
            }
            TraceEvent::RoomCleared { room, .. } => {
                self.open.remove(&room);
            }
            _ => {}
        }
    }

    /// What the next incarnation's process records for them: each is cleared. The
    /// router's connections to the killed process broke, so it has its answer (an
    /// error) and moves on to a new room, as the engine router lets go of an abandoned
    /// attempt; each prefill half still ends on its own, which the audit judges.
    pub fn cleared(self) -> Vec<TraceEvent> {
        let rooms = self.open.into_iter();
        rooms
            .map(|(room, node)| TraceEvent::RoomCleared { node, room })
            .collect()
    }
}
