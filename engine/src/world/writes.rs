//! The KV writes one writer posted and has not seen complete: exactly one completion
//! per write, for a driver whose writes leave its hands (the hardware runtime).

use crate::ids::{NodeId, WriteId};
use crate::msg::KvWrite;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::hash::Hash;

/// The KV writes one writer posted and has not seen complete, by receiver: the rule
/// "exactly one completion per write" for a driver whose writes leave its hands (the
/// hardware runtime's ride TCP, where a broken connection, not the network model, is
/// what fails them). A write enters at [`post`](Self::post) and leaves once: at its
/// completion ([`complete`](Self::complete)), when it fails
/// ([`fail`](Self::fail), [`peer_lost`](Self::peer_lost)) or when its writer crashes
/// ([`crash`](Self::crash)); whatever comes for it afterwards is not its completion.
/// (The simulator, the model checker and the hand-stepped driver hold the messages
/// themselves, so a write's fate there is the fate of its one message.)
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct WritesInFlight {
    posted: BTreeMap<NodeId, BTreeSet<WriteId>>,
}

impl WritesInFlight {
    pub fn new() -> Self {
        Self::default()
    }

    /// `write` leaves for `to`: it is in flight from now on.
    pub fn post<K>(&mut self, to: NodeId, write: &KvWrite<K>) {
        self.post_id(to, write.id);
    }

    /// The write `id` left for `to` (as [`post`](Self::post), by its id: a driver that
    /// replays a trace's `KvSent`).
    pub fn post_id(&mut self, to: NodeId, id: WriteId) {
        let fresh = self.posted.entry(to).or_default().insert(id);
        assert!(fresh, "a write id is posted once ({id} to {to})");
    }

    /// A completion of `id` came from `from`: `true` the one time it is the write's
    /// completion (the write leaves flight); `false` when `id` is not in flight to
    /// `from` (completed or failed already, or never posted to it): not a completion.
    pub fn complete(&mut self, from: NodeId, id: WriteId) -> bool {
        self.take(from, id)
    }

    /// The write `id` to `to` failed: `true` the one time it fails (it leaves flight,
    /// and its writer gets one failed completion); `false` when it is not in flight.
    pub fn fail(&mut self, to: NodeId, id: WriteId) -> bool {
        self.take(to, id)
    }

    /// The link to `peer` broke: every write posted on it fails. Taken out of flight
    /// and returned in id order, each for its one failed completion.
    pub fn peer_lost(&mut self, peer: NodeId) -> Vec<WriteId> {
        let lost: Vec<WriteId> = self.posted.remove(&peer).into_iter().flatten().collect();
        assert!(!self.posted.contains_key(&peer));
        lost
    }

    /// The writer crashed: its NIC's queue is flushed with it and its new incarnation
    /// awaits no completion of the dead one's writes. Every write in flight leaves,
    /// returned in (receiver, id) order: the crash record's `flushed` list.
    pub fn crash(&mut self) -> Vec<WriteId> {
        let flushed: Vec<WriteId> = std::mem::take(&mut self.posted)
            .into_values()
            .flatten()
            .collect();
        assert!(self.is_empty());
        flushed
    }

    /// Every write in flight, as (receiver, write), in that order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, WriteId)> + '_ {
        let by_peer = self.posted.iter();
        by_peer.flat_map(|(to, ids)| ids.iter().map(move |id| (*to, *id)))
    }

    pub fn len(&self) -> usize {
        self.posted.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.posted.values().all(BTreeSet::is_empty)
    }

    fn take(&mut self, to: NodeId, id: WriteId) -> bool {
        let Some(ids) = self.posted.get_mut(&to) else {
            return false;
        };
        let taken = ids.remove(&id);
        if ids.is_empty() {
            self.posted.remove(&to);
        }
        taken
    }
}
