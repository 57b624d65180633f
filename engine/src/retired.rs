//! `RetiredRooms`: which uses of each room number a node has already answered.
//!
//! Room numbers are reused with a new generation each time, and the router only ever
//! hands out higher generations for a number. So one newest-retired generation per
//! number is enough to recognise any late, duplicated or reordered message for a room
//! use this node already finished: it is stale if its generation is at most that.
//! Bounded by the router's room table. Not a message filter for live rooms.

use crate::ids::{Generation, RoomId, RoomKey};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct RetiredRooms(BTreeMap<RoomId, Generation>);

impl RetiredRooms {
    /// Has this node already retired `room` (this generation or a newer one)?
    pub fn is_stale(&self, room: RoomKey) -> bool {
        self.0.get(&room.room).is_some_and(|g| *g >= room.gen)
    }

    /// Record that `room` is retired here.
    pub fn retire(&mut self, room: RoomKey) {
        let g = self.0.entry(room.room).or_insert(room.gen);
        *g = (*g).max(room.gen);
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}
