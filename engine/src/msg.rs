//! The messages nodes exchange: one vocabulary for every driver.
//!
//! A message is a value; nothing in it points into a node. Drain acks and write
//! completions are messages too, so a simulator can delay, drop or reorder them and a
//! model checker can explore one that arrives late. Every message of the handoff
//! carries the [`RoomKey`] (room and generation) it belongs to.
//!
//! A KV write is not a message: its bytes do not enter a node's software on a
//! one-sided transport. The writer posts a [`KvWrite`] through its outbox
//! ([`Outbox::post_write`](crate::env::Outbox::post_write)) and the world carries and
//! lands it (`world::receive`, by the transport's `Semantics` row); a driver holds a
//! write in flight beside the messages as a [`Carried`].

use crate::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which half of a room an event is about.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Side {
    Prefill,
    Decode,
}

/// A node's refusal of a start or an abort that did not come from `router`: only the
/// router starts or aborts rooms (each node's peer check).
pub(crate) fn only_router(router: NodeId, from: NodeId) -> String {
    assert_ne!(router, from, "the router's own start or abort is believed");
    format!("only the router ({router}) starts or aborts rooms")
}

/// A node's refusal of a start for a room use it holds for another request: a
/// `bootstrap_room` that collides with a live one, whoever supplied it (issue 37,
/// class 2). The live room use is left as it was; no page moves.
pub(crate) fn in_use(room: RoomKey, held_by: RequestId) -> String {
    format!("{room} is in use by {held_by}: a start for another request is refused")
}

/// An HTTP-like status code, as the client sees it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Status(pub u16);

impl Status {
    pub const OK: Status = Status(200);
    /// Rejected at intake (the prompt does not fit), or a bad request.
    pub const BAD_REQUEST: Status = Status(400);
    /// The client went away or asked to abort.
    pub const CLIENT_CLOSED: Status = Status(499);
    /// The engine failed the request (transfer failure, verification failure, timeout).
    pub const INTERNAL: Status = Status(500);
    /// An upstream half failed at the HTTP level (SGLang's gateway, for a half whose
    /// connection broke or timed out).
    pub const BAD_GATEWAY: Status = Status(502);
    /// No capacity to take the request now (queue or room table full).
    pub const UNAVAILABLE: Status = Status(503);
    /// A worker front's half waited past its bound (a pairing never completed).
    pub const GATEWAY_TIMEOUT: Status = Status(504);

    /// The statuses SGLang's gateway retries (`is_retryable_status`: 408, 429, 500,
    /// 502, 503, 504).
    pub fn is_retryable(self) -> bool {
        matches!(self.0, 408 | 429 | 500 | 502 | 503 | 504)
    }

