//! A KV write's payload as a byte transport carries it, and its landing from those
//! bytes.
//!
//! On a byte transport (the runtime's TCP) a page's payload travels as its words, each
//! 4 bytes little-endian ([`WireWords`]). The receiver lands it with
//! [`super::Gpu::land_bytes`], after the landing rule admitted the write
//! (`kv::landing::land_with`): the backend hands the transport the memory the bytes
//! go to, and the transport fills it. [`land_bytes_by_page`] is the general way (the
//! bytes into one buffer the caller keeps, then [`super::Gpu::write_page`] per page);
//! a backend whose memory holds the words as they travel ([`super::HostGpu`]) gives
//! the transport the destination pages' own memory instead, so the bytes are copied
//! once, from the socket into the pages.

use super::{Gpu, SymbolicPage, WriteError};
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

/// A symbolic page: its tokens (the tag is not copied by a transfer: the receiver
/// stamps its own).
impl WireWords for SymbolicPage {
    fn wire_words(&self) -> &[u32] {
        &self.tokens
    }
    fn from_wire_words(words: Vec<u32>) -> Self {
        SymbolicPage {
            tokens: words,
            tag: None,
        }
    }
}

/// The world tests' payload-free writes: nothing travels.
impl WireWords for () {
    fn wire_words(&self) -> &[u32] {
        &[]
    }
    fn from_wire_words(_: Vec<u32>) {}
}

/// A KV write whose payload arrives as bytes ([`Gpu::land_bytes`]): `words[i]` words
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

/// What [`Gpu::land_bytes`] returns.
pub type Landed = Result<(), LandBytesError>;

/// The number of payload bytes of pages of `words` words each.
pub fn payload_bytes(words: &[u32]) -> u64 {
    words.iter().map(|&w| u64::from(w) * 4).sum()
}

/// Land `w` as [`Gpu::write_page`] does, each page from the bytes `fill` read into
/// `w.scratch`. Any backend can land this way.
pub fn land_bytes_by_page<G: Gpu + ?Sized>(
    gpu: &mut G,
    w: ByteWrite<'_>,
    fill: &mut Fill<'_>,
) -> Landed
where
    G::Kv: WireWords,
{
    let ByteWrite {
        dst,
        room,
        words,
        scratch,
    } = w;
    assert_eq!(dst.len(), words.len(), "one payload per destination page");
    let total = usize::try_from(payload_bytes(words)).map_err(io::Error::other)?;
    scratch.clear();
    scratch.resize(total, 0);
    fill(&mut [IoSliceMut::new(scratch)])?;
    let mut at = 0;
    for (&tag, &n) in dst.iter().zip(words) {
        let bytes = &scratch[at..at + n as usize * 4];
        at += bytes.len();
        let page = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        gpu.write_page(tag, room, &G::Kv::from_wire_words(page))
            .map_err(|error| LandBytesError::Write { tag, error })?;
    }
    Ok(())
}
