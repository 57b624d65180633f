//! A decode front's room clearing: a room is cleared once both its halves are
//! terminal, traced as the engine router traces it; and the epoch rule, by which a
//! prefill node's later incarnation ends the prefill halves registered at its earlier
//! ones. Not the halves themselves (`halves.rs`).

use super::state::{FrontEffect, WorkerFront};
use crate::ids::{NodeId, RoomKey};
use crate::msg::Side;
use crate::trace::TraceEvent;

impl WorkerFront {
    /// `side`'s half of a decode room is terminal: with both, the room is cleared.
    pub(super) fn half_done(&mut self, room: RoomKey, side: Side, out: &mut Vec<FrontEffect>) {
        let Some(c) = self.clearing.get_mut(&room) else {
            return;
        };
        match side {
            Side::Decode => c.decode_done = true,
            Side::Prefill => c.prefill_done = true,
        }
        if c.decode_done && c.prefill_done {
            self.clearing.remove(&room);
            out.push(FrontEffect::Trace(TraceEvent::RoomCleared {
                node: self.router,
                room,
            }));
        }
    }

    /// Prefill node `prefill`'s bootstrap answered as incarnation `epoch`. A later
    /// incarnation means the process of every earlier one was killed (a restart in
    /// process keeps the process's worker front and its first epoch), and its halves
    /// died with it: the restarted node's trace begins with the `crash` that forgets
    /// them, and no word of their end can come (the dead process would have sent it).
    /// So the prefill half of every room registered at an earlier incarnation is
    /// terminal; a room whose decode half is terminal too is cleared.
    pub(super) fn prefill_incarnation(
        &mut self,
        prefill: NodeId,
        epoch: u32,
        out: &mut Vec<FrontEffect>,
    ) {
        let known = self.prefill_epochs.entry(prefill).or_insert(epoch);
        if epoch <= *known {
            return;
        }
        *known = epoch;
        let dead: Vec<RoomKey> = self
            .clearing
            .iter()
            .filter(|(_, c)| c.at.is_some_and(|(p, e)| p == prefill && e < epoch))
            .map(|(room, _)| *room)
            .collect();
        for room in dead {
            self.half_done(room, Side::Prefill, out);
        }
    }
}
