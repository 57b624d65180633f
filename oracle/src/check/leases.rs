//! The leases checker, for vLLM's pull protocol (`nodes/prefill_vllm/`): each lease a
//! prefill node holds on a finished room's pages for its reader, from `Leased` until
//! `LeaseEnded`, and the leases that expired (rather than ended on the reader's
//! notification) whose room's READ has not been served since.
//!
//! It judges what the protocol needs beyond the page book's own invariants: a READ
//! the source's NIC served after the room's lease there expired (S2: the bytes moved
//! through pages their room no longer owned; the page book states the pages, and S3
//! follows where decode attends over them, by provenance), and a lease still held at
//! the end of a drained run (L2: a lease outliving its room). Invariant: both sets
//! are sorted, one entry per (node, room use), and no lease is both open and expired.

use super::{draft, Drafts};
use crate::shared::Shared;
use kvsim_engine::ids::{NodeId, RoomKey, WriteId};
use kvsim_engine::invariant::Invariant;
use std::collections::BTreeSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Leases {
    /// Leases held now.
    pub open: Shared<BTreeSet<(NodeId, RoomKey)>>,
    /// Leases that expired, until their room's READ is served or the node restarts.
    pub expired: Shared<BTreeSet<(NodeId, RoomKey)>>,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            open: Shared::new(BTreeSet::new()),
            expired: Shared::new(BTreeSet::new()),
        }
    }
}

impl Leases {
    pub(crate) fn same_parts(&self, other: &Leases) -> bool {
        self.open.same(&other.open) && self.expired.same(&other.expired)
    }

    /// `node` holds a lease on `room`'s pages.
    pub fn leased(&mut self, node: NodeId, room: RoomKey) {
        self.open.update(|o| o.insert((node, room)));
        self.expired.update(|e| e.remove(&(node, room)));
        self.check();
    }

    /// `node` let `room`'s lease go, `expired` or on the notification.
    pub fn ended(&mut self, node: NodeId, room: RoomKey, expired: bool) {
        self.open.update(|o| o.remove(&(node, room)));
        if expired {
            self.expired.update(|e| e.insert((node, room)));
        }
        self.check();
    }

    /// `node`'s NIC served the READ `read`: S2 if the room's lease there expired.
    pub fn served(&mut self, node: NodeId, read: WriteId, describe: &str, out: &mut Drafts) {
        let key = (node, read.room);
        if !self.expired.get().contains(&key) {
            return;
        }
        self.expired.update(|e| e.remove(&key));
        let reader = read.writer;
        out.push(draft(
            Invariant::S2,
            Some(read.room),
            format!(
                "{node} served {reader}'s READ {read} of {describe} after the room's lease there \
                 expired: its pages were freed and may hold anyone's KV"
            ),
        ));
        self.check();
    }

    /// `node` crashed or restarted: its leases died with it.
    pub fn forget(&mut self, node: NodeId) {
        self.open.update(|o| o.retain(|(n, _)| *n != node));
        self.expired.update(|e| e.retain(|(n, _)| *n != node));
    }

    /// At the end of a drained run: every lease still held outlived its room (L2).
    pub fn at_end(&self, out: &mut Drafts) {
        for (node, room) in self.open.get() {
            let what =
                format!("{node} still holds a lease on {room}'s pages at the end of the run");
            out.push(draft(Invariant::L2, Some(*room), what));
        }
    }

    /// Debug only: no lease is both open and expired.
    fn check(&self) {
        debug_assert!(self
            .open
            .get()
            .intersection(self.expired.get())
            .next()
            .is_none());
    }
}
