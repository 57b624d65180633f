//! `EventQueue`: the simulator's event queue, ordered by (virtual time, sequence
//! number).
//!
//! A binary heap orders small keys (time, sequence number, slot) while the events
//! themselves stay put in a slab of reused slots: a push or a pop moves 24 bytes per
//! heap level instead of a whole event, and an event needs no box of its own to stay
//! cheap to move. The heap sees exactly the comparisons a heap of whole events would
//! (sequence numbers are unique, so the slot never decides an order), so its layout,
//! and with it the order [`EventQueue::take_all`] hands out, is the same as theirs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Where an event waits: its time, its sequence number, its slot in the slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    at_ns: u64,
    seq: u64,
    slot: u32,
}

/// Events of type `E`, popped earliest first (ties by sequence number).
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Key>>,
    slots: Vec<Option<E>>,
    free: Vec<u32>,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<E> EventQueue<E> {
    /// Queue `ev` at `at_ns`; `seq` must be unique among the queued events.
    pub fn push(&mut self, at_ns: u64, seq: u64, ev: E) {
        let slot = match self.free.pop() {
            Some(s) => {
                debug_assert!(self.slots[s as usize].is_none(), "a free slot is empty");
                self.slots[s as usize] = Some(ev);
                s
            }
            None => {
                self.slots.push(Some(ev));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 queued events")
            }
        };
        self.heap.push(Reverse(Key { at_ns, seq, slot }));
    }

    /// The earliest event and its time.
    pub fn peek(&self) -> Option<(u64, &E)> {
        let Reverse(k) = self.heap.peek()?;
        let ev = self.slots[k.slot as usize].as_ref()?;
        Some((k.at_ns, ev))
    }

    /// Take the earliest event: its time, its sequence number and the event.
    pub fn pop(&mut self) -> Option<(u64, u64, E)> {
        let Reverse(k) = self.heap.pop()?;
        let ev = self.slots[k.slot as usize].take()?;
        self.free.push(k.slot);
        Some((k.at_ns, k.seq, ev))
    }

    /// Empty the queue: every event with its time and sequence number, in the heap's
    /// own (deterministic, unsorted) order.
    pub fn take_all(&mut self) -> Vec<(u64, u64, E)> {
        let keys = std::mem::take(&mut self.heap).into_vec();
        let slots = &mut self.slots;
        let all = keys
            .into_iter()
            .filter_map(|Reverse(k)| Some((k.at_ns, k.seq, slots[k.slot as usize].take()?)))
            .collect();
        self.slots.clear();
        self.free.clear();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue hands out events in (time, sequence) order, and `take_all` in the
    /// order a heap of whole events holds them.
    #[test]
    fn same_order_as_a_heap_of_whole_events() {
        let mut q = EventQueue::default();
        let mut whole = BinaryHeap::new();
        let mut seq = 0u64;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            seq += 1;
            let at = x % 50;
            q.push(at, seq, (round, at));
            whole.push(Reverse((at, seq, (round, at))));
            if x.is_multiple_of(3) {
                let a = q.pop();
                let b = whole.pop().map(|Reverse(t)| t);
                assert_eq!(a, b, "pop in round {round}");
            }
        }
        let rest: Vec<_> = whole.into_vec().into_iter().map(|Reverse(t)| t).collect();
        assert_eq!(q.take_all(), rest);
        assert!(q.pop().is_none(), "take_all empties the queue");
    }
}
