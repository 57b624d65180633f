//! The pages checker: per node, every page's lifecycle state, generation, owner,
//! holders and provenance (who wrote its slots), plus the node's open halves, its
//! quarantines and whether it stopped itself; the node books of the oracle.
//!
//! It judges the page rules: a page handed to a second room use or moved against the
//! lifecycle table (S1), a free by a non-owner or a second free (S8), a write into a
//! page its room lost, a send of a page its room does not own, a free under another
//! path's hold, a stray landing judged by its effect (S2), a read of slots the room
//! never wrote (S3). Invariant: page 0 is padding and never changes; a node's pool
//! keeps its size across restarts; the open halves and quarantines are sorted sets.

mod landing;
mod lifecycle;
mod nodes;
mod release;

pub use crate::check::book::{NodeBook, PageFact, Provenance};
pub use nodes::{BookEdit, Pages};
pub use release::Release;
