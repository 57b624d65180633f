//! Engine events: the facts a node states about what it did, for oracles and traces.
//!
//! Nodes emit these through [`crate::env::Trace`] in the order things happen; they
//! never read them back, so a driver that drops them changes nothing. Together with the
//! driver's own records (deliveries, failed writes, crashes, client responses) they are
//! the documented trace schema (`docs/TRACE.md`): every fact an oracle needs to judge a
//! run is an event here, so a run can be judged from its trace alone, by a checker that
//! never saw the engine's memory. In particular every change of a page's ownership
//! record and every write into KV memory is an event, with the page generations and the
//! writing room use.

use crate::ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId,
};
pub use crate::msg::Side;
use crate::msg::Status;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A sink for engine events that oracles and traces read. Never read back by the engine.
pub trait Trace {
    fn trace(&mut self, event: TraceEvent);
}

/// How pages left their owner.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReleaseKind {
    /// Checked release by the owner (held pages drain first).
    Owner,
    /// Upstream's unchecked free (only bug switches take this path).
    Unchecked,
}

/// What decode states about a transfer it accepted or refused: the completion's
/// sender, decode's own counts (the prompt length it expects, the pages it reserved,
/// whether every one was written) and prefill's reported counts. In the trace its
/// fields stand in the event itself (`TransferAccepted`, `TransferRefused`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TransferClaim {
    pub from: NodeId,
    pub prompt_len: u64,
    pub reserved_pages: u32,
    pub sent_tokens: u64,
    pub sent_pages: u32,
    pub fully_written: bool,
}

/// What a driver does about a [`NodeFault`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FaultAction {
    /// The node stopped itself: it takes no new request from here on, keeps draining
    /// what it holds, and says so (status, health, exit code). Drivers record it.
    Stop,
    /// The node's own bookkeeping can no longer be trusted: the driver restarts it into a
    /// new incarnation, whose epoch makes every page tag handed out before stale.
    Restart,
    /// An anomaly worth reporting that needs no action.
    Report,
}

/// A failure a node reports about itself, typed so that drivers can act on it and
/// oracles can read it. A handler never drops an internal error silently: it becomes
/// one of these.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "fault")]
#[non_exhaustive]
pub enum NodeFault {
    /// Decode: no drain ack for a quarantined room use after `retries` requests. The
    /// pages stay quarantined (a timeout never releases them: a write may still land)
    /// and the node stops taking new requests; it keeps asking.
    DrainAckMissing { room: RoomKey, retries: u32 },
    /// The node's own page record refused an operation the node's logic asked for
    /// (`op`), so its bookkeeping and its record disagree.
    PageRecordRefused {
        room: Option<RoomKey>,
        op: String,
        error: String,
    },
    /// A hold on a page could not be let go: the page left its holder's reach (only
    /// upstream's unchecked free, a bug switch, causes it).
    HoldLost { tag: PageTag, error: String },
    /// The KV memory refused a write of this room use whole (positions past its page
    /// list, a page outside the pool) instead of dropping part of it; the node fails
    /// the request.
    WriteRefused { room: RoomKey, error: String },
    /// The node's device failed in `op` (a driver call, a launch, a copy) while serving
    /// `room` (`None`: no one request, such as zeroing freed pages). The node fails
    /// that request with `Why::DeviceFailed` and releases its pages; it goes on.
    DeviceFailed {
        room: Option<RoomKey>,
        op: String,
        error: String,
    },
}

impl NodeFault {
    /// The node's page record refused `op` on `room`'s pages with `error`.
    pub fn record_refused(room: RoomKey, op: &str, error: impl fmt::Display) -> Self {
        let fault = NodeFault::PageRecordRefused {
            room: Some(room),
            op: op.to_string(),
            error: error.to_string(),
        };
        assert!(!op.is_empty(), "a refused record operation is named");
        assert_eq!(fault.action(), FaultAction::Restart);
        fault
    }

