//! The evidence of a finding about a page: per page, the last trace entry that wrote
//! it (a `KvWritten` or a `KvLanded`), described as text only for the few pages a
//! finding cites.
//!
//! It is kept for every page of every write, so it must cost next to nothing per
//! write: the pages of the pools the header declares are slots of one vector per node
//! (pages outside them, which only a broken trace names, go to a map), the pages of
//! one write share one record, and a record no other page shares any more (a decode
//! step writing the page its previous step wrote) is overwritten in place, so a
//! steady run of writes allocates nothing. Memory is bounded by the pools plus the
//! out-of-pool pages a trace names.

use crate::schema::RunHeader;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RoomKey, WriteId};
use kvsim_engine::trace::TraceEvent;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What wrote a page: the facts of the event, enough to rebuild it for its line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wrote {
    /// `KvWritten`: `room`'s KV of `tokens` tokens from offset `start`, meant for the
    /// positions from `pos`.
    Written {
        room: RoomKey,
        start: u64,
        tokens: u64,
        pos: Option<u64>,
    },
    /// `KvLanded`: the KV write `write` landed.
    Landed { write: WriteId },
}

/// The trace entry that last wrote a page.
#[derive(Debug)]
struct WriteEntry {
    at_ns: u64,
    seq: u64,
    node: NodeId,
    what: Wrote,
    pages: Vec<PageTag>,
}

impl WriteEntry {
    /// The event as it came.
    fn event(&self) -> TraceEvent {
        let (node, pages) = (self.node, self.pages.clone());
        match self.what {
            Wrote::Written {
                room,
                start,
                tokens,
                pos,
            } => TraceEvent::KvWritten {
                node,
                room,
                pages,
                start,
                tokens,
                pos,
            },
            Wrote::Landed { write } => TraceEvent::KvLanded {
                node,
                write,
                dst: pages,
            },
        }
    }

    /// The evidence line: `[time #seq] what the event says`.
    fn line(&self) -> String {
        format!(
            "[{} #{}] {}",
            crate::render::event::secs(self.at_ns),
            self.seq,
            crate::render::event::describe_event(&self.event())
        )
    }
}

/// Per page, the last entry that wrote it.
#[derive(Debug, Default)]
pub(crate) struct LastWrites {
    /// Index = node id, then page id: the pages of the pools the header declares.
    pool: Vec<Vec<Option<Arc<WriteEntry>>>>,
    /// Pages outside those pools.
    other: BTreeMap<(NodeId, PageId), Arc<WriteEntry>>,
}

impl LastWrites {
    pub(crate) fn new(h: &RunHeader) -> Self {
        let n = h.nodes.iter().map(|n| n.id.0 as usize + 1).max();
        let mut pool = vec![Vec::new(); n.unwrap_or(0)];
        for info in &h.nodes {
            let pages = info.pool_pages.map_or(0, |p| p as usize + 1);
            pool[info.id.0 as usize] = vec![None; pages];
        }
        LastWrites {
            pool,
            other: BTreeMap::new(),
        }
    }

    /// The pool slot of `page` on `node`, when it is a page of a declared pool.
    fn dense(&mut self, node: NodeId, page: PageId) -> Option<&mut Option<Arc<WriteEntry>>> {
        self.pool.get_mut(node.0 as usize)?.get_mut(page.0 as usize)
    }

    /// Take what last wrote `page` on `node` out of its place.
    fn take(&mut self, node: NodeId, page: PageId) -> Option<Arc<WriteEntry>> {
        match self.dense(node, page) {
            Some(slot) => slot.take(),
            None => self.other.remove(&(node, page)),
        }
    }

    /// `e` wrote `page` on `node` last.
    fn put(&mut self, node: NodeId, page: PageId, e: Arc<WriteEntry>) {
        match self.dense(node, page) {
            Some(slot) => *slot = Some(e),
            None => {
                self.other.insert((node, page), e);
            }
        }
    }

    /// The evidence line of the last write of `page` on `node`, if one is known.
    pub(crate) fn line(&self, (node, page): (NodeId, PageId)) -> Option<String> {
        let dense = self
            .pool
            .get(node.0 as usize)
            .and_then(|v| v.get(page.0 as usize));
        match dense {
            Some(e) => e.as_ref().map(|e| e.line()),
            None => self.other.get(&(node, page)).map(|e| e.line()),
        }
    }

    /// Remember the entry `(at_ns, seq)` if its event `ev` writes pages.
    pub(crate) fn remember(&mut self, (at_ns, seq): (u64, u64), ev: &TraceEvent) {
        let (node, pages, what) = match ev {
            TraceEvent::KvWritten {
                node,
                room,
                pages,
                start,
                tokens,
                pos,
            } => {
                let (room, start, tokens, pos) = (*room, *start, *tokens, *pos);
                (
                    *node,
                    pages,
                    Wrote::Written {
                        room,
                        start,
                        tokens,
                        pos,
                    },
                )
            }
            TraceEvent::KvLanded { node, write, dst } => {
                (*node, dst, Wrote::Landed { write: *write })
            }
            _ => return,
        };
        let Some(first) = pages.first() else { return };
        // The record of the first page, when no other page shares it, is reused.
        let mut old = self.take(node, first.page);
        let entry = match old.as_mut().and_then(Arc::get_mut) {
            Some(e) => {
                (e.at_ns, e.seq, e.node, e.what) = (at_ns, seq, node, what);
                e.pages.clear();
                e.pages.extend_from_slice(pages);
                old.expect("the record just reused")
            }
            None => Arc::new(WriteEntry {
                at_ns,
                seq,
                node,
                what,
                pages: pages.clone(),
            }),
        };
        for t in pages {
            self.put(node, t.page, Arc::clone(&entry));
        }
    }
}
