//! Every node's pending timers, as one sorted value a driver keeps.

use crate::env::{Timer, TimerOp};
use crate::ids::{NodeId, RoomKey};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};

/// Pending timers of every node, with a driver's token each (`()` when the driver
/// needs none). Setting a timer replaces a pending one of the same value; a crash
/// kills all of a node's timers. Sorted by (node, timer), so equal sets are equal
/// values. Each (node, timer) is kept as its [`TimerKey`], whose integer order is the
/// pair's order, so a lookup compares integers; `Debug` and `Hash` state the pairs,
/// as a list of `((node, timer), token)` would.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Timers<T> {
    pending: Vec<(TimerKey, T)>,
}

impl<T> Timers<T> {
    /// Where the pending timers live (for a cache prefetch hint; never dereferenced).
    pub fn as_ptr(&self) -> *const u8 {
        self.pending.as_ptr().cast()
    }
}

/// A (node, timer) pair as three integers ordered as the pair is (node, then the
/// timer's variant in declaration order, then its fields in order): one-to-one, so
/// equal keys are equal pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct TimerKey {
    /// Node (bits 40..56), variant (32..40), room (0..32).
    head: u64,
    /// The room's generation.
    gen: u64,
    /// A drain retry's arming.
    arming: u32,
}

impl TimerKey {
    fn of(node: NodeId, timer: Timer) -> Self {
        let (variant, room, arming) = timer.parts();
        TimerKey {
            head: u64::from(node.0) << 40 | u64::from(variant) << 32 | u64::from(room.room.0),
            gen: room.gen.0,
            arming,
        }
    }

    fn pair(self) -> (NodeId, Timer) {
        let node = NodeId((self.head >> 40) as u16);
        let room = RoomKey::new(self.head as u32, self.gen);
        let timer = match (self.head >> 32) as u8 {
            0 => Timer::Compute,
            1 => Timer::Bootstrap(room),
            2 => Timer::WaitingForKv(room),
            3 => Timer::DrainRetry(room, self.arming),
            4 => Timer::Request(room),
            5 => Timer::Lease(room),
            6 => Timer::Heartbeat(room),
            7 => Timer::Pairing(room),
            v => unreachable!("no timer has variant {v} (Timer::parts)"),
        };
        (node, timer)
    }
}

impl<T: Debug> Debug for Timers<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: Vec<_> = self.pending.iter().map(|(k, t)| (k.pair(), t)).collect();
        f.debug_struct("Timers").field("pending", &pairs).finish()
    }
}

impl<T: Hash> Hash for Timers<T> {
    /// As the derived hash of a `Vec<((NodeId, Timer), T)>`: its length, then each.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.pending.len());
        for (k, t) in &self.pending {
            (k.pair(), t).hash(state);
        }
    }
}

impl<T> Timers<T> {
    pub fn new() -> Self {
        Timers {
            pending: Vec::new(),
        }
    }

    fn find(&self, key: (NodeId, Timer)) -> Result<usize, usize> {
        let key = TimerKey::of(key.0, key.1);
        self.pending.binary_search_by(|(k, _)| k.cmp(&key))
    }

    /// Apply a node's timer operation; `token` identifies the timer set now.
    pub fn apply(&mut self, node: NodeId, op: TimerOp, token: T) {
        match op {
            TimerOp::Set { timer, .. } => match self.find((node, timer)) {
                Ok(i) => self.pending[i].1 = token,
                Err(i) => self.pending.insert(i, (TimerKey::of(node, timer), token)),
            },
            TimerOp::Cancel { timer } => {
                self.take(node, timer);
            }
        }
    }

    /// Take a pending timer out (it fires, or was cancelled); its token if it was set.
    pub fn take(&mut self, node: NodeId, timer: Timer) -> Option<T> {
        self.find((node, timer))
            .ok()
            .map(|i| self.pending.remove(i).1)
    }

    pub fn get(&self, node: NodeId, timer: Timer) -> Option<&T> {
        self.find((node, timer)).ok().map(|i| &self.pending[i].1)
    }

    /// A crash: every timer of `node` dies.
    pub fn crash(&mut self, node: NodeId) {
        self.pending.retain(|(k, _)| k.pair().0 != node);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Every pending timer, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, Timer)> + '_ {
        self.pending.iter().map(|(k, _)| k.pair())
    }

    /// The pending timers of one node.
    pub fn of(&self, node: NodeId) -> impl Iterator<Item = Timer> + '_ {
        self.iter().filter(move |(n, _)| *n == node).map(|(_, t)| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer's key orders as its (node, timer) pair and gives the pair back, for
    /// every variant and at the ends of each field's range.
    #[test]
    fn timer_keys_order_as_their_pairs() {
        let rooms = [
            RoomKey::new(0, 0),
            RoomKey::new(1, 7),
            RoomKey::new(1, u64::MAX),
            RoomKey::new(u32::MAX, 0),
        ];
        let mut pairs = vec![];
        for node in [NodeId(0), NodeId(3), NodeId(u16::MAX)] {
            pairs.push((node, Timer::Compute));
            for r in rooms {
                pairs.push((node, Timer::Bootstrap(r)));
                pairs.push((node, Timer::WaitingForKv(r)));
                pairs.push((node, Timer::Request(r)));
                for n in [0, 1, u32::MAX] {
                    pairs.push((node, Timer::DrainRetry(r, n)));
                }
            }
        }
        for a in &pairs {
            assert_eq!(TimerKey::of(a.0, a.1).pair(), *a);
            for b in &pairs {
                assert_eq!(
                    TimerKey::of(a.0, a.1).cmp(&TimerKey::of(b.0, b.1)),
                    a.cmp(b),
                    "{a:?} against {b:?}"
                );
            }
        }
    }
}
