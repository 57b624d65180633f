//! [`Pages`], the node books themselves: one shared book per node, the guarded edit
//! of one book, and what happens to a node as a whole (admitting and answering a
//! half, stopping, crashing, restarting) and what the other checkers ask of it. It
//! does not judge the page rules ([`crate::check::pages::lifecycle`],
//! [`crate::check::pages::landing`], [`crate::check::pages::release`]).

use crate::check::book::NodeBook;
use crate::schema::RunHeader;
use crate::shared::{Edit, Shared};
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey};
use kvsim_engine::kv::PageState;
use kvsim_engine::node::Role;
use kvsim_engine::trace::Side;
use std::sync::Arc;

/// The node books. Index = node id (the client and unknown ids have no book); each
/// book is shared and hashed as one part.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Pages {
    /// Shared with the parent state's copy (a model state's clone copies no list);
    /// hashes and compares as the slice it holds.
    pub nodes: Arc<[Option<Shared<NodeBook>>]>,
}

/// Guard of a book being changed: checks the book's invariants when it goes.
pub struct BookEdit<'a>(Edit<'a, NodeBook>);

impl std::ops::Deref for BookEdit<'_> {
    type Target = NodeBook;
    fn deref(&self) -> &NodeBook {
        &self.0
    }
}
impl std::ops::DerefMut for BookEdit<'_> {
    fn deref_mut(&mut self) -> &mut NodeBook {
        &mut self.0
    }
}
impl Drop for BookEdit<'_> {
    fn drop(&mut self) {
        self.0.check();
    }
}

/// Insert `room` in the sorted set `set` (no change if it is there).
pub(super) fn insert_sorted(set: &mut Vec<RoomKey>, room: RoomKey) {
    if let Err(i) = set.binary_search(&room) {
        set.insert(i, room);
    }
}

/// Remove `room` from the sorted set `set` (no change if it is not there).
pub(super) fn remove_sorted(set: &mut Vec<RoomKey>, room: RoomKey) {
    if let Ok(i) = set.binary_search(&room) {
        set.remove(i);
    }
}

impl Pages {
    /// The same books, shared (see [`OracleState::same_parts`]).
    pub(crate) fn same_parts(&self, other: &Pages) -> bool {
        Arc::ptr_eq(&self.nodes, &other.nodes)
    }

    pub fn new(h: &RunHeader) -> Self {
        let n = h
            .nodes
            .iter()
            .map(|n| n.id.0 as usize + 1)
            .max()
            .unwrap_or(0);
        let mut nodes = vec![None; n];
        for info in &h.nodes {
            nodes[info.id.0 as usize] = Some(Shared::new(NodeBook::new(
                info.role,
                info.pool_pages.unwrap_or(0),
                0,
            )));
        }
        Pages {
            nodes: nodes.into(),
        }
    }

    pub fn book(&self, n: NodeId) -> Option<&NodeBook> {
        self.nodes
            .get(n.0 as usize)
            .and_then(Option::as_ref)
            .map(Shared::get)
    }

