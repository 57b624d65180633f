//! The event log of a traced run: every message sent and delivered, every timer,
//! every engine event, every fault and every violation, in order.
//!
//! Only built when a run is traced (replays and failure reports); sweeps run without
//! it and a failing seed is re-run with it, which determinism makes exact. Each
//! [`Entry`] renders as one line of text ([`Entry::text`]) and as one JSON object
//! (`--trace-json`, schema in `docs/TRACE.md`). [`Entry::rooms`] and [`Entry::pages`]
//! name what an entry touches, so a failure report can cut the log down to the
//! requests, rooms and pages involved.

use crate::oracle::Finding;
use crate::report::describe_event;
use crate::scenario::CancelHow;
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RequestId, RoomKey, TenantId, Token};
use kvsim_engine::invariant::Violation;
use kvsim_engine::msg::{Msg, Status, TransferOutcome};
use kvsim_engine::trace::TraceEvent;
use serde::Serialize;

/// A message as the log shows it: every field but the KV payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind")]
pub enum MsgView {
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: usize,
        max_new_tokens: u32,
    },
    Cancel {
        req: RequestId,
    },
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
    },
    PrefillStart {
        room: RoomKey,
        prompt_len: usize,
        decode: NodeId,
    },
    DecodeStart {
        room: RoomKey,
        prompt_len: usize,
        max_new_tokens: u32,
        prefill: NodeId,
    },
    Abort {
        room: RoomKey,
    },
    KvMeta {
        room: RoomKey,
        dst: Vec<PageTag>,
        prompt_len: u64,
    },
    DrainRequest {
        room: RoomKey,
    },
    WriteDone {
        room: RoomKey,
        chunk: u32,
        ok: bool,
    },
    KvWrite {
        room: RoomKey,
        chunk: u32,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    KvDone {
        room: RoomKey,
        outcome: TransferOutcome,
    },
    DrainAck {
        room: RoomKey,
    },
    PrefillFinished {
        room: RoomKey,
        status: Status,
    },
    TokenOut {
        room: RoomKey,
        index: u32,
        token: Token,
    },
    DecodeFinished {
        room: RoomKey,
        status: Status,
    },
}

impl MsgView {
    pub fn of<K>(m: &Msg<K>) -> MsgView {
        match m {
            Msg::Submit {
                req,
                tenant,
                prompt,
                max_new_tokens,
            } => MsgView::Submit {
                req: *req,
                tenant: *tenant,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
            },
            Msg::Cancel { req } => MsgView::Cancel { req: *req },
            Msg::Response {
                req,
                status,
                tokens,
            } => MsgView::Response {
                req: *req,
                status: *status,
                tokens: tokens.clone(),
            },
            Msg::PrefillStart {
                room,
                prompt,
                decode,
            } => MsgView::PrefillStart {
                room: *room,
                prompt_len: prompt.len(),
                decode: *decode,
            },
            Msg::DecodeStart {
                room,
                prompt,
                max_new_tokens,
                prefill,
            } => MsgView::DecodeStart {
                room: *room,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
                prefill: *prefill,
            },
            Msg::Abort { room } => MsgView::Abort { room: *room },
            Msg::KvMeta {
                room,
                dst,
                prompt_len,
            } => MsgView::KvMeta {
                room: *room,
                dst: dst.clone(),
                prompt_len: *prompt_len,
            },
            Msg::DrainRequest { room } => MsgView::DrainRequest { room: *room },
            Msg::WriteDone { room, chunk, ok } => MsgView::WriteDone {
                room: *room,
                chunk: *chunk,
                ok: *ok,
            },
            Msg::KvWrite {
                room,
                chunk,
                src,
                dst,
                ..
            } => MsgView::KvWrite {
                room: *room,
                chunk: *chunk,
                src: src.clone(),
                dst: dst.clone(),
            },
            Msg::KvDone { room, outcome } => MsgView::KvDone {
                room: *room,
                outcome: outcome.clone(),
            },
            Msg::DrainAck { room } => MsgView::DrainAck { room: *room },
            Msg::PrefillFinished { room, status } => MsgView::PrefillFinished {
                room: *room,
                status: *status,
            },
            Msg::TokenOut { room, index, token } => MsgView::TokenOut {
                room: *room,
                index: *index,
                token: *token,
            },
            Msg::DecodeFinished { room, status } => MsgView::DecodeFinished {
                room: *room,
                status: *status,
            },
        }
    }

