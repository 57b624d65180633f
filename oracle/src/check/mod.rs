//! The oracle's checkers: each owns one part of the oracle's model of a run, keeps
//! its own invariants (debug assertions after every change) and judges the
//! invariants whose evidence that part holds. [`crate::oracle_state::OracleState`] holds one
//! of each and is the dispatch: it hands every record to the checkers that judge it,
//! in a fixed order, so findings come out in the order of the one definition of each
//! invariant.
//!
//! - [`rooms`]: the room uses the router routed and has not cleared (request, tenant,
//!   true size, nodes, flags, each half's first answer): the registry every checker
//!   reads to name and size a room use. It judges nothing.
//! - [`pages`]: the node books ([`book`]: per node, every page's lifecycle,
//!   generation, owner, holders and provenance, and the node's open halves and
//!   quarantines): S1, S2 (writes into lost pages, frees under a hold, stray landings
//!   judged by their effect), S3, S8.
//! - [`writes`]: the KV writes in flight and where they point: S2 (a source page freed
//!   under a write still reading it) and S9.
//! - [`transfer`]: transfer completions accepted or refused: S4, S7 (no state of its
//!   own; it reads the room registry).
//! - [`answers`]: requests submitted and not answered, the answered ids: S5 and L5 (a
//!   request past its limit getting something), S6, S10 and the canary.
//! - [`leases`]: vLLM pull's leases on finished rooms' pages: S2 for a READ served
//!   after its lease expired, L2 for a lease outliving its room.
//! - [`liveness`]: the end of a run: L1-L4 over every checker's state.
//!
//! Nothing here has timestamps, and every state is `Clone + Hash + Eq`: the model
//! checker keeps the oracle in its states.

pub mod answers;
pub mod book;
pub mod leases;
pub mod liveness;
pub mod pages;
pub mod rooms;
pub mod transfer;
pub mod writes;

use kvsim_engine::ids::{NodeId, PageId, RoomKey};
use kvsim_engine::invariant::Invariant;

/// What a finding says, before the caller stamps time and evidence on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    pub invariant: Invariant,
    /// `Some(defense)`: the defense stopped the hazard (a detection, nothing leaked);
    /// `None`: the invariant was violated.
    pub detected_by: Option<&'static str>,
    pub room: Option<RoomKey>,
    pub related: Vec<RoomKey>,
    pub pages: Vec<(NodeId, PageId)>,
    pub detail: String,
}

/// Findings of one step.
pub type Drafts = Vec<Draft>;

/// A violation of `inv` about `room`, with no related rooms or pages.
pub(crate) fn draft(inv: Invariant, room: Option<RoomKey>, detail: String) -> Draft {
    Draft {
        invariant: inv,
        detected_by: None,
        room,
        related: Vec::new(),
        pages: Vec::new(),
        detail,
    }
}

impl Draft {
    /// The finding names page `page` of `node` too.
    pub(crate) fn on_page(mut self, node: NodeId, page: PageId) -> Draft {
        self.pages.push((node, page));
        self
    }

    /// The finding names these pages too.
    pub(crate) fn on_pages(mut self, pages: impl IntoIterator<Item = (NodeId, PageId)>) -> Draft {
        self.pages.extend(pages);
        self
    }

    /// The finding names these other rooms too.
    pub(crate) fn with_related(mut self, rooms: impl IntoIterator<Item = RoomKey>) -> Draft {
        self.related.extend(rooms);
        self
    }

    /// `Some(defense)`: the defense stopped the hazard (a detection, nothing leaked).
    pub(crate) fn detected(mut self, by: Option<&'static str>) -> Draft {
        self.detected_by = by;
        self
    }
}
