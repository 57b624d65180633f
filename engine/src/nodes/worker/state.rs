//! A worker front's state ([`WorkerFront`]) and its vocabulary: what it is handed
//! ([`FrontInput`]) and what it asks for ([`FrontEffect`], [`HalfEv`]). Not its
//! transitions (`halves.rs`, `epochs.rs`).

use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;
use crate::trace::TraceEvent;
use std::collections::{BTreeMap, VecDeque};

/// Most early words of a prefill half's end a decode front keeps (the oldest go).
pub const EARLY_DONE: usize = 4096;

/// What a worker front is handed (besides the node's messages to the router,
/// [`WorkerFront::from_node`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontInput {
    /// The router asked this worker for its half of `room`: `msg` is the engine's
    /// `PrefillStart` or `DecodeStart` for it. `prefill_epoch`: a decode half's prefill
    /// node's incarnation, as its bootstrap said when it took the room's registration
    /// (`None`: it did not say). `intake_open`: the node takes new requests.
    Start {
        room: RoomKey,
        msg: Msg,
        max_new_tokens: u32,
        prefill_epoch: Option<u32>,
        intake_open: bool,
    },
    /// The half's client (the router's connection) went away.
    Abort { room: RoomKey },
    /// Decode: the prefill half of `room` is terminal with `status` (prefill's worker
    /// said so), for the engine's reason `why` where it gave one.
    PeerDone {
        room: RoomKey,
        status: Status,
        why: Option<Why>,
    },
    /// Decode: prefill's word that its half of `room` ended, kept from before decode's
    /// half started and handed back by the driver once the start reached the node
    /// ([`FrontEffect::Then`]), so that the node's own answer to its start comes first.
    Early {
        room: RoomKey,
        status: Status,
        why: Option<Why>,
    },
}

/// One event of a half's answer to its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HalfEv {
    /// Token `index` of decode's reply, as decode made it.
    Token { index: u32, token: Token },
    /// vLLM's prefill: the reply's `kv_transfer_params` (`Msg::KvParams`), its pages
    /// under the lease and the prompt's tokens, before its `Done`.
    Params { src: Vec<PageTag>, tokens: u64 },
    /// The half's one terminal answer: `status` and the engine's reason `why`, given
    /// by `side`'s half (a decode half ends with prefill's failure where the
    /// cancel-both defense is on), and decode's tokens.
    Done {
        status: Status,
        why: Option<Why>,
        side: Side,
        tokens: Vec<Token>,
    },
}

/// What a worker front asks of its driver, in the order issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontEffect {
    /// Deliver `msg` to the node, as from the router.
    ToNode(Msg),
    /// An event of `room`'s half's answer, to its client (a `Done` is the last).
    Answer { room: RoomKey, ev: HalfEv },
    /// `room`'s half's client went away: its answer channel closes unanswered.
    Close { room: RoomKey },
    /// The client of request `req` closed its connection (the trace's client-cancel
    /// record, which is the driver's, not an engine event).
    ClientGone { req: RequestId },
    /// An engine event for oracles and traces.
    Trace(TraceEvent),
    /// Hand this input back to the front once every effect before it was carried out
    /// (a delivery to the node included).
    Then(FrontInput),
}

/// A started half: its request and (decode) its tokens so far.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Half {
    pub(super) req: RequestId,
    pub(super) tokens: Vec<Token>,
}

/// Decode: which halves of a room are terminal, and the prefill node and
/// incarnation whose bootstrap took the room's registration, where it said.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct Clearing {
    pub(super) decode_done: bool,
    pub(super) prefill_done: bool,
    pub(super) at: Option<(NodeId, u32)>,
}

/// SGLang's worker front of one prefill or decode node: the halves the router asked
/// it for, and (decode) the rooms it clears on the router's behalf.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct WorkerFront {
    /// The node it fronts.
    pub(super) node: NodeId,
    pub(super) role: Role,
    /// The id the node knows as its router, whose part the front plays.
    pub(super) router: NodeId,
    /// A failed prefill half ends its decode half with prefill's status (the router's
    /// cancel-both, defense 6: `router_cancels_both`).
    pub(super) cancels_both: bool,
    /// Each started half not yet answered.
    pub(super) halves: BTreeMap<RoomKey, Half>,
    /// Decode: the rooms not yet cleared.
    pub(super) clearing: BTreeMap<RoomKey, Clearing>,
    /// Decode: the latest incarnation each prefill node's bootstrap answered with.
    pub(super) prefill_epochs: BTreeMap<NodeId, u32>,
    /// Decode: prefill's word that a room's half ended, come before decode's half
    /// started (at most [`EARLY_DONE`]).
    pub(super) early_done: VecDeque<(RoomKey, Status, Option<Why>)>,
}

impl WorkerFront {
    /// The front of node `node` playing `role`, whose router is `router`.
    pub fn new(node: NodeId, role: Role, router: NodeId, cancels_both: bool) -> Self {
        WorkerFront {
            node,
            role,
            router,
            cancels_both,
            halves: BTreeMap::new(),
            clearing: BTreeMap::new(),
            prefill_epochs: BTreeMap::new(),
            early_done: VecDeque::new(),
        }
    }

    /// The same front, new: what a killed process's front knew dies with it (a node
    /// behind its front restarts with a fresh one).
    pub fn fresh(&self) -> Self {
        WorkerFront::new(self.node, self.role, self.router, self.cancels_both)
    }

    /// The router whose part the front plays: the node's messages to it are the
    /// front's ([`WorkerFront::from_node`]).
    pub fn router(&self) -> NodeId {
        self.router
    }

    /// Is `room`'s half started and not yet answered?
    pub fn has_half(&self, room: RoomKey) -> bool {
        self.halves.contains_key(&room)
    }

    /// The side of the half this front serves.
    pub fn side(&self) -> Side {
        match self.role {
            Role::Decode => Side::Decode,
            _ => Side::Prefill,
        }
    }

    /// The rooms a decode front has not cleared yet.
    pub fn open_rooms(&self) -> impl Iterator<Item = RoomKey> + '_ {
        self.clearing.keys().copied()
    }
}