    pub fn room(&self) -> Option<RoomKey> {
        use MsgView::*;
        match self {
            Submit { .. } | Cancel { .. } | Response { .. } => None,
            PrefillStart { room, .. }
            | DecodeStart { room, .. }
            | Abort { room }
            | KvMeta { room, .. }
            | DrainRequest { room }
            | WriteDone { room, .. }
            | KvWrite { room, .. }
            | KvDone { room, .. }
            | DrainAck { room }
            | PrefillFinished { room, .. }
            | TokenOut { room, .. }
            | DecodeFinished { room, .. } => Some(*room),
        }
    }

    /// A one-line summary (the engine's own wording).
    pub fn summary(&self) -> String {
        use MsgView::*;
        match self {
            Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => format!("Submit {req} {tenant} prompt={prompt_len} max_new={max_new_tokens}"),
            Cancel { req } => format!("Cancel {req}"),
            Response {
                req,
                status,
                tokens,
            } => format!("Response {req} status={status} tokens={}", tokens.len()),
            PrefillStart {
                room,
                prompt_len,
                decode,
            } => format!("PrefillStart {room} prompt={prompt_len} decode={decode}"),
            DecodeStart {
                room,
                prompt_len,
                max_new_tokens,
                prefill,
            } => format!(
                "DecodeStart {room} prompt={prompt_len} max_new={max_new_tokens} prefill={prefill}"
            ),
            Abort { room } => format!("Abort {room}"),
            KvMeta {
                room,
                dst,
                prompt_len,
            } => format!("KvMeta {room} prompt={prompt_len} dst=[{}]", tags(dst)),
            DrainRequest { room } => format!("DrainRequest {room}"),
            WriteDone { room, chunk, ok } => format!("WriteDone {room} chunk={chunk} ok={ok}"),
            KvWrite {
                room,
                chunk,
                src,
                dst,
            } => format!(
                "KvWrite {room} chunk={chunk} src=[{}] dst=[{}]",
                tags(src),
                tags(dst)
            ),
            KvDone { room, outcome } => format!("KvDone {room} {outcome:?}"),
            DrainAck { room } => format!("DrainAck {room}"),
            PrefillFinished { room, status } => format!("PrefillFinished {room} status={status}"),
            TokenOut { room, index, token } => format!("TokenOut {room} #{index} token={token:#x}"),
            DecodeFinished { room, status } => format!("DecodeFinished {room} status={status}"),
        }
    }
}

/// Page tags, shortened when long.
pub fn tags(t: &[PageTag]) -> String {
    kvsim_engine::ids::fmt_tags(t, 4)
}

/// Why a message was not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The network lost it.
    Lost,
    /// The two nodes were partitioned when it arrived.
    Partitioned,
    /// The receiver was down, or restarted since the message was sent (the
    /// connection it was sent on died with the old incarnation).
    ReceiverGone,
    /// A KV write of a sender that crashed: flushed from its NIC, never applied.
    SenderCrashed,
}

/// Why a KV write failed (not applied; its sender gets `WriteDone { ok: false }`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteFailure {
    /// The injected write failure.
    Injected,
    /// Across a partition.
    Partitioned,
    /// The receiver was down or restarted since.
    ReceiverGone,
    /// The destination tags belong to an earlier incarnation of the receiver (the
    /// memory registration they name no longer exists).
    StaleRegistration,
}

/// A fault, as it strikes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    Crash {
        node: NodeId,
        epoch: u32,
    },
    Restart {
        node: NodeId,
        epoch: u32,
    },
    /// The safety phase ends: no new faults from here on.
    Heal,
}

