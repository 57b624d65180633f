//! The room-use registry: what the router's `Routed` event says about each room use
//! (request, tenant, true prompt length, its two nodes), kept until the router clears
//! the room, with the flags other checkers set on it and each half's first answer.
//!
//! It judges nothing; every checker reads it to name a room use in a finding and to
//! know its true size. Invariant: sorted by room key, one entry per key.

use super::{draft, Drafts};
use crate::shared::Shared;
use enumset::{EnumSet, EnumSetType};
use kvsim_engine::ids::{Generation, NodeId, RequestId, RoomId, RoomKey, TenantId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Status;
use std::collections::{BTreeMap, VecDeque};

/// What the oracle remembers about a room use, from the router's `Routed` event until
/// the router clears the room.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RoomFacts {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prefill: NodeId,
    pub decode: NodeId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    pub flags: EnumSet<RoomFlag>,
    /// The first status each half answered (prefill, decode): a half's answer is one
    /// answer, so a repeat must carry the same status (S6).
    pub answered: [Option<Status>; 2],
}

/// What other checkers noted on a room use (see [`RoomFacts::flags`]).
#[derive(Debug, EnumSetType)]
pub enum RoomFlag {
    /// Prefill saw the abort: a later 200 from prefill is dishonest (S6).
    PrefillAborted,
    /// Decode heard that the transfer failed: a later 200 from decode is dishonest (S6).
    TransferFailed,
    /// Prefill flagged it with a legacy rejection (to_finish set, still live).
    FlaggedPrefill,
    /// Decode flagged it with a legacy rejection.
    FlaggedDecode,
    /// Prefill acked decode's drain request: every later send is a violation (S9).
    DrainAcked,
}

/// Routed room uses not yet cleared, sorted by key, and the newest generation routed
/// in each room number. Each shared and hashed as one part.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Rooms {
    pub rooms: Shared<Vec<(RoomKey, RoomFacts)>>,
    /// Per room number, the newest generation the router routed in it: a room use is
    /// one attempt's, so a `Routed` at that generation or an older one is a room use
    /// routed twice (S7).
    newest: Shared<Newest>,
}

/// How many room numbers [`Newest`] remembers. The engine router's room table bounds
/// the numbers it uses far below this; SGLang's router (and an audit of a deployment
/// under it) draws a fresh random 63-bit room per request, so without a bound an audit
/// of a stream would keep one entry per request for ever.
pub const NEWEST_ROOMS: usize = 1 << 16;

/// The newest generation routed per room number, for at most [`NEWEST_ROOMS`] numbers:
/// past that, the number first remembered longest ago is forgotten (a replay of a room
/// routed more than that many room numbers ago passes S7 unjudged). `order` is the
/// numbers in the order they were first remembered; it is left out of the hash and of
/// equality, since it changes nothing until the bound is reached, which no model does.
#[derive(Clone, Debug, Default)]
pub struct Newest {
    gens: BTreeMap<RoomId, Generation>,
    order: VecDeque<RoomId>,
}

impl Newest {
    fn get(&self, room: RoomId) -> Option<Generation> {
        self.gens.get(&room).copied()
    }

    /// Remember `gen` as the newest of `room`, forgetting the oldest number past the
    /// bound.
    fn put(&mut self, room: RoomId, gen: Generation) {
        if self.gens.insert(room, gen).is_none() {
            self.order.push_back(room);
        }
        while self.gens.len() > NEWEST_ROOMS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.gens.remove(&old);
        }
        debug_assert_eq!(self.gens.len(), self.order.len());
    }
}

impl std::hash::Hash for Newest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.gens.hash(state);
    }
}

impl PartialEq for Newest {
    fn eq(&self, other: &Self) -> bool {
        self.gens == other.gens
    }
}

impl Eq for Newest {}

impl Default for Rooms {
    fn default() -> Self {
        Rooms {
            rooms: Shared::new(Vec::new()),
            newest: Shared::new(Newest::default()),
        }
    }
}

impl Rooms {
    /// The same lists, shared (see [`crate::OracleState::same_parts`]).
    pub(crate) fn same_parts(&self, other: &Rooms) -> bool {
        self.rooms.same(&other.rooms) && self.newest.same(&other.newest)
    }

    fn index(&self, room: RoomKey) -> Result<usize, usize> {
        self.rooms.get().binary_search_by_key(&room, |(k, _)| *k)
    }

    /// The facts of a routed room use not yet cleared.
    pub fn get(&self, room: RoomKey) -> Option<&RoomFacts> {
        self.index(room).ok().map(|i| &self.rooms.get()[i].1)
    }

    /// Every room use, sorted by key.
    pub fn all(&self) -> &[(RoomKey, RoomFacts)] {
        self.rooms.get()
    }

    /// The room use serving `req`, if it is still open.
    pub fn of_request(&self, req: RequestId) -> Option<RoomKey> {
        self.all()
            .iter()
            .find(|(_, f)| f.req == req)
            .map(|(k, _)| *k)
    }

