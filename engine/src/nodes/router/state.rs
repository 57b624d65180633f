//! The router's state: a bounded table of room uses, each with its request, its pair
//! of halves and their answers, the request index and the seeded generator; how a
//! router is built, checked and read. What it does with an input is `flow.rs`'s; what
//! a policy decides is `policy.rs`'s.

use crate::counters::Counters;
use crate::env::Input;
use crate::ids::{Generation, NodeId, PageTag, RequestId, RoomId, RoomKey, TenantId, Token};
use crate::invariant::{Invariant, Violation};
use crate::msg::{Msg, Status, Why};
use crate::shared_cfg::Cfg;
use crate::trace::Side;
use std::collections::BTreeMap;

/// One use of a room.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct RoomUse {
    pub(super) req: RequestId,
    pub(super) client: NodeId,
    pub(super) prefill: NodeId,
    pub(super) decode: NodeId,
    pub(super) answers: Answers,
    /// `sglang-router`: each half's reason for its error, as it reported it, kept
    /// until both halves answered. The careful router answers the first error at once,
    /// and keeps decode's reason only while that error waits for prefill's answer
    /// (`careful.rs`, `waits_for_its_cause`).
    pub(super) prefill_why: Option<Why>,
    pub(super) decode_why: Option<Why>,
    /// The reply length the request asked for: a 200 with fewer tokens (the tail of
    /// the stream still in flight, or lost) is an error, never a shorter reply.
    pub(super) max_new_tokens: u32,
    pub(super) tokens: Vec<Option<Token>>,
    /// `sglang-router`: which attempt of the request this is (1 to 5), and what a
    /// retry needs to send the request again (and `vllm-router`, its decode start).
    pub(super) attempt: u32,
    pub(super) retry: Option<Retry>,
    /// `sglang-router`: the router gave this attempt up (its timeout closed the
    /// connections); no answer of it reaches the client.
    pub(super) abandoned: bool,
    /// `vllm-router` (sequential): decode was sent its start (from the first, under
    /// the other policies), and prefill's `kv_transfer_params` once they came.
    pub(super) decode_started: bool,
    pub(super) params: Option<Vec<PageTag>>,
}

impl RoomUse {
    /// Which halves are open: started and not reported yet, `(prefill, decode)`.
    pub(super) fn open(&self) -> (bool, bool) {
        let (p, d) = self.answers.open();
        (p, d && self.decode_started)
    }
}

/// Where a room use's answers stand: each half's terminal status once reported, and
/// whether the client has had its one answer. One value, read and changed together.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct Answers {
    /// The client has had its one answer.
    pub(super) client: bool,
    pub(super) prefill: Option<Status>,
    pub(super) decode: Option<Status>,
}

impl Answers {
    /// Record `side`'s terminal status; `false` for a duplicate (the first one stays).
    pub(super) fn record(&mut self, side: Side, status: Status) -> bool {
        let mine = match side {
            Side::Prefill => &mut self.prefill,
            Side::Decode => &mut self.decode,
        };
        if mine.is_some() {
            return false;
        }
        *mine = Some(status);
        assert!(self.reported(side));
        true
    }

    /// Has `side` reported its terminal status?
    pub(super) fn reported(&self, side: Side) -> bool {
        match side {
            Side::Prefill => self.prefill.is_some(),
            Side::Decode => self.decode.is_some(),
        }
    }

    /// Which halves have not reported yet: `(prefill, decode)`.
    pub(super) fn open(&self) -> (bool, bool) {
        (self.prefill.is_none(), self.decode.is_none())
    }
}

/// The other half.
pub(super) fn other_side(side: Side) -> Side {
    match side {
        Side::Prefill => Side::Decode,
        Side::Decode => Side::Prefill,
    }
}

/// What a new attempt of a request needs (kept only under `sglang-router`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Retry {
    pub(super) tenant: TenantId,
    pub(super) prompt: Vec<Token>,
}