/// What one log entry records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The client submits a request.
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: u64,
        max_new_tokens: u32,
    },
    /// The client gives up on a request.
    ClientCancel {
        req: RequestId,
        how: CancelHow,
        plan: String,
    },
    /// A node (or the client) sent a message; `deliver_at_ns` is when it is due.
    Send {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
        deliver_at_ns: u64,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
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
    /// A KV write failed; its sender will get a failed completion.
    WriteFailed {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
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
    /// An engine event (schema of `kvsim_engine::trace::TraceEvent`, tag `event`).
    Engine(TraceEvent),
    /// The client received its terminal response.
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
    },
    Fault(FaultEvent),
    /// An oracle found an invariant broken (the finding, less its time, which is
    /// the entry's).
    Violation {
        violation: Violation,
        room: Option<RoomKey>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        related: Vec<RoomKey>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pages: Vec<(NodeId, PageId)>,
    },
}

/// One entry of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Simulated time, in nanoseconds.
    pub at_ns: u64,
    /// The number of the simulator step (one event taken off the queue) this entry
    /// belongs to; `seq` in JSON (an engine event has its own `event` tag and a
    /// decode step its own `step`).
    #[serde(rename = "seq")]
    pub event: u64,
    #[serde(flatten)]
    pub rec: Record,
}

/// A timer as a short name: `DrainRetry(room1.g8)`.
pub fn timer_name(t: &Timer) -> String {
    match t {
        Timer::Compute => "Compute".into(),
        Timer::Bootstrap(r) => format!("Bootstrap({r})"),
        Timer::WaitingForKv(r) => format!("WaitingForKv({r})"),
        Timer::DrainRetry(r) => format!("DrainRetry({r})"),
        Timer::Request(r) => format!("Request({r})"),
    }
}

fn timer_room(t: &Timer) -> Option<RoomKey> {
    match t {
        Timer::Bootstrap(r) | Timer::WaitingForKv(r) | Timer::DrainRetry(r) | Timer::Request(r) => {
            Some(*r)
        }
        Timer::Compute => None,
    }
}

impl Entry {
    /// The rooms the entry is about.
    pub fn rooms(&self) -> Vec<RoomKey> {
        match &self.rec {
            Record::Send { msg, .. }
            | Record::Deliver { msg, .. }
            | Record::Drop { msg, .. }
            | Record::WriteFailed { msg, .. } => msg.room().into_iter().collect(),
            Record::TimerSet { timer, .. }
            | Record::TimerCancel { timer, .. }
            | Record::TimerFire { timer, .. } => timer_room(timer).into_iter().collect(),
            Record::Engine(ev) => ev.room().into_iter().collect(),
            Record::Violation { room, related, .. } => {
                room.iter().chain(related.iter()).copied().collect()
            }
            Record::Submit { .. }
            | Record::ClientCancel { .. }
            | Record::Response { .. }
            | Record::Fault(_) => Vec::new(),
        }
    }

    /// The request the entry is about, when it names one directly.
    pub fn request(&self) -> Option<RequestId> {
        match &self.rec {
            Record::Submit { req, .. }
            | Record::ClientCancel { req, .. }
            | Record::Response { req, .. } => Some(*req),
            Record::Engine(TraceEvent::RouterResponse { req, .. }) => Some(*req),
            Record::Deliver {
                msg: MsgView::Submit { req, .. } | MsgView::Cancel { req },
                ..
            } => Some(*req),
            _ => None,
        }
    }

    /// The physical pages (node, page) the entry touches.
    pub fn pages(&self) -> Vec<(NodeId, PageId)> {
        let on = |n: NodeId, t: &[PageTag]| t.iter().map(move |t| (n, t.page)).collect::<Vec<_>>();
        match &self.rec {
            Record::Deliver { from, to, msg } | Record::WriteFailed { from, to, msg, .. } => {
                match msg {
                    MsgView::KvWrite { src, dst, .. } => {
                        let mut v = on(*to, dst);
                        v.extend(on(*from, src));
                        v
                    }
                    MsgView::KvMeta { dst, .. } => on(*from, dst),
                    _ => Vec::new(),
                }
            }
            Record::Engine(ev) => match ev {
                TraceEvent::PagesReserved { node, pages, .. }
                | TraceEvent::PagesReleased { node, pages, .. }
                | TraceEvent::Quarantined { node, pages, .. }
                | TraceEvent::QuarantineReleased { node, pages, .. }
                | TraceEvent::Attend { node, pages, .. } => on(*node, pages),
                TraceEvent::KvSent { node, src, .. } => on(*node, src),
                TraceEvent::KvLanded { node, dst, .. } => on(*node, dst),
                TraceEvent::KvRefused { node, tag, .. }
                | TraceEvent::TagMismatch { node, tag, .. } => {
                    vec![(*node, tag.page)]
                }
                _ => Vec::new(),
            },
            Record::Violation { pages, .. } => pages.clone(),
            _ => Vec::new(),
        }
    }