    pub(super) fn book_mut(&mut self, n: NodeId) -> Option<BookEdit<'_>> {
        // The list is copied (if shared) only when there is a book to edit.
        self.nodes.get(n.0 as usize)?.as_ref()?;
        Arc::make_mut(&mut self.nodes)[n.0 as usize]
            .as_mut()
            .map(|s| BookEdit(s.edit()))
    }

    /// Every node with a book, with its id.
    pub fn books(&self) -> impl Iterator<Item = (NodeId, &NodeBook)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((NodeId(i as u16), b.as_ref()?.get())))
    }

    /// The incarnation `node` is in (`None`: no book).
    pub fn epoch(&self, node: NodeId) -> Option<u32> {
        self.book(node).map(|b| b.epoch)
    }

    /// The side a node serves (`None` for the router and unknown nodes).
    pub fn side_of(&self, node: NodeId) -> Option<Side> {
        match self.book(node)?.role {
            Role::Prefill => Some(Side::Prefill),
            Role::Decode => Some(Side::Decode),
            Role::Router => None,
        }
    }

    /// Is `room`'s half on `node` admitted and not answered?
    pub fn is_open(&self, node: NodeId, room: RoomKey) -> bool {
        self.book(node)
            .is_some_and(|b| b.open.binary_search(&room).is_ok())
    }

    /// `node` admitted its half of `room`.
    pub fn admitted(&mut self, node: NodeId, room: RoomKey) {
        if self
            .book(node)
            .is_some_and(|b| b.open.binary_search(&room).is_err())
        {
            if let Some(mut b) = self.book_mut(node) {
                insert_sorted(&mut b.open, room);
            }
        }
    }

    /// `node` answered its half of `room`.
    pub fn answered(&mut self, node: NodeId, room: RoomKey) {
        if self.is_open(node, room) {
            if let Some(mut b) = self.book_mut(node) {
                remove_sorted(&mut b.open, room);
            }
        }
    }

    /// `node` stopped itself loudly.
    pub fn stopped(&mut self, node: NodeId) {
        if let Some(mut b) = self.book_mut(node) {
            b.stopped = true;
        }
    }

    /// `node` crashed: it holds no half and no quarantine any more.
    pub fn crashed(&mut self, node: NodeId) {
        if let Some(mut b) = self.book_mut(node) {
            b.open.clear();
            b.quarantined.clear();
        }
    }

    /// `node` restarted in `epoch`: a new incarnation, an empty pool in the new epoch.
    /// KV memory is not zeroed, so what each page held (its provenance) stays.
    pub fn restarted(&mut self, node: NodeId, epoch: u32) {
        if let Some(mut b) = self.book_mut(node) {
            let fresh = NodeBook::new(b.role, b.pool_pages() as u32, epoch);
            let old = std::mem::replace(&mut *b, fresh);
            debug_assert_eq!(old.pages.len(), b.pages.len(), "a restart keeps the pool");
            for (p, o) in b.pages.iter_mut().zip(old.pages) {
                p.prov = o.prov;
            }
        }
    }

    /// What each node still does for `room`: the half it has not answered, the pages
    /// it still owns for it (quarantined pages are let go). Empty when every node is
    /// done with it (bounded cleanup, L6).
    pub fn still_working(&self, room: RoomKey) -> Vec<(NodeId, String)> {
        let mut out = Vec::new();
        for (node, b) in self.books() {
            if b.open.binary_search(&room).is_ok() {
                out.push((node, "has not answered its half".to_string()));
            }
            let held = b
                .pages
                .iter()
                .filter(|p| p.owner == Some(room) && p.state != PageState::Quarantined)
                .count();
            if held > 0 {
                out.push((node, format!("still owns {held} of its pages")));
            }
        }
        out
    }

    /// Did a write of `room` land in every page of its transfer destination on `node`
    /// (its pages in `Writing`, or just made `Ready` by the acceptance being judged)?
    /// S4's "every reserved page written", from the trace's `KvLanded` records
    /// ([`PageFact::landed`](crate::check::book::PageFact::landed)). `None` when the
    /// trace holds no such page (a trace without page records, written by hand or of
    /// one node only).
    pub fn transfer_written(&self, node: NodeId, room: RoomKey) -> Option<bool> {
        let b = self.book(node)?;
        let mut dst = b
            .pages
            .iter()
            .filter(|p| p.owner == Some(room))
            .filter(|p| matches!(p.state, PageState::Writing | PageState::Ready))
            .peekable();
        dst.peek()?;
        Some(dst.all(|p| p.landed))
    }

    /// The transfer of `room` on `node` was judged: its pages' landing marks are spent.
    pub fn transfer_judged(&mut self, node: NodeId, room: RoomKey) {
        let marked = self
            .book(node)
            .is_some_and(|b| b.pages.iter().any(|p| p.owner == Some(room) && p.landed));
        if !marked {
            return;
        }
        if let Some(mut b) = self.book_mut(node) {
            for p in b.pages.iter_mut().filter(|p| p.owner == Some(room)) {
                p.landed = false;
            }
        }
    }

    /// The pages `node` has for `room`, at their generations.
    pub fn owned_by(&self, node: NodeId, room: RoomKey) -> Vec<PageTag> {
        self.book(node).map_or(Vec::new(), |b| {
            b.pages
                .iter()
                .enumerate()
                .filter(|(_, p)| p.owner == Some(room))
                .map(|(i, p)| PageTag {
                    page: PageId(i as u32),
                    gen: p.gen,
                })
                .collect()
        })
    }
}