    pub fn is_ok(self) -> bool {
        self == Status::OK
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a half or the router answered with an error: the engine's own reason, typed,
/// carried with the status from the node that decided to the router's `Response`, so a
/// front tells its client what the engine decided instead of guessing from the status.
/// `None` where the engine gives no reason of its own (an abort, a lost answer, a
/// failure found after admission on prefill).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
/// Serialized externally tagged (as `TransferOutcome`), which the wire's bincode reads.
pub enum Why {
    /// Prefill's admission: the prompt is longer than the node admits.
    PromptTooLong { tokens: u64, limit: u64 },
    /// Decode's admission: the prompt plus the new tokens exceed what the node admits.
    ReplyTooLong {
        tokens: u64,
        new_tokens: u32,
        limit: u64,
    },
    /// The half's queue was full at intake.
    QueueFull { side: Side },
    /// The node stopped itself after a fault it cannot recover from.
    NodeStopped { side: Side },
    /// Prefill's request was already finished with an error at intake (the legacy
    /// abort path: `to_finish` set, read by the bootstrap-queue gate).
    RejectedAtIntake,
    /// Decode refused prefill's completed transfer (verification: lengths, pages or
    /// checksum disagree).
    TransferRefused,
    /// The KV transfer failed or did not arrive in time.
    TransferFailed,
    /// The router refused the request: no prompt, or `max_new_tokens` outside
    /// `1..=limit`.
    InvalidRequest { max_new_tokens_limit: u32 },
    /// The router's room table was full.
    NoRoom,
    /// The router's request timeout passed before both halves answered.
    Timeout,
    /// The half's device failed while serving the request (a driver call, a launch, a
    /// copy); its pages were released, the node goes on.
    DeviceFailed { side: Side },
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &Side| match s {
            Side::Prefill => "prefill",
            Side::Decode => "decode",
        };
        match self {
            Why::PromptTooLong { tokens, limit } => {
                write!(f, "prompt of {tokens} tokens exceeds the admission limit of {limit}")
            }
            Why::ReplyTooLong {
                tokens,
                new_tokens,
                limit,
            } => write!(
                f,
                "prompt of {tokens} tokens plus {new_tokens} new exceeds the admission limit of {limit}"
            ),
            Why::QueueFull { side: s } => write!(f, "{} queue full", side(s)),
            Why::NodeStopped { side: s } => write!(f, "{} node stopped", side(s)),
            Why::RejectedAtIntake => f.write_str("rejected at intake"),
            Why::TransferRefused => {
                f.write_str("decode refused the KV transfer at verification")
            }
            Why::TransferFailed => f.write_str("the KV transfer failed or timed out"),
            Why::InvalidRequest {
                max_new_tokens_limit,
            } => write!(
                f,
                "empty prompt, or max_new_tokens outside 1..={max_new_tokens_limit}"
            ),
            Why::NoRoom => f.write_str("the router's room table is full"),
            Why::Timeout => f.write_str("the request timed out before both halves answered"),
            Why::DeviceFailed { side: s } => write!(f, "the {} device failed", side(s)),
        }
    }
}

/// What prefill reports to decode when a room's transfer concludes (SGLang's M7 plus
/// the aux row).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TransferOutcome {
    /// Every chunk was written. Carries what prefill believes it sent.
    Success {
        /// Prompt tokens prefill ran and sent (its own prompt length).
        tokens: u64,
        /// Pages prefill sent (its own page count).
        pages: u32,
        /// Digest of the sent tokens keyed by position.
        checksum: u64,
    },
    /// The transfer failed or was aborted on the prefill side.
    Failed,
}

/// One chunk of KV pages a writer posts into a receiver's pool (SGLang's M6, an
/// RDMA WRITE on a one-sided transport). `src` names the writer's pages being read,
/// `dst` the receiver's pages (with the tags the receiver handed out), `kv` their
/// contents, one payload per page, with the page tags the write stamps. Not a
/// [`Msg`]: a node posts it and never handles one; the world lands it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KvWrite<K> {
    pub id: WriteId,
    pub src: Vec<PageTag>,
    pub dst: Vec<PageTag>,
    pub kv: Vec<K>,
}

impl<K> KvWrite<K> {
    /// A one-line human summary (no payload), as the trace has always worded it.
    pub fn summary(&self) -> String {
        let tags = |t: &[PageTag]| crate::ids::fmt_tags(t, 6);
        format!(
            "KvWrite {} src=[{}] dst=[{}]",
            self.id,
            tags(&self.src),
            tags(&self.dst)
        )
    }

    /// The failed completion its writer gets when it does not land.
    pub fn failed(&self) -> Msg {
        Msg::WriteDone {
            id: self.id,
            ok: false,
        }
    }
}