    /// What the driver does about it.
    pub fn action(&self) -> FaultAction {
        match self {
            NodeFault::DrainAckMissing { .. } => FaultAction::Stop,
            NodeFault::PageRecordRefused { .. } => FaultAction::Restart,
            NodeFault::HoldLost { .. }
            | NodeFault::WriteRefused { .. }
            | NodeFault::DeviceFailed { .. } => FaultAction::Report,
        }
    }

    pub fn room(&self) -> Option<RoomKey> {
        match self {
            NodeFault::DrainAckMissing { room, .. } => Some(*room),
            NodeFault::PageRecordRefused { room, .. } => *room,
            NodeFault::HoldLost { .. } => None,
            NodeFault::WriteRefused { room, .. } => Some(*room),
            NodeFault::DeviceFailed { room, .. } => *room,
        }
    }
}

impl fmt::Display for NodeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeFault::DrainAckMissing { room, retries } => write!(
                f,
                "no drain ack for {room} after {retries} requests; its pages stay quarantined and the node takes no new request"
            ),
            NodeFault::PageRecordRefused { room, op, error } => match room {
                Some(r) => write!(f, "the page record refused {op} for {r}: {error}"),
                None => write!(f, "the page record refused {op}: {error}"),
            },
            NodeFault::HoldLost { tag, error } => {
                write!(f, "the hold on {tag} could not be let go: {error}")
            }
            NodeFault::WriteRefused { room, error } => {
                write!(f, "the KV memory refused a write for {room}: {error}")
            }
            NodeFault::DeviceFailed { room, op, error } => match room {
                Some(r) => write!(f, "the device failed in {op} for {r}: {error}"),
                None => write!(f, "the device failed in {op}: {error}"),
            },
        }
    }
}

