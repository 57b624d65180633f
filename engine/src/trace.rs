//! Engine events for oracles, traces and reports.
//!
//! Nodes emit these through [`crate::env::Trace`]; they never read them back, so a
//! driver that drops them changes nothing. The JSON form (serde) is the `--trace-json`
//! schema documented in `docs/TRACE.md`.

use crate::ids::{Generation, NodeId, PageTag, RequestId, RoomKey};
use crate::msg::Status;
use serde::{Deserialize, Serialize};

/// Which half of a room an event is about.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Side {
    Prefill,
    Decode,
}

/// How pages left their owner.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReleaseKind {
    /// Checked release by the owner (held pages drain first).
    Owner,
    /// Upstream's unchecked free (only bug switches take this path).
    Unchecked,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum TraceEvent {
    /// The half accepted the request: a sender (prefill) or receiver (decode) exists.
    Admitted {
        node: NodeId,
        room: RoomKey,
        side: Side,
        prompt_len: u64,
    },
    /// The half rejected the request at intake, before any resource was taken.
    Rejected {
        node: NodeId,
        room: RoomKey,
        side: Side,
        status: Status,
        reason: String,
    },
    /// The prompt was cut to the node's admission limit (`allow_auto_truncate`).
    Truncated {
        node: NodeId,
        room: RoomKey,
        from: u64,
        to: u64,
    },
    /// The legacy rejection: error parked in `to_finish`, prompt swapped for a
    /// 1-token placeholder, request still live (only under `gate-checks-finished-only`).
    RejectedLegacy {
        node: NodeId,
        room: RoomKey,
        prompt_len: u64,
    },
    PagesReserved {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    PagesReleased {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
        how: ReleaseKind,
    },
    Quarantined {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// Quarantined pages returned to the pool after the drain ack for `acked`.
    QuarantineReleased {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
        acked: RoomKey,
    },
    /// Prefill issued a chunk write.
    KvSent {
        node: NodeId,
        room: RoomKey,
        chunk: u32,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    /// A chunk write landed in decode's pool.
    KvLanded {
        node: NodeId,
        room: RoomKey,
        chunk: u32,
        dst: Vec<PageTag>,
    },
    /// A chunk write was refused because a destination tag is stale or not the room's.
    KvRefused {
        node: NodeId,
        room: RoomKey,
        chunk: u32,
        tag: PageTag,
        reason: String,
    },
    /// Decode accepted a transfer as complete and will run the request.
    TransferAccepted {
        node: NodeId,
        room: RoomKey,
        prompt_len: u64,
        reserved_pages: u32,
        sent_tokens: u64,
        sent_pages: u32,
        fully_written: bool,
    },
    /// Decode refused or lost a transfer.
    TransferFailed {
        node: NodeId,
        room: RoomKey,
        reason: String,
    },
    /// The request joined a running batch (prefill forward or decode batch).
    Running {
        node: NodeId,
        room: RoomKey,
        side: Side,
    },
    /// One decode step attended over `pages` (the tags the request expects).
    Attend {
        node: NodeId,
        room: RoomKey,
        step: u32,
        query_pos: u64,
        seq_len: u64,
        pages: Vec<PageTag>,
    },
    /// The page-tag check found a page whose generation moved on.
    TagMismatch {
        node: NodeId,
        room: RoomKey,
        tag: PageTag,
        current: Generation,
    },
    /// An abort became visible to this half.
    AbortNoted {
        node: NodeId,
        room: RoomKey,
        side: Side,
    },
    /// The half's one terminal status for the room.
    Responded {
        node: NodeId,
        room: RoomKey,
        side: Side,
        status: Status,
    },
    /// The router answered the client.
    RouterResponse {
        node: NodeId,
        req: RequestId,
        room: Option<RoomKey>,
        status: Status,
        tokens: usize,
    },
    /// The router cleared a room (both halves answered).
    RoomCleared { node: NodeId, room: RoomKey },
    /// Prefill acked a drain request.
    DrainAcked { node: NodeId, room: RoomKey },
    /// The node stopped itself loudly rather than risk a silent leak.
    Fatal { node: NodeId, reason: String },
}

impl TraceEvent {
    /// The room the event is about, if any.
    pub fn room(&self) -> Option<RoomKey> {
        use TraceEvent::*;
        match self {
            Admitted { room, .. }
            | Rejected { room, .. }
            | RejectedLegacy { room, .. }
            | Truncated { room, .. }
            | PagesReserved { room, .. }
            | PagesReleased { room, .. }
            | Quarantined { room, .. }
            | QuarantineReleased { room, .. }
            | KvSent { room, .. }
            | KvLanded { room, .. }
            | KvRefused { room, .. }
            | TransferAccepted { room, .. }
            | TransferFailed { room, .. }
            | Running { room, .. }
            | Attend { room, .. }
            | TagMismatch { room, .. }
            | AbortNoted { room, .. }
            | Responded { room, .. }
            | RoomCleared { room, .. }
            | DrainAcked { room, .. } => Some(*room),
            RouterResponse { room, .. } => *room,
            Fatal { .. } => None,
        }
    }
}