/// A message between two nodes (or a client and the router).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Msg {
    // Client <-> router.
    /// A client submits a request.
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
    },
    /// The client disconnects or aborts its request.
    Cancel { req: RequestId },
    /// The one terminal answer to a client.
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
        /// The engine's reason for a status that is not 200, where it has one.
        why: Option<Why>,
    },

    // Router -> nodes.
    /// Start the prefill half of a room.
    PrefillStart {
        room: RoomKey,
        /// The client request the room serves (so every trace links the room to it).
        req: RequestId,
        prompt: Vec<Token>,
        decode: NodeId,
    },
    /// Start the decode half of a room (the same request, sent concurrently).
    DecodeStart {
        room: RoomKey,
        req: RequestId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
        prefill: NodeId,
    },
    /// Abort a room (client disconnect, the other half failed, request timeout).
    Abort { room: RoomKey },

    // Decode -> prefill.
    /// The destination pages for the room's prompt (SGLang M5).
    KvMeta {
        room: RoomKey,
        dst: Vec<PageTag>,
        prompt_len: u64,
    },
    /// Decode aborted the room: stop sending and ack once your writes drained (M8).
    DrainRequest { room: RoomKey },
    /// The completion of one chunk write ([`KvWrite`]), to its writer: the writer
    /// NIC's own on a one-sided transport, the receiver software's on a two-sided one
    /// (`Semantics::completed_by`).
    WriteDone { id: WriteId, ok: bool },

    // Prefill -> decode.
    /// The room's transfer concluded (M7).
    KvDone {
        room: RoomKey,
        outcome: TransferOutcome,
        /// The incarnation of decode whose page list the transfer served (the epoch of
        /// the page tags decode handed out): a restarted decode ignores a conclusion
        /// about its dead incarnation's pages.
        epoch: u32,
    },
    /// Every write for the room has drained (deferred-release ACK, M8).
    DrainAck { room: RoomKey },

    // Nodes -> router.
    /// The prefill half's terminal status.
    PrefillFinished {
        room: RoomKey,
        status: Status,
        /// Prefill's reason for a status that is not 200, where it has one.
        why: Option<Why>,
    },
    /// Generated token number `index`, streamed.
    TokenOut {
        room: RoomKey,
        index: u32,
        token: Token,
    },
    /// The decode half's terminal status.
    DecodeFinished {
        room: RoomKey,
        status: Status,
        /// Decode's reason for a status that is not 200, where it has one.
        why: Option<Why>,
    },

    // vLLM's NIXL connector (pull): `nodes/prefill_vllm/`, `nodes/decode/pull.rs`.
    /// vLLM prefill -> router, just before its 200: the reply's `kv_transfer_params`
    /// (`remote_block_ids`, `remote_engine_id` as the sender, `remote_num_tokens`).
    KvParams {
        room: RoomKey,
        src: Vec<PageTag>,
        tokens: u64,
    },
    /// Router -> decode: start the decode half of a room whose KV `src` (pages of
    /// `prefill`, as its `KvParams` named them) decode reads itself.
    PullStart {
        room: RoomKey,
        req: RequestId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
        prefill: NodeId,
        src: Vec<PageTag>,
    },
    /// An RDMA READ request: the reader (`id.writer`) asks the source's NIC for the
    /// contents of `src`, to be placed in the reader's `dst`. Not handled by the
    /// source's software: the world serves it (`world::serve_read`). It rides the
    /// reliable connection as a KV write does (`world::transport`: never lost or
    /// duplicated; it is served once or fails with one failed completion).
    KvRead {
        id: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    /// NIXL's notification, posted with a READ (`notif_msg`): the reader's side sends
    /// it to the source's agent once the READ completed, one per READ handle: `rank`
    /// is the handle's (its `WriteId::chunk`, `EngineConfig::ranks`). The source frees
    /// the room's pages once every rank's notification came.
    ReadNotify { room: RoomKey, rank: u32 },
    /// vLLM decode -> prefill: renew the lease on the room's pages (the NIXL
    /// connector's heartbeat, every sixth of the lease while decode has not read).
    Heartbeat { room: RoomKey },

    // SGLang worker mode, between the two halves' worker fronts (`nodes/worker/`).
    /// Decode's front -> prefill's bootstrap: the sender is `room`'s decode half
    /// (SGLang's decode registering its KV receiver with prefill's bootstrap server).
    Register { room: RoomKey },
    /// Prefill's bootstrap -> decode's front: `room`'s registration was taken by the
    /// prefill node's incarnation `epoch`.
    Registered { room: RoomKey, epoch: u32 },
    /// Prefill's front -> decode's front: prefill's half of `room` ended with `status`
    /// (the engine's reason `why` where it gave one), run or not.
    PrefillDone {
        room: RoomKey,
        status: Status,
        why: Option<Why>,
    },
}