#[derive(
    Clone,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::VariantNames,
)]
#[serde(tag = "event")]
pub enum TraceEvent {
    /// The router accepted a client request and paired it with a room use and one
    /// prefill and one decode node. `prompt_len` and `max_new_tokens` are what the
    /// client asked for: the request's true size.
    Routed {
        node: NodeId,
        req: RequestId,
        tenant: TenantId,
        room: RoomKey,
        prefill: NodeId,
        decode: NodeId,
        prompt_len: u64,
        max_new_tokens: u32,
    },
    /// The half accepted the request: a sender (prefill) or receiver (decode) exists.
    Admitted {
        node: NodeId,
        room: RoomKey,
        req: RequestId,
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
    /// Free pages handed to the room use (Free -> Reserved), with their new generations.
    PagesReserved {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// A remote transfer will write these pages (Reserved -> Writing).
    PagesExpectWrite {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// The pages hold the room's verified KV (-> Ready).
    PagesReady {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// The room let go of its pages. `held` lists those another path still held: they
    /// went to Draining, the rest to Free. `Unchecked` is upstream's unchecked free.
    PagesReleased {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
        how: ReleaseKind,
        held: Vec<PageTag>,
    },
    /// An aborted room's pages kept out of circulation until the drain ack.
    Quarantined {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// Quarantined pages let go on the drain ack for `acked`; `held` went to Draining.
    QuarantineReleased {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
        acked: RoomKey,
        held: Vec<PageTag>,
    },
    /// A path other than the owner (a send reading them) took a hold on the pages.
    PagesHeld { node: NodeId, pages: Vec<PageTag> },
    /// Holds let go; `freed` are Draining pages whose last holder left (-> Free).
    PagesUnheld {
        node: NodeId,
        pages: Vec<PageTag>,
        freed: Vec<PageTag>,
    },
    /// The node wrote the KV of `tokens` tokens at offset `start` into `pages` for
    /// `room` (prefill's forward; a decode step's own token), meant for the sequence
    /// positions `pos..` (added within schema version 2: the position a write was
    /// meant for, which S3 judges a read against; absent in older traces, where S3
    /// judges the owner only). The engine writes position `p` to page `p / page_size`
    /// of the room's list, so `pos - start` is a multiple of the page size.
    KvWritten {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
        start: u64,
        tokens: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pos: Option<u64>,
    },
    /// Pages zeroed on free (defense 7): whatever they held is gone.
    PagesZeroed { node: NodeId, pages: Vec<PageId> },
    /// Prefill issued a KV write of `src` into decode's `dst` (their contents as of now),
    /// to the decode node `to` (schema version 2; absent in version 1 traces, whose
    /// readers take the room's `Routed.decode`).
    KvSent {
        node: NodeId,
        write: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<NodeId>,
    },
    /// A KV write landed in the node's pages.
    KvLanded {
        node: NodeId,
        write: WriteId,
        dst: Vec<PageTag>,
    },
    /// The node refused a KV write (the landing-time tag check, or a malformed write):
    /// nothing of it was applied.
    KvRefused {
        node: NodeId,
        write: WriteId,
        tag: Option<PageTag>,
        reason: String,
    },
    /// The writer learnt the outcome of one of its writes (the NIC's completion).
    WriteCompleted {
        node: NodeId,
        write: WriteId,
        ok: bool,
    },
    /// Decode heard prefill's conclusion of a room's transfer (M7).
    TransferReported {
        node: NodeId,
        room: RoomKey,
        from: NodeId,
        success: bool,
    },
    /// Decode accepted a transfer as complete and will run the request.
    TransferAccepted {
        node: NodeId,
        room: RoomKey,
        #[serde(flatten)]
        claim: TransferClaim,
    },
    /// Decode's verification (defense 2) refused a transfer prefill reported complete.
    TransferRefused {
        node: NodeId,
        room: RoomKey,
        #[serde(flatten)]
        claim: TransferClaim,
        reason: String,
    },
    /// Decode failed a transfer (prefill's failure report, or a timeout).
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
    /// One decode step read `pages` (the tags the request expects) over `seq_len`
    /// positions.
    Attend {
        node: NodeId,
        room: RoomKey,
        step: u32,
        query_pos: u64,
        seq_len: u64,
        pages: Vec<PageTag>,
    },
    /// The page-tag check (defense 4) refused the read this decode step attempted over
    /// `pages`: `tag` is not the reader's (the page is at `current` now).
    TagMismatch {
        node: NodeId,
        room: RoomKey,
        step: u32,
        seq_len: u64,
        pages: Vec<PageTag>,
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
    /// The router answered the client, with the reply's tokens.
    RouterResponse {
        node: NodeId,
        req: RequestId,
        room: Option<RoomKey>,
        status: Status,
        tokens: Vec<Token>,
    },
    /// The router cleared a room (both halves answered).
    RoomCleared { node: NodeId, room: RoomKey },
    /// The router gave up an attempt of a request and starts attempt `attempt` (2 to
    /// 5) in a new room (`sglang-router` policy): `room` is the attempt given up,
    /// `status` the answer that made it retry (502 when its request timeout closed
    /// the connections; its halves may still be working).
    RouterRetried {
        node: NodeId,
        req: RequestId,
        room: RoomKey,
        status: Status,
        attempt: u32,
    },
    /// SGLang worker mode: decode `node`'s worker front ended its half of `room` on
    /// prefill's word that prefill's half failed with `status` (the cancel-both
    /// defense at the front): the client is answered `status`, the node's half aborted.
    FrontCancelled {
        node: NodeId,
        room: RoomKey,
        status: Status,
    },
    /// Prefill acked a drain request.
    DrainAcked { node: NodeId, room: RoomKey },
    /// The source's NIC served an RDMA READ (`world::serve_read`): it read `src` (their
    /// contents as of now, whoever owns them now) for the reader `to`'s `dst`. No
    /// software of `node` ran.
    KvReadServed {
        node: NodeId,
        read: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
        to: NodeId,
    },
    /// vLLM prefill finished the room's forward and keeps its pages for decode to read,
    /// under a lease.
    Leased {
        node: NodeId,
        room: RoomKey,
        pages: Vec<PageTag>,
    },
    /// vLLM prefill let the room's lease go and released its pages: on decode's read
    /// notification, or `expired` (no notification within the lease).
    LeaseEnded {
        node: NodeId,
        room: RoomKey,
        expired: bool,
    },
    /// The node refused a message about a room from a node that is not that room's
    /// peer (or a write whose id names another writer). Nothing moved.
    PeerRefused {
        node: NodeId,
        from: NodeId,
        room: Option<RoomKey>,
        msg: String,
        reason: String,
    },
    /// The node reports a failure of its own; drivers act on [`NodeFault::action`].
    Fault { node: NodeId, fault: NodeFault },
}

impl TraceEvent {
    /// The room the event is about, if any.
    pub fn room(&self) -> Option<RoomKey> {
        use TraceEvent::*;
        match self {
            Routed { room, .. }
            | Admitted { room, .. }
            | Rejected { room, .. }
            | RejectedLegacy { room, .. }
            | Truncated { room, .. }
            | PagesReserved { room, .. }
            | PagesExpectWrite { room, .. }
            | PagesReady { room, .. }
            | PagesReleased { room, .. }
            | Quarantined { room, .. }
            | QuarantineReleased { room, .. }
            | KvWritten { room, .. }
            | TransferReported { room, .. }
            | TransferAccepted { room, .. }
            | TransferRefused { room, .. }
            | TransferFailed { room, .. }
            | Running { room, .. }
            | Attend { room, .. }
            | TagMismatch { room, .. }
            | AbortNoted { room, .. }
            | Responded { room, .. }
            | RoomCleared { room, .. }
            | RouterRetried { room, .. }
            | FrontCancelled { room, .. }
            | DrainAcked { room, .. }
            | Leased { room, .. }
            | LeaseEnded { room, .. } => Some(*room),
            KvReadServed { read, .. } => Some(read.room),
            KvSent { write, .. }
            | KvLanded { write, .. }
            | KvRefused { write, .. }
            | WriteCompleted { write, .. } => Some(write.room),
            RouterResponse { room, .. } | PeerRefused { room, .. } => *room,
            Fault { fault, .. } => fault.room(),
            PagesHeld { .. } | PagesUnheld { .. } | PagesZeroed { .. } => None,
        }
    }

    /// The node that emitted the event.
    pub fn node(&self) -> NodeId {
        use TraceEvent::*;
        match self {
            Routed { node, .. }
            | Admitted { node, .. }
            | Rejected { node, .. }
            | Truncated { node, .. }
            | RejectedLegacy { node, .. }
            | PagesReserved { node, .. }
            | PagesExpectWrite { node, .. }
            | PagesReady { node, .. }
            | PagesReleased { node, .. }
            | Quarantined { node, .. }
            | QuarantineReleased { node, .. }
            | PagesHeld { node, .. }
            | PagesUnheld { node, .. }
            | KvWritten { node, .. }
            | PagesZeroed { node, .. }
            | KvSent { node, .. }
            | KvLanded { node, .. }
            | KvRefused { node, .. }
            | WriteCompleted { node, .. }
            | TransferReported { node, .. }
            | TransferAccepted { node, .. }
            | TransferRefused { node, .. }
            | TransferFailed { node, .. }
            | Running { node, .. }
            | Attend { node, .. }
            | TagMismatch { node, .. }
            | AbortNoted { node, .. }
            | Responded { node, .. }
            | RouterResponse { node, .. }
            | RoomCleared { node, .. }
            | RouterRetried { node, .. }
            | FrontCancelled { node, .. }
            | DrainAcked { node, .. }
            | KvReadServed { node, .. }
            | Leased { node, .. }
            | LeaseEnded { node, .. }
            | PeerRefused { node, .. }
            | Fault { node, .. } => *node,
        }
    }

    /// The event's name, as its JSON `event` tag (serde's tag is the variant's name,
    /// and so is strum's).
    pub fn name(&self) -> &'static str {
        self.into()
    }

    /// Every event name, in declaration order, for the schema and its tests.
    pub const NAMES: &'static [&'static str] = <TraceEvent as strum::VariantNames>::VARIANTS;
}
