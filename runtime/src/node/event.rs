//! The one vocabulary of a node loop's inputs ([`NodeEvent`]): what its connections,
//! its landing, its fronts and its server hand it. Not what the loop does with each
//! (`NodeLoop::handle`).

use crate::node::reply::ReplySink;
use crate::node::status::NodeStatus;
use crate::sync::mpsc::Sender;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use kvsim_engine::kv::Refusal;
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use kvsim_engine::world::WriteFailure;
use kvsim_oracle::schema::EndOutcome;

/// One thing for a node's loop to do.
#[derive(Debug)]
pub enum NodeEvent<K> {
    /// A message read off a connection.
    Msg {
        from: NodeId,
        msg: Msg,
    },
    /// A KV write of `from` that no landing took (a node without one: a write to it
    /// fails back; an in-process deployment's decode): it lands as the world says,
    /// `world::receive`.
    Write {
        from: NodeId,
        write: KvWrite<K>,
    },
    /// A KV write of `from` landed or was refused ([`crate::landing`]); one of a dead
    /// incarnation fails back instead ([`NodeLoop::handle`](crate::node::NodeLoop::handle)).
    Landed {
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
    },
    /// The transfer carrying a KV write this node posted to `to` on its KV path
    /// (`--transport nixl`) finished: the library placed the bytes in `to`'s
    /// registered memory with no code of `to` running. The world's record of the
    /// landing (`KvLanded` at `to`), then the write's completion (the writer NIC's
    /// own on a one-sided transport).
    TransferDone {
        to: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
    },
    /// The transfer carrying a KV write this node posted to `to` on its KV path ended
    /// in an error (the peer disconnected, the request was refused): the write's one
    /// failed completion.
    TransferFailed {
        to: NodeId,
        id: WriteId,
    },
    /// The node's landing failed a KV write on arrival (the world's rule).
    WriteFailedHere {
        from: NodeId,
        id: WriteId,
        reason: WriteFailure,
        completion: Msg,
    },
    /// The failed completion of a KV write this node posted (already taken out of
    /// the writes in flight): delivered to the node as from the write's receiver.
    FailedBack {
        from: NodeId,
        msg: Msg,
    },
    /// A message or KV write to `to` could not be written (no connection).
    SendFailed {
        to: NodeId,
        msg: Carried<K>,
    },
    /// The connection to `peer` broke: KV writes posted on it fail back.
    PeerLost {
        peer: NodeId,
    },
    /// A client request (router only).
    Submit {
        req: RequestId,
        tenant: TenantId,
        /// The prompt's token ids, as the front made them.
        prompt: Vec<Token>,
        max_new_tokens: u32,
        reply: ReplySink,
    },
    /// The client of `req` went away.
    Cancel {
        req: RequestId,
    },
    /// A worker front starts a half (`msg` is its `PrefillStart` or `DecodeStart`,
    /// delivered as from the router, whose part the worker front plays): the half's
    /// answers (its tokens, its finish) go to `reply`.
    StartHalf {
        room: RoomKey,
        msg: Msg,
        /// The reply length the request asked for (for the trace's `routed` record).
        max_new_tokens: u32,
        reply: ReplySink,
        /// The worker refuses it (`--worker-fail-first`): answered 503, never run.
        refused: bool,
        /// vLLM's decode half: the prefill incarnation the side channel's handshake
        /// named (`None` elsewhere; SGLang's comes with the bootstrap's registration).
        prefill_epoch: Option<u32>,
    },
    /// The worker front's client of `room` went away: the half is aborted, as the
    /// router aborts it.
    AbortHalf {
        room: RoomKey,
    },
    /// Worker mode: a message from node `from`'s worker front to this one's (the
    /// pairing: `Register`, `Registered`, `PrefillDone`), as the worker API carried it.
    FrontPeer {
        from: NodeId,
        msg: Msg,
    },
    /// Worker mode: where this node's worker front's messages to the other half's
    /// front go (the worker API carries them over HTTP).
    FrontLink(Sender<(NodeId, Msg)>),
    Status(Sender<NodeStatus>),
    /// Stop taking client requests (router).
    CloseIntake,
    /// Write the trace's end and stop the loop.
    Stop {
        outcome: EndOutcome,
        detail: String,
    },
}