    /// The router routed `room`: its facts replace any earlier ones. A room use routed
    /// before (S7): the halves key everything they hold by the room use, so a second
    /// attempt in it is a second start for state the first may still hold, and the
    /// router can no longer tell whose answers it gets.
    pub fn routed(&mut self, room: RoomKey, facts: RoomFacts, out: &mut Drafts) {
        match self.newest.get().get(room.room) {
            Some(newest) if newest >= room.gen => {
                let open = match self.get(room) {
                    Some(f) => format!("its earlier attempt ({}) still open", f.req),
                    None => "after it was cleared".to_string(),
                };
                out.push(draft(Invariant::S7, Some(room), format!(
                    "the router routed {room} for {} though generation {} of {} was routed already, {open}: two attempts in one room use, which its halves cannot tell apart",
                    facts.req, newest.0, room.room
                )));
            }
            _ => {
                self.newest.edit().put(room.room, room.gen);
            }
        }
        match self.index(room) {
            Ok(i) => self.rooms.edit()[i].1 = facts,
            Err(i) => self.rooms.edit().insert(i, (room, facts)),
        }
        self.check();
    }

    /// The router cleared `room`.
    pub fn cleared(&mut self, room: RoomKey) {
        if let Ok(i) = self.index(room) {
            self.rooms.edit().remove(i);
        }
        self.check();
    }

    /// Change a room's flags (no copy when nothing changes).
    fn set_flags(&mut self, room: RoomKey, f: impl Fn(EnumSet<RoomFlag>) -> EnumSet<RoomFlag>) {
        let Ok(i) = self.index(room) else {
            return;
        };
        let new = f(self.rooms.get()[i].1.flags);
        if new != self.rooms.get()[i].1.flags {
            self.rooms.edit()[i].1.flags = new;
        }
        debug_assert_eq!(self.rooms.get()[i].1.flags, new);
    }

    /// Note `f` on `room` (nothing when the room is unknown).
    pub fn flag(&mut self, room: RoomKey, f: RoomFlag) {
        self.set_flags(room, |x| x | f);
    }

    /// Take `f` off `room`.
    pub fn unflag(&mut self, room: RoomKey, f: RoomFlag) {
        self.set_flags(room, |x| x - f);
    }

    pub fn has(&self, room: RoomKey, f: RoomFlag) -> bool {
        self.get(room).is_some_and(|r| r.flags.contains(f))
    }

    /// The first status half `half` (0 prefill, 1 decode) of `room` answered, or
    /// `Some(None)` while it has not answered; `None` when the room is unknown.
    pub fn first_answer(&self, room: RoomKey, half: usize) -> Option<Option<Status>> {
        self.get(room).map(|f| f.answered[half])
    }

    /// Record the first answer of half `half` of `room`.
    pub fn set_first_answer(&mut self, room: RoomKey, half: usize, status: Status) {
        if let Ok(i) = self.index(room) {
            debug_assert!(self.rooms.get()[i].1.answered[half].is_none());
            self.rooms.edit()[i].1.answered[half] = Some(status);
        }
    }

    /// A crashed node's restarted incarnation remembers no answer of the dead one: what
    /// it answers for a room use the dead one answered is its own first answer.
    pub fn forget_answers(&mut self, node: NodeId) {
        let hit = |f: &RoomFacts| {
            (f.prefill == node && f.answered[0].is_some())
                || (f.decode == node && f.answered[1].is_some())
        };
        if !self.all().iter().any(|(_, f)| hit(f)) {
            return;
        }
        for (_, f) in self.rooms.edit().iter_mut() {
            if f.prefill == node {
                f.answered[0] = None;
            }
            if f.decode == node {
                f.answered[1] = None;
            }
        }
        debug_assert!(!self.all().iter().any(|(_, f)| hit(f)));
    }

    /// A room use for humans: `room2.g4 (req7 of t2, prompt 700 tokens)`.
    pub fn describe(&self, room: RoomKey) -> String {
        match self.get(room) {
            Some(f) => format!(
                "{room} ({} of {}, prompt {} tokens)",
                f.req, f.tenant, f.prompt_len
            ),
            None => room.to_string(),
        }
    }

    /// What must hold after every change: sorted by key, one entry per key.
    fn check(&self) {
        debug_assert!(
            self.all().windows(2).all(|w| w[0].0 < w[1].0),
            "the room registry is sorted by key, one entry per key"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(req: u64) -> RoomFacts {
        RoomFacts {
            req: RequestId(req),
            tenant: TenantId(1),
            prefill: NodeId(1),
            decode: NodeId(2),
            prompt_len: 4,
            max_new_tokens: 1,
            flags: EnumSet::empty(),
            answered: [None, None],
        }
    }

    /// One routing per room number, each cleared, past the bound: the registry keeps
    /// [`NEWEST_ROOMS`] numbers, a replay of a recent one is S7 and one of the first,
    /// forgotten, passes.
    #[test]
    fn the_newest_generations_are_bounded_and_forget_the_oldest_first() {
        let mut rooms = Rooms::default();
        let mut out = Drafts::new();
        let n = NEWEST_ROOMS as u32 + 10;
        for r in 0..n {
            let key = RoomKey::new(r, 1);
            rooms.routed(key, facts(u64::from(r)), &mut out);
            rooms.cleared(key);
        }
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(rooms.newest.get().gens.len(), NEWEST_ROOMS);
        rooms.routed(RoomKey::new(n - 1, 1), facts(1 << 40), &mut out);
        assert_eq!(out.len(), 1, "a recent replay is S7");
        assert_eq!(out[0].invariant, Invariant::S7);
        out.clear();
        rooms.routed(RoomKey::new(0, 1), facts(1 << 41), &mut out);
        assert!(out.is_empty(), "the oldest number was forgotten: {out:?}");
    }
}