impl Msg {
    /// The room a handoff message belongs to (client messages have none).
    pub fn room(&self) -> Option<RoomKey> {
        match self {
            Msg::Submit { .. } | Msg::Cancel { .. } | Msg::Response { .. } => None,
            Msg::PrefillStart { room, .. }
            | Msg::DecodeStart { room, .. }
            | Msg::Abort { room }
            | Msg::KvMeta { room, .. }
            | Msg::DrainRequest { room }
            | Msg::KvDone { room, .. }
            | Msg::DrainAck { room }
            | Msg::PrefillFinished { room, .. }
            | Msg::TokenOut { room, .. }
            | Msg::DecodeFinished { room, .. }
            | Msg::KvParams { room, .. }
            | Msg::PullStart { room, .. }
            | Msg::ReadNotify { room, .. }
            | Msg::Heartbeat { room }
            | Msg::Register { room }
            | Msg::Registered { room, .. }
            | Msg::PrefillDone { room, .. } => Some(*room),
            Msg::WriteDone { id, .. } | Msg::KvRead { id, .. } => Some(id.room),
        }
    }

    /// The KV write a completion is about.
    pub fn write_id(&self) -> Option<WriteId> {
        match self {
            Msg::WriteDone { id, .. } | Msg::KvRead { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// A short name for traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Submit { .. } => "Submit",
            Msg::Cancel { .. } => "Cancel",
            Msg::Response { .. } => "Response",
            Msg::PrefillStart { .. } => "PrefillStart",
            Msg::DecodeStart { .. } => "DecodeStart",
            Msg::Abort { .. } => "Abort",
            Msg::KvMeta { .. } => "KvMeta",
            Msg::DrainRequest { .. } => "DrainRequest",
            Msg::WriteDone { .. } => "WriteDone",
            Msg::KvDone { .. } => "KvDone",
            Msg::DrainAck { .. } => "DrainAck",
            Msg::PrefillFinished { .. } => "PrefillFinished",
            Msg::TokenOut { .. } => "TokenOut",
            Msg::DecodeFinished { .. } => "DecodeFinished",
            Msg::KvParams { .. } => "KvParams",
            Msg::PullStart { .. } => "PullStart",
            Msg::KvRead { .. } => "KvRead",
            Msg::ReadNotify { .. } => "ReadNotify",
            Msg::Heartbeat { .. } => "Heartbeat",
            Msg::Register { .. } => "Register",
            Msg::Registered { .. } => "Registered",
            Msg::PrefillDone { .. } => "PrefillDone",
        }
    }

    /// A one-line human summary (no KV payloads).
    pub fn summary(&self) -> String {
        let tags = |t: &[PageTag]| crate::ids::fmt_tags(t, 6);
        match self {
            Msg::Submit {
                req,
                tenant,
                prompt,
                max_new_tokens,
            } => {
                format!(
                    "Submit {req} {tenant} prompt={} max_new={max_new_tokens}",
                    prompt.len()
                )
            }
            Msg::Cancel { req } => format!("Cancel {req}"),
            Msg::Response {
                req,
                status,
                tokens,
                ..
            } => {
                format!("Response {req} status={status} tokens={}", tokens.len())
            }
            Msg::PrefillStart {
                room,
                req,
                prompt,
                decode,
            } => {
                format!(
                    "PrefillStart {room} {req} prompt={} decode={decode}",
                    prompt.len()
                )
            }
            Msg::DecodeStart {
                room,
                req,
                prompt,
                max_new_tokens,
                prefill,
            } => format!(
                "DecodeStart {room} {req} prompt={} max_new={max_new_tokens} prefill={prefill}",
                prompt.len()
            ),
            Msg::Abort { room } => format!("Abort {room}"),
            Msg::KvMeta {
                room,
                dst,
                prompt_len,
            } => {
                format!("KvMeta {room} prompt={prompt_len} dst=[{}]", tags(dst))
            }
            Msg::DrainRequest { room } => format!("DrainRequest {room}"),
            Msg::WriteDone { id, ok } => format!("WriteDone {id} ok={ok}"),
            Msg::KvDone { room, outcome, .. } => format!("KvDone {room} {outcome:?}"),
            Msg::DrainAck { room } => format!("DrainAck {room}"),
            Msg::PrefillFinished { room, status, .. } => {
                format!("PrefillFinished {room} status={status}")
            }
            Msg::TokenOut { room, index, token } => {
                format!("TokenOut {room} #{index} token={token:#x}")
            }
            Msg::DecodeFinished { room, status, .. } => {
                format!("DecodeFinished {room} status={status}")
            }
            pull => pull.pull_summary().unwrap_or_default(),
        }
    }

    /// [`Msg::summary`] of vLLM pull's and the worker fronts' messages (`None` for any
    /// other).
    fn pull_summary(&self) -> Option<String> {
        let tags = |t: &[PageTag]| crate::ids::fmt_tags(t, 6);
        Some(match self {
            Msg::KvParams { room, src, tokens } => {
                format!("KvParams {room} tokens={tokens} src=[{}]", tags(src))
            }
            Msg::PullStart {
                room,
                req,
                prompt,
                prefill,
                src,
                ..
            } => format!(
                "PullStart {room} {req} prompt={} prefill={prefill} src=[{}]",
                prompt.len(),
                tags(src)
            ),
            Msg::KvRead { id, src, dst } => {
                format!("KvRead {id} src=[{}] dst=[{}]", tags(src), tags(dst))
            }
            Msg::ReadNotify { room, rank } => format!("ReadNotify {room} rank {rank}"),
            Msg::Heartbeat { room } => format!("Heartbeat {room}"),
            Msg::Register { room } => format!("Register {room}"),
            Msg::Registered { room, epoch } => format!("Registered {room} epoch={epoch}"),
            Msg::PrefillDone { room, status, .. } => format!("PrefillDone {room} status={status}"),
            _ => return None,
        })
    }
}

/// What a driver holds in flight between two nodes: a control message (or a write
/// completion), or a KV write that a writer posted ([`Outbox::post_write`]). The two
/// travel differently ([`transport`](crate::world::transport)) and arrive differently: a message enters its
/// receiver through `handle`, a write lands through [`receive`](crate::world::receive).
///
/// [`Outbox::post_write`]: crate::env::Outbox::post_write
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Carried<K> {
    Msg(Msg),
    Write(KvWrite<K>),
}

impl<K> Carried<K> {
    /// The room it belongs to (client messages have none).
    pub fn room(&self) -> Option<RoomKey> {
        match self {
            Carried::Msg(m) => m.room(),
            Carried::Write(w) => Some(w.id.room),
        }
    }