/// One attempt of a request, as the router sends it.
pub(super) struct Attempt {
    pub(super) client: NodeId,
    pub(super) req: RequestId,
    pub(super) tenant: TenantId,
    pub(super) prompt: Vec<Token>,
    pub(super) max_new_tokens: u32,
    /// 1 for the first attempt.
    pub(super) number: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct RoomSlot {
    pub(super) gen: Generation,
    pub(super) live: Option<RoomUse>,
}

/// One live room use as the router sees it, for tests and drivers
/// ([`Router::room_state`]; read-only, the router never reads it back).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouterRoomState {
    pub req: RequestId,
    pub client: NodeId,
    pub prefill: NodeId,
    pub decode: NodeId,
    /// The client has had its one answer.
    pub answered: bool,
    /// The prefill half's terminal status, once reported.
    pub prefill_status: Option<Status>,
    /// The decode half's terminal status, once reported.
    pub decode_status: Option<Status>,
    /// Token slots received so far (`None`: a gap, still in flight).
    pub tokens: Vec<Option<Token>>,
}

/// The router state machine.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Router {
    pub(super) id: NodeId,
    pub(super) cfg: Cfg,
    pub(super) prefills: Vec<NodeId>,
    pub(super) decodes: Vec<NodeId>,
    pub(super) rooms: Vec<RoomSlot>,
    /// Free room numbers; the last one is reused first.
    pub(super) free_rooms: Vec<RoomId>,
    pub(super) by_req: BTreeMap<RequestId, RoomKey>,
    /// Round-robin cursor over the prefill and decode lists.
    pub(super) next_pair: u32,
    /// The state of the router's own generator (splitmix64, seeded by
    /// `router_seed`): the random room of each `sglang-router` attempt.
    pub(super) rng: u64,
    pub(super) counters: Counters,
}

/// The client's one answer: its status, the reply's tokens (a 200) and the engine's
/// reason (an error, where the engine has one).
pub(super) struct Answer {
    pub(super) status: Status,
    pub(super) tokens: Vec<Token>,
    pub(super) why: Option<Why>,
}

impl Answer {
    pub(super) fn error(status: Status, why: Option<Why>) -> Self {
        Answer {
            status,
            tokens: Vec::new(),
            why,
        }
    }
}

/// The client's answer when a half answers `status` (for the reason `why`): an error
/// as it is; a 200 with every token of the reply, or 500 when a token is missing (a gap
/// in the stream, or fewer than asked), never a silently shorter reply.
pub(super) fn reply(u: &RoomUse, status: Status, why: Option<Why>) -> Answer {
    if !status.is_ok() {
        return Answer::error(status, why);
    }
    let tokens: Vec<Token> = if u.tokens.iter().all(Option::is_some) {
        u.tokens.iter().map(|t| t.unwrap_or(0)).collect()
    } else {
        Vec::new()
    };
    if tokens.len() == u.tokens.len() && tokens.len() == u.max_new_tokens as usize {
        Answer {
            status,
            tokens,
            why: None,
        }
    } else {
        Answer::error(Status::INTERNAL, None)
    }
}

