//! `RetiredRooms`: which uses of each room number a node has already answered, and how.
//!
//! Room numbers are reused with a new generation each time, and the router only ever
//! hands out higher generations for a number. So one newest-retired generation per
//! number is enough to recognise any late, duplicated or reordered message for a room
//! use this node already finished: it is stale if its generation is at most that.
//! With it the node keeps the status it answered for that use, so that an answer it
//! repeats (an abort seen again, after a lost answer) is the first answer again, never
//! a second one with another status. Bounded by the router's room table. Not a message
//! filter for live rooms.

use crate::ids::{Generation, RoomId, RoomKey};
use crate::msg::{Status, Why};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct RetiredRooms(BTreeMap<RoomId, (Generation, Option<Answer>)>);

/// The first answer a node gave for a room use: its status and the engine's reason.
type Answer = (Status, Option<Why>);

impl RetiredRooms {
    /// Has this node already retired `room` (this generation or a newer one)?
    pub fn is_stale(&self, room: RoomKey) -> bool {
        self.0.get(&room.room).is_some_and(|(g, _)| *g >= room.gen)
    }

    /// Record that `room` is retired here (not yet answered, if it is new).
    pub fn retire(&mut self, room: RoomKey) {
        let e = self.0.entry(room.room).or_insert((room.gen, None));
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
    /// awaited, and the node still says it let the use go).
    pub fn answer(&mut self, room: RoomKey, status: Status, why: Option<Why>) -> Answer {
        let e = self.0.entry(room.room).or_insert((room.gen, None));
        if e.0 > room.gen {
            return (status, why);
        }
        if e.0 < room.gen {
            *e = (room.gen, None);
        }
        *e.1.get_or_insert((status, why))
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}
