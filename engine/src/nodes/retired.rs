//! `RetiredRooms`: which uses of each room number a node has already answered, and how.
//!
//! Room numbers are reused with a new generation each time, and the router only ever
//! hands out higher generations for a number. So one newest-retired generation per
//! number is enough to recognise any late, duplicated or reordered message for a room
//! use this node already finished: it is stale if its generation is at most that.
//! With it the node keeps the status (and reason) it answered for that use, so that an
//! answer it repeats (an abort seen again, after a lost answer) is the first answer
//! again, never a second one with another status. Not a message filter for live rooms.
//!
//! Bounded ([`GenTable`]): records are kept in two generations of at most `half` room
//! numbers each, `half = max(max_rooms, RETIRED_MIN_HALF)`. When the newer generation
//! is full, the older one is dropped and the newer becomes the older, so a record
//! survives at least `half` retirements of other room numbers, and the table never
//! holds more than `2 * half` numbers plus those the node still holds (a record whose
//! room the node still holds is carried over, never dropped: a quarantined use on
//! decode, writes outstanding on prefill). Under the engine's router the room numbers
//! are `1..=max_rooms`, so nothing is ever dropped (the model checker's states are the
//! unbounded table's); behind SGLang's router (worker mode), where every request has a
//! room number of its own, the table stops growing at the bound.

use crate::env::Outbox;
use crate::ids::{Generation, NodeId, RoomId, RoomKey};
use crate::msg::{Msg, Status, Why};
use crate::trace::{Side, TraceEvent};
use std::collections::BTreeMap;

/// The smallest generation a node's retired table keeps (room numbers): behind
/// SGLang's router, a finished use's record outlives at least this many later
/// retirements, far more than the requests a node can have in flight (its queue) and
/// far longer than a late peer message takes on a live connection.
pub const RETIRED_MIN_HALF: usize = 4096;

/// A bounded map from room number to the newest generation seen and a value: two
/// generations of at most `half` numbers each (see the module doc).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct GenTable<V> {
    current: BTreeMap<RoomId, (Generation, V)>,
    previous: BTreeMap<RoomId, (Generation, V)>,
    half: usize,
}

impl<V> GenTable<V> {
    /// A table of two generations of at most `half` (at least 1) numbers each.
    pub fn new(half: usize) -> Self {
        GenTable {
            current: BTreeMap::new(),
            previous: BTreeMap::new(),
            half: half.max(1),
        }
    }

    /// The most numbers the table holds, besides those carried over as held.
    pub fn bound(&self) -> usize {
        2 * self.half
    }

    /// Numbers recorded now.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record of `room`, if the table still has it.
    pub fn get(&self, room: RoomId) -> Option<&(Generation, V)> {
        self.current.get(&room).or_else(|| self.previous.get(&room))
    }

    /// The record of `room`, made current (a new one from `new` if there is none).
    /// Making room may drop the older generation, except the numbers `held` names.
    pub fn entry(
        &mut self,
        room: RoomId,
        new: impl FnOnce() -> (Generation, V),
        held: &dyn Fn(RoomId) -> bool,
    ) -> &mut (Generation, V) {
        if !self.current.contains_key(&room) {
            let rec = self.previous.remove(&room);
            if self.current.len() >= self.half {
                let dropped =
                    std::mem::replace(&mut self.previous, std::mem::take(&mut self.current));
                self.current
                    .extend(dropped.into_iter().filter(|(n, _)| held(*n)));
            }
            self.current.insert(room, rec.unwrap_or_else(new));
        }
        self.current
            .get_mut(&room)
            .expect("inserted above when absent")
    }

    /// Forget `room`'s record, returning it.
    pub fn remove(&mut self, room: RoomId) -> Option<(Generation, V)> {
        self.current
            .remove(&room)
            .or_else(|| self.previous.remove(&room))
    }

    pub fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
    }
}

/// Does `map` (a node's rooms that still hold something) have a use of room number `n`?
pub fn holds<V>(map: &BTreeMap<RoomKey, V>, n: RoomId) -> bool {
    map.range(
        RoomKey {
            room: n,
            gen: Generation(0),
        }..,
    )
    .next()
    .is_some_and(|(k, _)| k.room == n)
}

/// The first answer a node gave for a room use: its status and the engine's reason.
pub type Answer = (Status, Option<Why>);

