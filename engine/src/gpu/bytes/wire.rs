//! The forms a KV write's payload takes on a byte transport: its words
//! ([`WireWords`]), the write as it arrives ([`ByteWrite`], [`Fill`]), what its landing
//! returns ([`Landed`], [`LandBytesError`]) and its size ([`payload_bytes`]). The
//! landing itself is the backends' ([`Gpu::land_bytes`](crate::gpu::Gpu::land_bytes));
//! the symbolic page's words are stated with that page.

use crate::gpu::errors::WriteError;
use crate::ids::{PageTag, RoomKey};
use std::io::{self, IoSliceMut};

/// A page payload as a sequence of 32-bit words, the form it takes on a byte wire.
pub trait WireWords: Sized {
    /// The words the payload travels as, in order.
    fn wire_words(&self) -> &[u32];
    /// The payload that travelled as `words`.
    fn from_wire_words(words: Vec<u32>) -> Self;
}

/// A host page: its floats' bit patterns, as they are.
impl WireWords for Vec<u32> {
    fn wire_words(&self) -> &[u32] {
        self
    }
    fn from_wire_words(words: Vec<u32>) -> Self {
        words
    }
}

/// The world tests' payload-free writes: nothing travels.
impl WireWords for () {
    fn wire_words(&self) -> &[u32] {
        &[]
    }
    fn from_wire_words(_: Vec<u32>) {}
}

/// A KV write whose payload arrives as bytes ([`Gpu::land_bytes`](crate::gpu::Gpu::land_bytes)): `words[i]` words
/// for `dst[i]`, of `room`; `scratch` is a buffer the caller keeps from write to write
/// (for a backend that lands page by page).
pub struct ByteWrite<'a> {
    pub dst: &'a [PageTag],
    pub room: RoomKey,
    pub words: &'a [u32],
    pub scratch: &'a mut Vec<u8>,
}

/// Fills the buffers it is given, in order and completely, with a payload's bytes (a
/// transport's receive: `read_exact` over several buffers).
pub type Fill<'f> = dyn FnMut(&mut [IoSliceMut<'_>]) -> io::Result<()> + 'f;

/// Why bytes did not land.
#[derive(Debug, thiserror::Error)]
pub enum LandBytesError {
    /// The transport did not deliver the payload (the connection broke or stalled):
    /// the pages hold part of it, and no page was stamped with the write's tag.
    #[error("payload: {0}")]
    Payload(#[from] io::Error),
    /// The backend refused or failed the write into `tag`.
    #[error("{error}")]
    Write { tag: PageTag, error: WriteError },
}

/// What [`Gpu::land_bytes`](crate::gpu::Gpu::land_bytes) returns.
pub type Landed = Result<(), LandBytesError>;

/// The number of payload bytes of pages of `words` words each.
pub fn payload_bytes(words: &[u32]) -> u64 {
    words.iter().map(|&w| u64::from(w) * 4).sum()
}
