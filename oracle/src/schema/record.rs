//! What one entry of a trace records: [`Record`] and [`Entry`], with the fault events,
//! cancels and run endings they carry. It does not hold messages
//! ([`crate::schema::msg_view`]), the header ([`crate::schema::header`]) nor the
//! reading and writing of lines ([`crate::schema::line`]).

use crate::schema::msg_view::MsgView;
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use kvsim_engine::invariant::Violation;
use kvsim_engine::msg::Status;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{DataFault, DropReason, WriteFailure};
use serde::{Deserialize, Serialize};

/// How a client gives up on a request. Both reach the router as a cancel; a
/// disconnected client no longer reads its answer (the oracle still checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CancelHow {
    Abort,
    Disconnect,
}

/// A fault of the world, as it strikes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum FaultEvent {
    PartitionStart {
        prefill: NodeId,
        decode: NodeId,
    },
    PartitionEnd {
        prefill: NodeId,
        decode: NodeId,
    },
    /// Incarnation `epoch` of `node` dies with its timers, queues and connections; the
    /// KV writes it had posted are flushed, never applied (`flushed`).
    Crash {
        node: NodeId,
        epoch: u32,
        #[serde(default)]
        flushed: Vec<WriteId>,
    },
    /// The node comes back as incarnation `epoch`: empty pool, KV memory not zeroed.
    Restart {
        node: NodeId,
        epoch: u32,
    },
    /// A KV write landed with a data fault (`world::alter`): its page meant for
    /// `meant` landed at `landed` (another page for a misdirect; the same page,
    /// corrupted or in part, otherwise). Its completion still reports success. Stated
    /// for people reading the trace; the oracle judges the landing from `KvLanded`
    /// and the reply (S10), never from this record.
    DataFault {
        from: NodeId,
        to: NodeId,
        write: WriteId,
        kind: DataFault,
        meant: PageTag,
        landed: PageTag,
    },
    /// The node freezes (a stall: GC, swap, SIGSTOP) until `until_ns`: its timers and
    /// the inputs that need its process wait until then; one-sided KV writes still
    /// land in its memory.
    Pause {
        node: NodeId,
        until_ns: u64,
    },
    /// The safety phase ends: no new faults from here on.
    Heal,
}

impl FaultEvent {
    /// The record of write `write` from `from` landing at `to` with the data fault
    /// `a` (what `world::alter` or `world::WriteHistory::duplicate` did): the one
    /// place every driver builds it.
    pub fn data_fault(
        from: NodeId,
        to: NodeId,
        write: WriteId,
        a: &kvsim_engine::world::Altered,
    ) -> Self {
        FaultEvent::DataFault {
            from,
            to,
            write,
            kind: a.fault,
            meant: a.meant,
            landed: a.landed,
        }
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndOutcome {
    /// Nothing left to do: every message delivered, every timer fired or cancelled.
    Drained,
    /// The liveness phase's bound passed with work still pending.
    LivenessBound,
    /// The run's event limit was hit with work still pending.
    EventLimit,
    /// The trace was cut (a server stopped without draining, a trace of part of a run):
    /// liveness is not judged.
    Cut,
}

/// What one entry records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A client submits a request (its prompt, under `canary_tokens`, is the canary
    /// sequence of `req`).
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: u64,
        max_new_tokens: u32,
    },
    /// A client gives up on a request.
    ClientCancel {
        req: RequestId,
        how: CancelHow,
        #[serde(default)]
        plan: String,
    },
    /// A node (or the client) sent a message; `deliver_at_ns` is when it is due.
    Send {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
        deliver_at_ns: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// A message reached its receiver, which handles it now.
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
    },
    /// A message was not delivered.
    Drop {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
        reason: DropReason,
    },
    /// A KV write failed on the wire and was not applied; its writer gets one failed
    /// completion.
    WriteFailed {
        from: NodeId,
        to: NodeId,
        write: WriteId,
        reason: WriteFailure,
    },
    TimerSet {
        node: NodeId,
        timer: Timer,
        fire_at_ns: u64,
    },
    TimerCancel {
        node: NodeId,
        timer: Timer,
    },
    TimerFire {
        node: NodeId,
        timer: Timer,
    },
    /// An engine event.
    Engine(TraceEvent),
    /// The client received its terminal response.
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
    },
    Fault(FaultEvent),
    /// An oracle found an invariant broken, or a defense fire (written by the tool
    /// that judged the run; a checker ignores these and judges afresh).
    Violation {
        violation: Violation,
        #[serde(default)]
        detected_by: Option<String>,
        room: Option<RoomKey>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        related: Vec<RoomKey>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pages: Vec<(NodeId, PageId)>,
    },
    /// The last entry of a complete trace.
    End {
        outcome: EndOutcome,
        detail: String,
    },
}

/// One entry of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Nanoseconds: simulated (since the start) or wall-clock, as the header says.
    pub at_ns: u64,
    /// The driver's step number (one event taken off its queue, one input handled);
    /// entries of one step share it.
    pub seq: u64,
    #[serde(flatten)]
    pub rec: Record,
}
