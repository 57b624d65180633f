//! The READ handles of a pulled room, one per remote prefill rank (`EngineConfig::ranks`),
//! and the count that says the transfer ended: vLLM's NIXL connector under
//! heterogeneous TP (`_read_blocks_for_req` posts one transfer handle per remote TP
//! rank; the request's receive is done, or failed, only when every handle has been
//! polled to a final state, as vLLM #56104 made it). Rank `r` of `n` reads the room's
//! pages at positions `r, r + n, r + 2n, ...` of the page list: its slice (vLLM's
//! slice is a head range of every block; kvsim's KV has no heads, so a slice is a set
//! of whole pages: what the invariants judge, which destination bytes each handle
//! writes and when, is the same). With one rank there is one handle, the whole list.
//!
//! The count is where the four issue-37 class-1 switches live (`bugs.rs`):
//! `first-failed-handle-frees`, `failed-slice-counted-twice`,
//! `rejected-scatter-returns-ok`, `failed-handle-skipped`.

use super::state::DecodeNode;
use crate::bugs::Bug;
use crate::env::Outbox;
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};
use crate::kv::PageRecords;
use crate::msg::Msg;
use std::collections::BTreeSet;

/// The READ handles of one pulled room use still to be counted, and whether one that
/// was counted failed.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct Handles {
    /// The ranks whose handle has not completed (a handle's `WriteId::chunk` is its rank).
    pending: BTreeSet<u32>,
    failed: bool,
}

/// What counting one handle's completion decided for its room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Count {
    /// Not this room's pending handle (a repeat, a stale or unknown one): nothing.
    Ignored,
    /// Counted; sibling handles are still pending.
    Waiting,
    /// Every handle is counted (or the count says so): the transfer ended, `ok` when
    /// no counted handle failed.
    Ended { ok: bool },
}

/// The slice of rank `rank` of `ranks`: the pages at positions `rank`, `rank + ranks`,
/// ... of a page list of `len` pages.
pub(super) fn slice(len: usize, ranks: u32, rank: u32) -> impl Iterator<Item = usize> {
    (rank as usize..len).step_by(ranks.max(1) as usize)
}

/// How many handles a pull of `len` pages posts with `ranks` ranks: one per rank with
/// a page to read (at least one, so an empty pull still completes once). The prefill
/// counts as many notifications ([`crate::prefill_vllm`]).
pub fn handle_count(len: usize, ranks: u32) -> u32 {
    (ranks.max(1) as usize).min(len.max(1)) as u32
}

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// Post one READ of prefill's `src` into the room's `dst` per rank (each its slice,
    /// its id's chunk the rank), to `prefill`'s NIC, and record them as pending.
    pub(super) fn post_read(
        &mut self,
        room: RoomKey,
        prefill: NodeId,
        mut src: Vec<PageTag>,
        dst: Vec<PageTag>,
        env: &mut Outbox<G::Kv>,
    ) {
        // vLLM reads as many blocks as both sides list (its block ids are aligned).
        src.truncate(dst.len());
        let dst = &dst[..src.len()];
        let n = handle_count(src.len(), self.cfg.ranks);
        let mut pending = BTreeSet::new();
        for rank in 0..n {
            let id = WriteId {
                writer: self.id,
                epoch: self.pool.epoch(),
                room,
                chunk: rank,
            };
            let at: Vec<usize> = slice(src.len(), n, rank).collect();
            let read = Msg::KvRead {
                id,
                src: at.iter().map(|&i| src[i]).collect(),
                dst: at.iter().map(|&i| dst[i]).collect(),
            };
            env.send(prefill, read);
            pending.insert(rank);
        }
        assert_eq!(pending.len(), n as usize, "one handle per rank");
        let handles = Handles {
            pending,
            failed: false,
        };
        self.handles.insert(room, handles);
    }

    /// Count the completion of READ handle `id` (`ok`: its bytes landed). The
    /// defended count removes the handle once and ends the transfer when none is
    /// pending, failed if any failed: a failure is reported, and the pages let go,
    /// only once every sibling handle has stopped (vLLM #56104's fix).
    pub(super) fn count_handle(&mut self, id: WriteId, ok: bool) -> Count {
        let room = id.room;
        let bugs = self.cfg.bugs;
        let Some(h) = self.handles.get_mut(&room) else {
            return Count::Ignored;
        };
        if !h.pending.contains(&id.chunk) {
            return Count::Ignored;
        }
        if !ok && bugs.has(Bug::FailedHandleSkipped) {
            // vLLM #50754: logged (a log line, no event), neither counted nor failed.
            return Count::Waiting;
        }
        h.pending.remove(&id.chunk);
        if !ok && bugs.has(Bug::RejectedScatterReturnsOk) {
            // Mooncake #3000: nothing written, and the handle reports OK.
        } else if !ok {
            h.failed = true;
        }
        if !ok && bugs.has(Bug::FailedSliceCountedTwice) {
            // Mooncake #1865: the failed handle is counted again, for a sibling.
            let sibling = h.pending.iter().next().copied();
            if let Some(s) = sibling {
                h.pending.remove(&s);
            }
        }
        let first_failure_ends = !ok && bugs.has(Bug::FirstFailedHandleFrees);
        if !h.pending.is_empty() && !first_failure_ends {
            return Count::Waiting;
        }
        let ok = !h.failed;
        self.handles.remove(&room);
        Count::Ended { ok }
    }
}
