//! The decode node's invariants and its read-only queries for drivers and tests.
//! It changes no state.

use super::state::{DecodeNode, DecodePhase, Phase};
use crate::gpu::Gpu;
use crate::ids::{PageTag, RoomKey};
use crate::invariant::{Invariant, Violation};
use crate::kv::{PagePool, PageRecords, PageState};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// S1/S8 on the pool; every owned page belongs to a live request or a quarantine
    /// that lists it, and vice versa. Linear in the pool size (drivers call it after
    /// every event, so the page -> holder map is a compact index, not a copy of keys).
    pub fn invariants(&self) -> Result<(), Violation> {
        self.pool.with_pool(|pool| self.invariants_with(pool))
    }

    pub(super) fn invariants_with(&self, pool: &PagePool) -> Result<(), Violation> {
        pool.invariants()?;
        // holders[i]: 1 + the index in `lists` of the list that holds page i (0: none).
        let mut holders: Vec<u32> = vec![0; pool.capacity() + 1];
        let lists: Vec<(&RoomKey, &[PageTag], bool)> = self
            .requests
            .iter()
            .map(|(k, r)| (k, r.phase.pages(), false))
            .chain(self.quarantine.iter().map(|(k, q)| (k, &q.pages[..], true)))
            .collect();
        for (idx, (_, pages, _)) in lists.iter().enumerate() {
            for t in pages.iter() {
                if let Some(slot) = holders.get_mut(t.page.0 as usize) {
                    *slot = idx as u32 + 1;
                }
            }
        }
        for (page, rec) in pool.records() {
            let Some(owner) = rec.owner else { continue };
            let held_by = match holders[page.0 as usize] {
                0 => None,
                h => lists.get(h as usize - 1).map(|(k, _, q)| (**k, *q)),
            };
            let ok = held_by == Some((owner, rec.state == PageState::Quarantined));
            if !ok {
                return Err(Violation::new(
                    Invariant::S1,
                    format!(
                        "decode {}: {page} is {} for {owner}, which does not hold it",
                        self.id, rec.state
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The phase of a room use on this node: a live request, or a quarantine waiting
    /// for its drain ack; `None` otherwise.
    pub fn room_phase(&self, room: RoomKey) -> Option<DecodePhase> {
        if let Some(r) = self.requests.get(&room) {
            return Some(match &r.phase {
                Phase::Prealloc => DecodePhase::Prealloc,
                Phase::Transferring { pages, dst_pages } => DecodePhase::Transferring {
                    written: pages[..*dst_pages]
                        .iter()
                        .map(|t| matches!(self.unwritten(room, &[*t]), Ok(None)))
                        .collect(),
                },
                Phase::Running { seq_len, step, .. } => DecodePhase::Running {
                    step: *step,
                    seq_len: *seq_len,
                },
            });
        }
        self.quarantine
            .get(&room)
            .map(|q| DecodePhase::Quarantined { retries: q.retries })
    }

    /// Every page reserved for a live room use (prompt pages first), or the pages of
    /// its quarantine.
    pub fn room_pages(&self, room: RoomKey) -> Option<Vec<PageTag>> {
        match self.requests.get(&room) {
            Some(r) => Some(r.phase.pages().to_vec()),
            None => self.quarantine.get(&room).map(|q| q.pages.clone()),
        }
    }

    /// Whether this node retired the room use (any message for it is stale).
    pub fn is_retired(&self, room: RoomKey) -> bool {
        self.is_stale(room)
    }
}