impl Router {
    pub fn new(id: NodeId, cfg: Cfg, prefills: Vec<NodeId>, decodes: Vec<NodeId>) -> Self {
        assert!(
            !prefills.is_empty() && !decodes.is_empty(),
            "topology validated by the driver"
        );
        let rooms = (0..cfg.max_rooms)
            .map(|_| RoomSlot {
                gen: Generation(0),
                live: None,
            })
            .collect();
        // Room 0 would look like SGLang's "not ready" aux value; start at 1.
        let free_rooms = (1..=cfg.max_rooms).rev().map(RoomId).collect();
        let rng = cfg.router_seed;
        Router {
            id,
            cfg,
            prefills,
            decodes,
            rooms,
            free_rooms,
            by_req: BTreeMap::new(),
            next_pair: 0,
            rng,
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Peer identity: a half's status and tokens about a room are believed only from
    /// the node the room was sent to, and a cancel only from the client that submitted
    /// the request. Anything about a room this router does not have live moves nothing.
    pub(super) fn check_peer(&self, from: NodeId, msg: &Msg) -> Result<(), String> {
        let live = |room: &RoomKey| {
            let slot = self.rooms.get((room.room.0 as usize).checked_sub(1)?)?;
            if slot.gen != room.gen {
                return None;
            }
            slot.live.as_ref()
        };
        match msg {
            Msg::PrefillFinished { room, .. } | Msg::KvParams { room, .. } => match live(room) {
                Some(u) if u.prefill != from => {
                    Err(format!("{room}'s prefill node is {}", u.prefill))
                }
                _ => Ok(()),
            },
            Msg::DecodeFinished { room, .. } | Msg::TokenOut { room, .. } => match live(room) {
                Some(u) if u.decode != from => Err(format!("{room}'s decode node is {}", u.decode)),
                _ => Ok(()),
            },
            Msg::Cancel { req } => match self.by_req.get(req).and_then(live) {
                Some(u) if u.client != from => Err(format!("{req} was submitted by {}", u.client)),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Rooms currently in use.
    pub fn live_rooms(&self) -> usize {
        self.rooms.iter().filter(|r| r.live.is_some()).count()
    }

    /// The room uses of the attempts it still waits on (live, not given up), in room
    /// order.
    pub fn waiting_rooms(&self) -> Vec<RoomKey> {
        (1u32..)
            .zip(&self.rooms)
            .filter(|(_, r)| r.live.as_ref().is_some_and(|u| !u.abandoned))
            .map(|(n, r)| RoomKey {
                room: RoomId(n),
                gen: r.gen,
            })
            .collect()
    }

    /// Rooms of attempts the router gave up (`sglang-router`) whose halves have not
    /// both answered yet.
    pub fn abandoned_rooms(&self) -> usize {
        self.rooms
            .iter()
            .filter(|r| r.live.as_ref().is_some_and(|u| u.abandoned))
            .count()
    }

    pub(super) fn slot(&mut self, key: RoomKey) -> Option<&mut RoomUse> {
        let slot = self.rooms.get_mut((key.room.0 as usize).checked_sub(1)?)?;
        if slot.gen != key.gen {
            return None;
        }
        slot.live.as_mut()
    }

    /// Room table and request index agree; free rooms are not live.
    pub fn invariants(&self) -> Result<(), Violation> {
        for &r in &self.free_rooms {
            if self.rooms[r.0 as usize - 1].live.is_some() {
                return Err(Violation::new(
                    Invariant::L2,
                    format!("{r} is both free and live"),
                ));
            }
        }
        let live = self.live_rooms();
        let indexed = self
            .rooms
            .iter()
            .filter(|r| r.live.as_ref().is_some_and(|u| !u.abandoned))
            .count();
        if live + self.free_rooms.len() != self.rooms.len() || self.by_req.len() != indexed {
            return Err(Violation::new(
                Invariant::L2,
                format!(
                    "router rooms: {live} live, {} free, {} indexed",
                    self.free_rooms.len(),
                    self.by_req.len()
                ),
            ));
        }
        Ok(())
    }

    /// The live use `room` names, `None` when the room is free or has moved on to a
    /// later generation.
    pub fn room_state(&self, room: RoomKey) -> Option<RouterRoomState> {
        let slot = self.rooms.get((room.room.0 as usize).checked_sub(1)?)?;
        if slot.gen != room.gen {
            return None;
        }
        let u = slot.live.as_ref()?;
        Some(RouterRoomState {
            req: u.req,
            client: u.client,
            prefill: u.prefill,
            decode: u.decode,
            answered: u.answers.client,
            prefill_status: u.answers.prefill,
            decode_status: u.answers.decode,
            tokens: u.tokens.clone(),
        })
    }

    /// The live room use serving a request.
    pub fn room_of(&self, req: RequestId) -> Option<RoomKey> {
        self.by_req.get(&req).copied()
    }
}

impl<K> crate::step::Stepper<K> for Router {
    fn handle(&mut self, input: Input, out: &mut crate::env::Outbox<K>) {
        Router::handle(self, input, out);
    }
    fn compute(&mut self, job: crate::compute::Job) -> crate::compute::Done {
        unreachable!("the router has no device: {job:?}")
    }
}
