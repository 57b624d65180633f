//! A worker front's state ([`WorkerFront`]) and its vocabulary: what it is handed
//! ([`FrontInput`]) and what it asks for ([`FrontEffect`], [`HalfEv`]). Not its
//! transitions (`halves.rs`, `epochs.rs`).

use crate::config::Protocol;
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;
use crate::trace::TraceEvent;
use std::collections::{BTreeMap, VecDeque};

/// Most early words of a prefill half's end a decode front keeps (the oldest go),
/// and most ends of prefill halves that never ran a prefill front keeps for a decode
/// node that registers late.
pub const EARLY_DONE: usize = 4096;

/// Most rooms registered at a prefill front's bootstrap and not yet taken by a half.
pub const MAX_REGISTERED: usize = 1 << 16;

/// How long a prefill front's half waits for decode's registration, and a
/// registration for the router's request: ten of the engine's bootstrap bounds (at
/// least 1 ms each), in every driver.
pub fn pairing_wait_ns(t: &crate::config::Timeouts) -> u64 {
    t.bootstrap_ns.max(1_000_000).saturating_mul(10)
}

/// What a worker front is handed (besides the node's messages to the router,
/// [`WorkerFront::from_node`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontInput {
    /// The router asked this worker for its half of `room`: `msg` is the engine's
    /// `PrefillStart` or `DecodeStart` for it (vLLM's decode: `PullStart`).
    /// `intake_open`: the node takes new requests. Under SGLang's protocol a decode
    /// half starts once prefill's bootstrap took its registration (`Msg::Registered`);
    /// a prefill half once decode registered (`Msg::Register`), with the registrant as
    /// its `decode` (SGLang's prefill learns its decode peer from the registration,
    /// not from the router). Under vLLM's nothing pairs at a bootstrap: each half
    /// starts at once, and `prefill_epoch` is the prefill incarnation a vLLM decode's
    /// side-channel handshake named (`None` elsewhere: SGLang's comes in
    /// `Msg::Registered`).
    Start {
        room: RoomKey,
        msg: Msg,
        max_new_tokens: u32,
        prefill_epoch: Option<u32>,
        intake_open: bool,
    },
    /// A message from the other half's front (`Msg::Register`, `Msg::Registered`,
    /// `Msg::PrefillDone`), sent by node `from`.
    Peer { from: NodeId, msg: Msg },
    /// Prefill: the room's pairing wait (`FrontEffect::Wait`) is over.
    WaitOver { room: RoomKey },
    /// The half's client (the router's connection) went away.
    Abort { room: RoomKey },
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
    /// Send `msg` to node `to`'s worker front (the pairing's messages): the world
    /// carries it as any control message.
    Send { to: NodeId, msg: Msg },
    /// Prefill: hand back [`FrontInput::WaitOver`] for `room` after `after_ns`
    /// (the engine's `Timer::Pairing`).
    Wait { room: RoomKey, after_ns: u64 },
}

/// A started half: its request, (decode) its tokens so far, and (prefill) the
/// decode node that registered its room, told when it ends.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Half {
    pub(super) req: RequestId,
    pub(super) tokens: Vec<Token>,
    pub(super) peer: Option<NodeId>,
}

impl Half {
    pub(super) fn new(req: RequestId, peer: Option<NodeId>) -> Self {
        Half {
            req,
            tokens: Vec::new(),
            peer,
        }
    }
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
    /// The protocol of the halves: SGLang's pair at prefill's bootstrap (the
    /// registration), vLLM's do not (its decode starts once prefill answered, with
    /// prefill's `kv_transfer_params`).
    pub(super) protocol: Protocol,
    /// The node's incarnation (a prefill bootstrap answers registrations with it).
    pub(super) epoch: u32,
    /// Prefill: how long a half waits for decode's registration, and a registration
    /// for the router's request (the bootstrap bound).
    pub(super) wait_ns: u64,
    /// A half the router asked for, not yet at the node: (prefill) waiting for
    /// decode's registration, (decode) for prefill's bootstrap to take its own.
    pub(super) held: BTreeMap<RoomKey, (Msg, u32)>,
    /// Prefill: rooms decode nodes registered that no half took yet.
    pub(super) registered: BTreeMap<RoomKey, NodeId>,
    /// Prefill: halves that ended here without running, with their status, for a
    /// decode node that registers later (at most [`EARLY_DONE`]).
    pub(super) gone: VecDeque<(RoomKey, Status)>,
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
            protocol: Protocol::Sglang,
            epoch: 0,
            wait_ns: 200_000_000,
            held: BTreeMap::new(),
            registered: BTreeMap::new(),
            gone: VecDeque::new(),
            halves: BTreeMap::new(),
            clearing: BTreeMap::new(),
            prefill_epochs: BTreeMap::new(),
            early_done: VecDeque::new(),
        }
    }

    /// The same front with the node's incarnation `epoch` and the pairing bound
    /// `wait_ns` (a prefill half's wait for decode's registration).
    pub fn pairing(mut self, epoch: u32, wait_ns: u64) -> Self {
        self.epoch = epoch;
        self.wait_ns = wait_ns;
        self
    }

    /// The same front serving `protocol`'s halves (SGLang's by default).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The same front, new, for the node's incarnation `epoch`: what a killed
    /// process's front knew dies with it (a node behind its front restarts with a
    /// fresh one).
    pub fn fresh(&self, epoch: u32) -> Self {
        let f = WorkerFront::new(self.node, self.role, self.router, self.cancels_both);
        f.pairing(epoch, self.wait_ns).protocol(self.protocol)
    }

    /// The router whose part the front plays: the node's messages to it are the
    /// front's ([`WorkerFront::from_node`]).
    pub fn router(&self) -> NodeId {
        self.router
    }

    /// Is `room`'s half asked for (started or held) and not yet answered?
    pub fn has_half(&self, room: RoomKey) -> bool {
        self.halves.contains_key(&room) || self.held.contains_key(&room)
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
