//! What one run hit, counted as it runs: the engine paths of [`PATHS`] and the cancel
//! phases of [`CANCEL_PHASES`] by index, and the protocol paths the run reached.
//! Fixed arrays, no allocation on the hot path. Not the sweep's named counts (the
//! parent [`Coverage`](super::Coverage) adds runs up).

use crate::reach::ReachSet;
use crate::scenario::{Cancel, CancelAt, ReqPhase};
use kvsim_engine::trace::TraceEvent;
use serde::Serialize;

/// The engine paths a sweep reports: the events of the defensive and error paths
/// (the happy path's events happen in every run that serves a request).
pub const PATHS: [&str; 16] = [
    "Rejected",
    "Truncated",
    "RejectedLegacy",
    "Quarantined",
    "QuarantineReleased",
    "PagesHeld",
    "PagesZeroed",
    "KvRefused",
    "TransferRefused",
    "TransferFailed",
    "TagMismatch",
    "AbortNoted",
    "DrainAcked",
    "PeerRefused",
    "Fault",
    // The `sglang-router` policy retried an attempt in a new room.
    "RouterRetried",
];

/// The index of `ev` in [`PATHS`], or `None` for an event of the happy path.
pub fn path_index(ev: &TraceEvent) -> Option<usize> {
    use TraceEvent::*;
    Some(match ev {
        Rejected { .. } => 0,
        Truncated { .. } => 1,
        RejectedLegacy { .. } => 2,
        Quarantined { .. } => 3,
        QuarantineReleased { .. } => 4,
        PagesHeld { .. } => 5,
        PagesZeroed { .. } => 6,
        KvRefused { .. } => 7,
        TransferRefused { .. } => 8,
        TransferFailed { .. } => 9,
        TagMismatch { .. } => 10,
        AbortNoted { .. } => 11,
        DrainAcked { .. } => 12,
        PeerRefused { .. } => 13,
        Fault { .. } => 14,
        RouterRetried { .. } => 15,
        _ => return None,
    })
}

/// The cancel phases a sweep reports: the phases of [`ReqPhase::ALL`] (any decoding
/// step counts as `decoding`), then a cancel at a drawn time after submission.
pub const CANCEL_PHASES: [&str; 9] = [
    "prefill-admitted",
    "decode-reserved",
    "kv-sent",
    "kv-landed",
    "transfer-accepted",
    "decoding",
    "prefill-answered",
    "answered",
    "after-time",
];

pub(super) fn phase_index(phase: ReqPhase) -> usize {
    match phase {
        ReqPhase::PrefillAdmitted => 0,
        ReqPhase::DecodeReserved => 1,
        ReqPhase::KvSent => 2,
        ReqPhase::KvLanded => 3,
        ReqPhase::TransferAccepted => 4,
        ReqPhase::Decoding(_) => 5,
        ReqPhase::PrefillAnswered => 6,
        ReqPhase::Answered => 7,
    }
}

/// The index of a fired cancel in [`CANCEL_PHASES`].
pub fn cancel_index(c: &Cancel) -> usize {
    match c.at {
        CancelAt::Phase { phase, .. } => phase_index(phase),
        CancelAt::AfterNs(_) => 8,
    }
}

/// What one run hit, counted as it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunCoverage {
    /// Events of each of [`PATHS`].
    pub paths: [u64; PATHS.len()],
    /// Cancels that fired, by [`CANCEL_PHASES`].
    pub cancels: [u64; CANCEL_PHASES.len()],
    /// The protocol paths the run reached.
    pub reach: ReachSet,
}

impl RunCoverage {
    pub fn event(&mut self, ev: &TraceEvent) {
        if let Some(i) = path_index(ev) {
            self.paths[i] = self.paths[i].saturating_add(1);
        }
    }

    pub fn cancel(&mut self, c: &Cancel) {
        let i = cancel_index(c);
        self.cancels[i] = self.cancels[i].saturating_add(1);
    }
}