/// A half's answer for `room` to its router (`PrefillFinished` or `DecodeFinished`),
/// traced first as `Responded`: the one way both halves answer.
pub fn send_answer<K>(
    env: &mut Outbox<K>,
    (node, router, side): (NodeId, NodeId, Side),
    room: RoomKey,
    (status, why): Answer,
) {
    env.trace(TraceEvent::Responded {
        node,
        room,
        side,
        status,
    });
    let msg = match side {
        Side::Prefill => Msg::PrefillFinished { room, status, why },
        Side::Decode => Msg::DecodeFinished { room, status, why },
    };
    env.send(router, msg);
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RetiredRooms(GenTable<Option<Answer>>);

impl RetiredRooms {
    /// The retired table of a node whose router has `max_rooms` rooms.
    pub fn new(max_rooms: u32) -> Self {
        RetiredRooms(GenTable::new((max_rooms as usize).max(RETIRED_MIN_HALF)))
    }

    /// Has this node already retired `room` (this generation or a newer one)?
    pub fn is_stale(&self, room: RoomKey) -> bool {
        self.0.get(room.room).is_some_and(|(g, _)| *g >= room.gen)
    }

    /// Record that `room` is retired here (not yet answered, if it is new). `held`
    /// names the room numbers the node still holds (never dropped to make room).
    pub fn retire(&mut self, room: RoomKey, held: &dyn Fn(RoomId) -> bool) {
        let e = self.0.entry(room.room, || (room.gen, None), held);
        if e.0 < room.gen {
            *e = (room.gen, None);
        }
    }

    /// The answer to give for `room` when this node would answer `status` for the
    /// reason `why`: the status and reason it answered first for this use, if it
    /// answered before (recording this answer as that first one otherwise), so that a
    /// repeated answer is the first one again, reason included. A use older than the
    /// newest it retired is answered `status` (its first answer is not kept: the router
    /// cleared that use before it handed out the newer one, so no answer of it is still
    /// awaited, and the node still says it let the use go). `held` as for
    /// [`Self::retire`].
    pub fn answer(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        held: &dyn Fn(RoomId) -> bool,
    ) -> Answer {
        if self.0.get(room.room).is_some_and(|(g, _)| *g > room.gen) {
            return (status, why);
        }
        let e = self.0.entry(room.room, || (room.gen, None), held);
        if e.0 < room.gen {
            *e = (room.gen, None);
        }
        *e.1.get_or_insert((status, why))
    }

    /// A half answers its router for `room`, once: the first answer of the use is
    /// recorded ([`Self::answer`]; `held` are the node's rooms that still hold
    /// something) and sent ([`send_answer`]); a repeated answer repeats the first one's
    /// status and reason. The one definition both halves answer through.
    pub fn answer_once<K, V>(
        &mut self,
        env: &mut Outbox<K>,
        from: (NodeId, NodeId, Side),
        room: RoomKey,
        (status, why): Answer,
        held: &BTreeMap<RoomKey, V>,
    ) {
        let answer = self.answer(room, status, why, &|n| holds(held, n));
        assert!(
            self.0.get(room.room).is_some_and(|(g, _)| *g >= room.gen),
            "the use (or a newer one) of the room is recorded once answered"
        );
        send_answer(env, from, room, answer);
    }

    /// Room numbers recorded now (at most [`Self::bound`] plus the held ones).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bound(&self) -> usize {
        self.0.bound()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE_HELD: &dyn Fn(RoomId) -> bool = &|_| false;

    /// Behind SGLang's router every request has a room number of its own: the table
    /// stays within its bound however many there are, and a recent use is still known.
    #[test]
    fn distinct_rooms_stay_within_the_bound() {
        let mut r = RetiredRooms::new(64);
        assert_eq!(r.bound(), 2 * RETIRED_MIN_HALF);
        let mut most = 0;
        for n in 1..=100_000u32 {
            let key = RoomKey::new(n, u64::from(n) * 3);
            r.retire(key, NONE_HELD);
            r.answer(key, Status::BAD_REQUEST, None, NONE_HELD);
            most = most.max(r.len());
            assert!(r.len() <= r.bound(), "{} records after {n} rooms", r.len());
        }
        assert_eq!(most, r.bound(), "it fills to the bound, then turns over");
        // The last `half` uses are all still stale (retired, late copies ignored).
        for n in (100_000 - RETIRED_MIN_HALF as u32 + 1)..=100_000 {
            assert!(r.is_stale(RoomKey::new(n, u64::from(n) * 3)), "{n}");
        }
        assert!(!r.is_stale(RoomKey::new(1, 3)), "the oldest were let go");
    }

    /// A number the node still holds is carried over, never dropped.
    #[test]
    fn a_held_room_is_never_dropped() {
        let mut r = RetiredRooms::new(1);
        let held = |n: RoomId| n == RoomId(7);
        r.answer(RoomKey::new(7, 1), Status::INTERNAL, None, &held);
        for n in 100..(100 + 10 * RETIRED_MIN_HALF as u32) {
            r.retire(RoomKey::new(n, 1), &held);
            assert!(r.len() <= r.bound() + 1);
        }
        assert!(r.is_stale(RoomKey::new(7, 1)));
        assert_eq!(
            r.answer(RoomKey::new(7, 1), Status::CLIENT_CLOSED, None, &held),
            (Status::INTERNAL, None),
            "the first answer is still the answer"
        );
    }

    /// Under the engine's router the numbers are `1..=max_rooms`: nothing is dropped,
    /// and a repeated answer repeats the first, reason included.
    #[test]
    fn the_routers_own_rooms_are_never_dropped() {
        let mut r = RetiredRooms::new(8);
        for gen in 1..=1000u64 {
            for n in 1..=8u32 {
                let key = RoomKey::new(n, gen);
                let why = Some(Why::TransferFailed);
                assert_eq!(r.answer(key, Status::INTERNAL, why, NONE_HELD).1, why);
                assert_eq!(
                    r.answer(key, Status::CLIENT_CLOSED, None, NONE_HELD),
                    (Status::INTERNAL, why)
                );
            }
            assert_eq!(r.len(), 8);
        }
        assert!(r.is_stale(RoomKey::new(3, 999)));
        assert!(!r.is_stale(RoomKey::new(3, 1001)));
    }
}
