//! [`MsgView`]: a message as the trace shows it (every field but the KV payload and
//! the prompt's tokens), and its translation from the engine's own message. It does
//! not hold the other records ([`crate::schema::record`]).

use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status, TransferOutcome, Why};
use serde::{Deserialize, Serialize};

/// A message as the trace shows it: every field but the KV payload and the prompt's
/// tokens (their count instead). The engine's own serde form of a message keeps both,
/// because that form travels on the wire; a trace must stay small.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
    PrefillStart {
        room: RoomKey,
        req: RequestId,
        prompt_len: usize,
        decode: NodeId,
    },
    DecodeStart {
        room: RoomKey,
        req: RequestId,
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
        id: WriteId,
        ok: bool,
    },
    KvWrite {
        id: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    KvDone {
        room: RoomKey,
        outcome: TransferOutcome,
        /// The decode incarnation whose page list the transfer served (absent in traces
        /// written before schema version 2 had it: read as 0).
        #[serde(default)]
        epoch: u32,
    },
    DrainAck {
        room: RoomKey,
    },
    PrefillFinished {
        room: RoomKey,
        status: Status,
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
    TokenOut {
        room: RoomKey,
        index: u32,
        token: Token,
    },
    DecodeFinished {
        room: RoomKey,
        status: Status,
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
    KvParams {
        room: RoomKey,
        src: Vec<PageTag>,
        tokens: u64,
    },
    PullStart {
        room: RoomKey,
        req: RequestId,
        prompt_len: usize,
        max_new_tokens: u32,
        prefill: NodeId,
        src: Vec<PageTag>,
    },
    KvRead {
        id: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    ReadNotify {
        room: RoomKey,
        /// The READ handle's rank (`EngineConfig::ranks`; 0 with one rank).
        rank: u32,
    },
    Heartbeat {
        room: RoomKey,
    },
    /// SGLang worker mode: decode's front registers a room at prefill's bootstrap.
    Register {
        room: RoomKey,
    },
    /// SGLang worker mode: prefill's bootstrap took the registration (its incarnation).
    Registered {
        room: RoomKey,
        epoch: u32,
    },
    /// SGLang worker mode: prefill's front tells decode's that its half ended.
    PrefillDone {
        room: RoomKey,
        status: Status,
        why: Option<Why>,
    },
}

/// What a trace shows as a message: a [`Msg`], a [`KvWrite`] (a write is its own
/// effect and arrival in the engine, and the trace keeps showing it as a `KvWrite`
/// message record) or either as a driver carries it ([`Carried`]).
pub trait Viewed {
    fn view(&self) -> MsgView;
}

impl Viewed for Msg {
    fn view(&self) -> MsgView {
        MsgView::of_msg(self)
    }
}

impl<K> Viewed for KvWrite<K> {
    fn view(&self) -> MsgView {
        MsgView::KvWrite {
            id: self.id,
            src: self.src.clone(),
            dst: self.dst.clone(),
        }
    }
}

impl<K> Viewed for Carried<K> {
    fn view(&self) -> MsgView {
        match self {
            Carried::Msg(m) => m.view(),
            Carried::Write(w) => w.view(),
        }
    }
}

impl MsgView {
    /// The view of a message, a KV write, or either as carried.
    pub fn of<V: Viewed + ?Sized>(m: &V) -> MsgView {
        m.view()
    }

    fn of_msg(m: &Msg) -> MsgView {
        match m {
            Msg::Submit { .. } | Msg::Cancel { .. } | Msg::Response { .. } => Self::of_client(m),
            Msg::PrefillStart { .. } | Msg::DecodeStart { .. } => Self::of_start(m),
            Msg::TokenOut { .. } | Msg::PrefillFinished { .. } | Msg::DecodeFinished { .. } => {
                Self::of_answer(m)
            }
            Msg::KvParams { .. }
            | Msg::PullStart { .. }
            | Msg::KvRead { .. }
            | Msg::ReadNotify { .. }
            | Msg::Heartbeat { .. } => Self::of_pull(m),
            Msg::Register { room } => MsgView::Register { room: *room },
            Msg::Registered { room, epoch } => MsgView::Registered {
                room: *room,
                epoch: *epoch,
            },
            Msg::PrefillDone { room, status, why } => MsgView::PrefillDone {
                room: *room,
                status: *status,
                why: *why,
            },
            _ => Self::of_transfer(m),
        }
    }

    /// A client's message: its request, its cancel, its answer.
    fn of_client(m: &Msg) -> MsgView {
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
                why,
            } => MsgView::Response {
                req: *req,
                status: *status,
                tokens: tokens.clone(),
                why: *why,
            },
            _ => unreachable!("of_client is called for its own messages only"),
        }
    }

    /// A half's start, as the router sends it.
    fn of_start(m: &Msg) -> MsgView {
        match m {
            Msg::PrefillStart {
                room,
                req,
                prompt,
                decode,
            } => MsgView::PrefillStart {
                room: *room,
                req: *req,
                prompt_len: prompt.len(),
                decode: *decode,
            },
            Msg::DecodeStart {
                room,
                req,
                prompt,
                max_new_tokens,
                prefill,
            } => MsgView::DecodeStart {
                room: *room,
                req: *req,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
                prefill: *prefill,
            },
            _ => unreachable!("of_start is called for its own messages only"),
        }
    }

    /// What a half tells the router: its tokens and its finish.
    fn of_answer(m: &Msg) -> MsgView {
        match m {
            Msg::PrefillFinished { room, status, why } => MsgView::PrefillFinished {
                room: *room,
                status: *status,
                why: *why,
            },
            Msg::TokenOut { room, index, token } => MsgView::TokenOut {
                room: *room,
                index: *index,
                token: *token,
            },
            Msg::DecodeFinished { room, status, why } => MsgView::DecodeFinished {
                room: *room,
                status: *status,
                why: *why,
            },
            _ => unreachable!("of_answer is called for its own messages only"),
        }
    }

    /// An abort, and the transfer between the halves and its cleanup.
    fn of_transfer(m: &Msg) -> MsgView {
        match m {
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
            Msg::WriteDone { id, ok } => MsgView::WriteDone { id: *id, ok: *ok },
            Msg::KvDone {
                room,
                outcome,
                epoch,
            } => MsgView::KvDone {
                room: *room,
                outcome: outcome.clone(),
                epoch: *epoch,
            },
            Msg::DrainAck { room } => MsgView::DrainAck { room: *room },
            _ => unreachable!("of_transfer is called for its own messages only"),
        }
    }

    /// [`MsgView::of_msg`] of vLLM pull's messages.
    fn of_pull(m: &Msg) -> MsgView {
        match m {
            Msg::KvParams { room, src, tokens } => MsgView::KvParams {
                room: *room,
                src: src.clone(),
                tokens: *tokens,
            },
            Msg::PullStart {
                room,
                req,
                prompt,
                max_new_tokens,
                prefill,
                src,
            } => MsgView::PullStart {
                room: *room,
                req: *req,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
                prefill: *prefill,
                src: src.clone(),
            },
            Msg::KvRead { id, src, dst } => MsgView::KvRead {
                id: *id,
                src: src.clone(),
                dst: dst.clone(),
            },
            Msg::ReadNotify { room, rank } => MsgView::ReadNotify {
                room: *room,
                rank: *rank,
            },
            Msg::Heartbeat { room } => MsgView::Heartbeat { room: *room },
            other => unreachable!("{} is not a pull message", other.kind()),
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
            | KvDone { room, .. }
            | DrainAck { room }
            | PrefillFinished { room, .. }
            | TokenOut { room, .. }
            | DecodeFinished { room, .. }
            | KvParams { room, .. }
            | PullStart { room, .. }
            | ReadNotify { room, .. }
            | Heartbeat { room }
            | Register { room }
            | Registered { room, .. }
            | PrefillDone { room, .. } => Some(*room),
            WriteDone { id, .. } | KvWrite { id, .. } | KvRead { id, .. } => Some(id.room),
        }
    }

    /// A one-line summary: the engine's own wording ([`Msg::summary`]) for the fields
    /// a view keeps.
    pub fn summary(&self) -> String {
        use MsgView::*;
        let tags = |t: &[PageTag]| kvsim_engine::ids::fmt_tags(t, 4);
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
                ..
            } => format!("Response {req} status={status} tokens={}", tokens.len()),
            PrefillStart {
                room,
                req,
                prompt_len,
                decode,
            } => format!("PrefillStart {room} {req} prompt={prompt_len} decode={decode}"),
            DecodeStart {
                room,
                req,
                prompt_len,
                max_new_tokens,
                prefill,
            } => format!(
                "DecodeStart {room} {req} prompt={prompt_len} max_new={max_new_tokens} prefill={prefill}"
            ),
            Abort { room } => format!("Abort {room}"),
            KvMeta {
                room,
                dst,
                prompt_len,
            } => format!("KvMeta {room} prompt={prompt_len} dst=[{}]", tags(dst)),
            DrainRequest { room } => format!("DrainRequest {room}"),
            WriteDone { id, ok } => format!("WriteDone {id} ok={ok}"),
            KvWrite { id, src, dst } => {
                format!("KvWrite {id} src=[{}] dst=[{}]", tags(src), tags(dst))
            }
            KvDone { room, outcome, .. } => format!("KvDone {room} {outcome:?}"),
            DrainAck { room } => format!("DrainAck {room}"),
            PrefillFinished { room, status, .. } => format!("PrefillFinished {room} status={status}"),
            TokenOut { room, index, token } => format!("TokenOut {room} #{index} token={token:#x}"),
            DecodeFinished { room, status, .. } => format!("DecodeFinished {room} status={status}"),
            KvParams { room, src, tokens } => {
                format!("KvParams {room} tokens={tokens} src=[{}]", tags(src))
            }
            PullStart {
                room,
                req,
                prompt_len,
                prefill,
                src,
                ..
            } => format!(
                "PullStart {room} {req} prompt={prompt_len} prefill={prefill} src=[{}]",
                tags(src)
            ),
            KvRead { id, src, dst } => {
                format!("KvRead {id} src=[{}] dst=[{}]", tags(src), tags(dst))
            }
            ReadNotify { room, rank } => format!("ReadNotify {room} rank {rank}"),
            Heartbeat { room } => format!("Heartbeat {room}"),
            Register { room } => format!("Register {room}"),
            Registered { room, epoch } => format!("Registered {room} epoch={epoch}"),
            PrefillDone { room, status, .. } => format!("PrefillDone {room} status={status}"),
        }
    }
}
