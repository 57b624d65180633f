//! The tag a page's KV carries ([`WriteTag`], defense 4) and the ways a device
//! operation fails or refuses ([`DeviceError`], [`WriteRefused`], [`TagMismatch`] and the
//! errors that join them). Plain data: no backend, no trait, no tracing.

use crate::ids::{Generation, PageTag, RoomKey};
use serde::{Deserialize, Serialize};

/// The ownership tag stored with a page's KV (defense 4): which room use wrote it, for
/// which allocation of the page. Reallocation changes the generation, and only a write
/// by the owning room stamps its own tag, so a page that was never written for this
/// allocation (stale) or was reallocated carries a tag the reader does not expect.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WriteTag {
    pub room: RoomKey,
    pub gen: Generation,
}

/// A page whose stored tag is not the one the reader expects.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
#[error("page {expected} holds tag {found:?}, expected the reader's own")]
pub struct TagMismatch {
    pub expected: PageTag,
    pub found: Option<WriteTag>,
}

/// A KV write a backend refused whole instead of applying part of it.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    thiserror::Error,
)]
pub enum WriteRefused {
    /// Positions `start..end` do not fit the `slots` slots of the pages addressed.
    #[error("positions {start}..{end} run past the {slots} slots of the {pages} pages addressed")]
    PastPageList {
        start: u64,
        end: u64,
        pages: u64,
        slots: u64,
    },
    /// The page is not one of the pool's (`1..=pool`).
    #[error("page {page} is not a page of this pool of {pool} pages")]
    NotAPoolPage { page: u32, pool: u32 },
}

/// A device operation that failed (a driver call, a launch, a copy): the backend's
/// error channel. The node fails the request it was serving with
/// [`crate::msg::Why::DeviceFailed`] and releases its pages; the process goes on.
/// [`SymbolicGpu`](crate::gpu::SymbolicGpu) and [`HostGpu`](crate::gpu::HostGpu) never return it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
#[error("the device failed in {op}: {detail}")]
pub struct DeviceError {
    /// The trait method that failed.
    pub op: &'static str,
    /// The driver's words.
    pub detail: String,
}

/// Why a KV write was not applied: refused whole by the range check (nothing of it
/// landed), or the device failed part way (what it holds is unknown).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Refused(#[from] WriteRefused),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Why a tag check did not pass: a page holds another tag, or the device failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum TagError {
    #[error(transparent)]
    Mismatch(#[from] TagMismatch),
    #[error(transparent)]
    Device(#[from] DeviceError),
}