    /// The entry as one line of text (without the time prefix).
    pub fn text(&self) -> String {
        match &self.rec {
            Record::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => format!(
                "client submits {req} ({tenant}, prompt {prompt_len} tokens, {max_new_tokens} new)"
            ),
            Record::ClientCancel { req, how, plan } => {
                let how = match how {
                    CancelHow::Abort => "aborts",
                    CancelHow::Disconnect => "disconnects",
                };
                format!("client {how} {req} ({plan})")
            }
            Record::Send {
                from,
                to,
                msg,
                deliver_at_ns,
                duplicate,
            } => format!(
                "{from} -> {to} {}{} (due {})",
                msg.summary(),
                if *duplicate { " [duplicate]" } else { "" },
                crate::report::secs(*deliver_at_ns)
            ),
            Record::Deliver { from, to, msg } => format!("{to} <- {from} {}", msg.summary()),
            Record::Drop {
                from,
                to,
                msg,
                reason,
            } => format!(
                "network drops {from} -> {to} {} ({reason:?})",
                msg.summary()
            ),
            Record::WriteFailed {
                from,
                to,
                msg,
                reason,
            } => format!(
                "KV write {from} -> {to} fails, not applied ({reason:?}): {}",
                msg.summary()
            ),
            Record::TimerSet {
                node,
                timer,
                fire_at_ns,
            } => format!(
                "{node} sets timer {} for {}",
                timer_name(timer),
                crate::report::secs(*fire_at_ns)
            ),
            Record::TimerCancel { node, timer } => {
                format!("{node} cancels timer {}", timer_name(timer))
            }
            Record::TimerFire { node, timer } => {
                format!("{node} timer {} fires", timer_name(timer))
            }
            Record::Engine(ev) => format!("  {}", describe_event(ev)),
            Record::Response {
                req,
                status,
                tokens,
            } => format!(
                "client gets {req}: {status}, {} tokens{}",
                tokens.len(),
                if tokens.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", crate::report::render_tokens(*req, tokens))
                }
            ),
            Record::Fault(f) => match f {
                FaultEvent::PartitionStart { prefill, decode } => {
                    format!("FAULT partition {prefill} | {decode} begins")
                }
                FaultEvent::PartitionEnd { prefill, decode } => {
                    format!("FAULT partition {prefill} | {decode} ends")
                }
                FaultEvent::Crash { node, epoch } => {
                    format!("FAULT {node} crashes (incarnation {epoch} dies with its timers, queues and connections)")
                }
                FaultEvent::Restart { node, epoch } => {
                    format!("FAULT {node} restarts as incarnation {epoch} (empty pool, KV memory not zeroed)")
                }
                FaultEvent::Heal => {
                    "FAULTS HEAL: liveness phase, everything must drain".to_string()
                }
            },
            Record::Violation { violation, .. } => format!("!! VIOLATION {violation}"),
        }
    }

    /// Whether the full text trace shows this entry (sends that went normally and
    /// timer bookkeeping are in the JSON trace only).
    pub fn shown_in_text(&self) -> bool {
        match &self.rec {
            Record::Send { duplicate, .. } => *duplicate,
            Record::TimerSet { .. } | Record::TimerCancel { .. } => false,
            _ => true,
        }
    }
}

impl Record {
    /// The log record of a finding.
    pub fn violation(f: &Finding) -> Record {
        Record::Violation {
            violation: f.violation.clone(),
            room: f.room,
            related: f.related.clone(),
            pages: f.pages.clone(),
        }
    }

    /// Is this the record of `f`?
    pub fn is_finding(&self, f: &Finding) -> bool {
        matches!(self, Record::Violation { violation, room, .. } if *violation == f.violation && *room == f.room)
    }
}
