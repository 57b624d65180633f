//! Data faults of the wire and the receiving NIC on a KV write that lands (wrong
//! contents, wrong place, a stale duplicate), stated once for every driver that draws
//! them. The fault injection itself (`alter`, `WriteHistory` and their helpers) is
//! behind the `testing` feature.

#[cfg(feature = "testing")]
use crate::gpu::KvPayload;
use crate::ids::PageTag;
pub use crate::transport::DataFault;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::hash::Hash;
#[cfg(feature = "testing")]
use {
    crate::ids::{NodeId, PageId, WriteId},
    crate::msg::{KvWrite, Msg},
    std::collections::{BTreeMap, VecDeque},
};

/// What a data fault did to one write: the page of the write it hit (index into the
/// write's pages) and, for a misdirected page, where it went instead. For a stale
/// duplicate: the page of the duplicate that lands over newer contents, `meant` the
/// tag the newer write gave that page, `landed` the duplicate's own (earlier) tag.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
pub struct Altered {
    pub fault: DataFault,
    pub index: usize,
    pub meant: PageTag,
    pub landed: PageTag,
}

/// Apply `fault` to a KV write [`arrival`](crate::world::arrival) delivers to a node whose pool has
/// `receiver_pages` pages; `salt` (a driver's draw, or a fixed value in the model
/// checker) picks the page and the slot. `None` when the fault has nothing to act on
/// (no pages, a one-page pool for a misdirect) or does not change the write itself
/// (a stale duplicate is a second write: [`WriteHistory::duplicate`]).
#[cfg(feature = "testing")]
pub fn alter<K: KvPayload>(
    write: &mut KvWrite<K>,
    fault: DataFault,
    receiver_pages: u32,
    salt: u64,
) -> Option<Altered> {
    let KvWrite { dst, kv, .. } = write;
    if dst.is_empty() || dst.len() != kv.len() {
        return None;
    }
    let index = match fault {
        DataFault::StaleDuplicate => return None,
        DataFault::Torn => dst.len() - 1,
        _ => (salt % dst.len() as u64) as usize,
    };
    let meant = dst[index];
    match fault {
        DataFault::Corrupt => kv[index].corrupt(salt >> 8),
        DataFault::Torn => kv[index].tear(),
        DataFault::StaleDuplicate => return None,
        DataFault::Misdirect => {
            if receiver_pages < 2 || meant.page.0 == 0 || meant.page.0 > receiver_pages {
                return None;
            }
            dst[index].page = PageId(meant.page.0 % receiver_pages + 1);
        }
    }
    Some(Altered {
        fault,
        index,
        meant,
        landed: dst[index],
    })
}

/// How many earlier KV writes per receiving node [`WriteHistory`] keeps.
pub const DUPLICATE_WINDOW: usize = 16;

/// The KV writes each node took lately (newest last, at most [`DUPLICATE_WINDOW`]
/// per node), as their writers sent them, for a [`DataFault::StaleDuplicate`]. A
/// driver that draws stale duplicates remembers every write [`arrival`](crate::world::arrival) delivers
/// (before any [`alter`]) and forgets a node's writes when it crashes (the
/// connections a retransmission would ride die with the incarnation). Keyed by node
/// in a `BTreeMap`, so what it returns depends only on what was remembered, in order.
#[derive(Clone, Debug, Default)]
#[cfg(feature = "testing")]
pub struct WriteHistory<K> {
    taken: BTreeMap<NodeId, VecDeque<(NodeId, KvWrite<K>)>>,
}

#[cfg(feature = "testing")]
impl<K: Clone> WriteHistory<K> {
    pub fn new() -> Self {
        WriteHistory {
            taken: BTreeMap::new(),
        }
    }

    /// `to` took the KV write `msg` of `from`.
    pub fn remember(&mut self, from: NodeId, to: NodeId, msg: &KvWrite<K>) {
        let q = self.taken.entry(to).or_default();
        if q.len() == DUPLICATE_WINDOW {
            q.pop_front();
        }
        q.push_back((from, msg.clone()));
    }

    /// `node` crashed: no write to it or from it can be retransmitted any more.
    pub fn crash(&mut self, node: NodeId) {
        self.taken.remove(&node);
        for q in self.taken.values_mut() {
            q.retain(|(from, _)| *from != node);
        }
    }

    /// The stale duplicate that lands at `to` over the write `newer` (which `to`
    /// takes now, not yet remembered): an earlier write to `to` that addressed one of
    /// the pages `newer` writes (an earlier use of the page), or failing that any
    /// earlier write to `to`; `salt` picks among them. Returns the writer, the
    /// duplicate (as it was sent) and what it does. `None` when `to` took no other
    /// write yet.
    pub fn duplicate(
        &self,
        to: NodeId,
        newer: &KvWrite<K>,
        salt: u64,
    ) -> Option<(NodeId, KvWrite<K>, Altered)> {
        let KvWrite {
            id: new_id,
            dst: new_dst,
            ..
        } = newer;
        let earlier: Vec<&(NodeId, KvWrite<K>)> = self
            .taken
            .get(&to)?
            .iter()
            .filter(|(_, m)| m.id != *new_id)
            .collect();
        let overlap = |m: &KvWrite<K>| {
            m.dst
                .iter()
                .position(|t| new_dst.iter().any(|n| n.page == t.page))
        };
        let over: Vec<&(NodeId, KvWrite<K>)> = earlier
            .iter()
            .copied()
            .filter(|(_, m)| overlap(m).is_some())
            .collect();
        let pool = if over.is_empty() { earlier } else { over };
        let (from, dup) = pool.get((salt % pool.len().max(1) as u64) as usize)?;
        Some((*from, dup.clone(), stale_landing(dup, new_dst)?))
    }
}

/// What the stale duplicate `dup` (a KV write landing again, as it was sent) does
/// over the newer contents `newer` of its receiver (the tags a newer write gives those
/// pages, or the pages' current tags): the first of its pages that `newer` also holds
/// (else its first page) is the one it lands over, `landed` its own (earlier) tag and
/// `meant` the newer tag of that page (its own when `newer` has none). `None` for a
/// write without pages. The one statement of the fault's record, for
/// [`WriteHistory::duplicate`] and for a driver that keeps a copy of a write itself
/// (the model checker).
#[cfg(feature = "testing")]
pub fn stale_landing<K>(dup: &KvWrite<K>, newer: &[PageTag]) -> Option<Altered> {
    let dst = &dup.dst;
    let index = dst
        .iter()
        .position(|t| newer.iter().any(|n| n.page == t.page))
        .unwrap_or(0);
    let landed = *dst.get(index)?;
    let meant = newer
        .iter()
        .find(|n| n.page == landed.page)
        .copied()
        .unwrap_or(landed);
    Some(Altered {
        fault: DataFault::StaleDuplicate,
        index,
        meant,
        landed,
    })
}

/// Is `msg`, sent while a driver delivers the stale duplicate of write `dup`, the
/// receiver's completion of that duplicate? The driver drops it: the writer's NIC
/// completed the write once, when it first landed, and reports nothing for a
/// retransmission it does not know about.
#[cfg(feature = "testing")]
pub fn duplicate_completion(dup: WriteId, msg: &Msg) -> bool {
    matches!(msg, Msg::WriteDone { id, .. } if *id == dup)
}