    /// The KV write a write or its completion is about.
    pub fn write_id(&self) -> Option<WriteId> {
        match self {
            Carried::Msg(m) => m.write_id(),
            Carried::Write(w) => Some(w.id),
        }
    }

    /// A short name for traces (`KvWrite` for a write).
    pub fn kind(&self) -> &'static str {
        match self {
            Carried::Msg(m) => m.kind(),
            Carried::Write(_) => "KvWrite",
        }
    }

    /// A one-line human summary (no KV payloads).
    pub fn summary(&self) -> String {
        match self {
            Carried::Msg(m) => m.summary(),
            Carried::Write(w) => w.summary(),
        }
    }

    /// Does it ride the reliable connection's RDMA operations (a KV write, or an RDMA
    /// READ request), rather than the control channel?
    pub fn is_rdma(&self) -> bool {
        matches!(self, Carried::Write(_) | Carried::Msg(Msg::KvRead { .. }))
    }

    /// The message, if it is one.
    pub fn msg(&self) -> Option<&Msg> {
        match self {
            Carried::Msg(m) => Some(m),
            Carried::Write(_) => None,
        }
    }

    /// The KV write, if it is one.
    pub fn write(&self) -> Option<&KvWrite<K>> {
        match self {
            Carried::Msg(_) => None,
            Carried::Write(w) => Some(w),
        }
    }
}

impl<K> From<Msg> for Carried<K> {
    fn from(m: Msg) -> Self {
        Carried::Msg(m)
    }
}

impl<K> From<KvWrite<K>> for Carried<K> {
    fn from(w: KvWrite<K>) -> Self {
        Carried::Write(w)
    }
}
