//! The `Gpu` seam itself: the [`Gpu`] trait every backend implements, the payload a
//! KV write carries ([`KvPayload`]), one request of a batched decode step
//! ([`AttendRequest`]) and the default byte landing ([`land_bytes_by_page`]). The
//! backends, the echo-attention arithmetic and the traced operations nodes call live
//! in sibling modules.

use crate::gpu::bytes::wire::{payload_bytes, ByteWrite, Fill, LandBytesError, Landed, WireWords};
use crate::gpu::echo::digest_tokens;
use crate::gpu::errors::{DeviceError, TagError, TagMismatch, WriteError, WriteTag};
use crate::gpu::memory::HostMemory;
use crate::ids::{PageId, PageTag, RoomKey, Token};
use std::fmt::Debug;
use std::hash::Hash;
use std::io::{self, IoSliceMut};

/// One node's KV memory and compute. Every method that touches the device returns a
/// `Result` whose error is a [`DeviceError`] (inside [`WriteError`] or [`TagError`]
/// where the method has refusals of its own): a device that fails fails the request
/// that asked, never the process.
pub trait Gpu {
    /// A page's contents as they travel in a KV write.
    type Kv: Clone + Debug + Hash + Eq + Ord + Send + Sync + KvPayload + 'static;

    fn page_size(&self) -> u32;

    /// Number of usable pages (ids `1..=pages`).
    fn pages(&self) -> u32;

    /// Write the KV of `tokens` at sequence positions `start..` into `pages`
    /// (position `p` goes to `pages[p / page_size]`, slot `p % page_size`), stamping
    /// each touched page with `WriteTag { room, gen: page.gen }`. A write that runs past
    /// the pages it addresses, or names a page outside the pool, is refused whole
    /// ([`layout::check_token_write`](crate::gpu::layout::check_token_write)): nothing of it is applied, and it is never cut
    /// short silently. Nodes call it through [`write_traced`](crate::gpu::write_traced), which states the write as
    /// an event.
    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError>;

    /// Copy a whole page out (the source side of a KV write).
    fn read_page(&self, page: PageId) -> Result<Self::Kv, DeviceError>;

    /// Overwrite a page (the destination side of a KV write) and stamp it with
    /// `WriteTag { room, gen: dst.gen }`. Contents come from `kv`; a payload shorter
    /// than a page (a torn write, [`KvPayload::tear`]) lands its leading slots only and
    /// the rest keep what they held. A page outside the pool is refused
    /// ([`layout::check_page_write`](crate::gpu::layout::check_page_write)), never silently skipped.
    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Self::Kv) -> Result<(), WriteError>;

    /// Land a write whose payload arrives as bytes (a byte transport's receive, once
    /// the landing rule admitted the write): `w.words[i]` words for `w.dst[i]`, which
    /// `fill` reads into the buffers it is given; each page lands as
    /// [`Gpu::write_page`] would land its payload, and is stamped when its bytes are
    /// in. The default reads into `w.scratch` and writes page by page
    /// ([`land_bytes_by_page`]); a backend whose memory holds the words as they
    /// travel hands `fill` the pages' own memory.
    fn land_bytes(&mut self, w: ByteWrite<'_>, fill: &mut Fill<'_>) -> Landed
    where
        Self::Kv: WireWords,
    {
        land_bytes_by_page(self, w, fill)
    }

    /// The tag stored with a page, if any write stamped one since it was last zeroed.
    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError>;

    /// Check, before reading, that every page carries the reader's own tag
    /// (`room`, the generation it was given). The in-kernel check of defense 4.
    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        for &t in pages {
            let found = self.page_tag(t.page)?;
            if found != Some(WriteTag { room, gen: t.gen }) {
                return Err(TagMismatch { expected: t, found }.into());
            }
        }
        Ok(())
    }

    /// Echo attention for one query position over a sequence of `seq_len` tokens.
    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError>;

    /// One decode step for a whole batch: for each request, when `check_tags`, the tag
    /// check over its pages (a mismatch is that request's error, and its KV is not
    /// read), then echo attention. Every request reads the memory as it was before the
    /// call; results are in batch order. The default loops over [`Gpu::check_tags`] and
    /// [`Gpu::attend`]; a device backend overrides it with one launch and one
    /// synchronisation for the batch. A device error fails the whole batch.
    fn attend_batch(
        &self,
        batch: &[AttendRequest<'_>],
        check_tags: bool,
    ) -> Result<Vec<Result<Token, TagMismatch>>, DeviceError> {
        let mut out = Vec::with_capacity(batch.len());
        for r in batch {
            if check_tags {
                match self.check_tags(r.pages, r.room) {
                    Ok(()) => {}
                    Err(TagError::Mismatch(m)) => {
                        out.push(Err(m));
                        continue;
                    }
                    Err(TagError::Device(e)) => return Err(e),
                }
            }
            out.push(Ok(self.attend(&ids(r.pages), r.seq_len, r.query_pos)?));
        }
        Ok(out)
    }

    /// Copy several pages out (the source side of a KV write), in order. The default
    /// loops over [`Gpu::read_page`]; a device backend gathers them in one copy.
    fn read_pages(&self, pages: &[PageId]) -> Result<Vec<Self::Kv>, DeviceError> {
        pages.iter().map(|&p| self.read_page(p)).collect()
    }

    /// The token stored at a sequence position (what attention would echo there).
    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError>;

    /// Zero a page (defense 7, zero-on-free).
    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError>;

    /// The host memory a KV write lands in, for a transport that registers it with a
    /// NIC-like library and lets the peer write into it with no code of this node
    /// running (NIXL, `kvsim serve --transport nixl`). `None` (the default) for a
    /// backend whose pages are not plain host memory in [`HostMemory`]'s layout.
    fn host_memory(&mut self) -> Option<HostMemory> {
        None
    }

    /// Digest of the first `tokens` positions, keyed by position (the transfer
    /// checksum of #39500).
    fn digest(&self, pages: &[PageId], tokens: u64) -> Result<u64, DeviceError> {
        let toks = (0..tokens)
            .map(|pos| self.token_at(pages, pos))
            .collect::<Result<Vec<Token>, DeviceError>>()?;
        Ok(digest_tokens(toks))
    }
}

/// What the world's data faults do to a page's payload on the wire
/// (`world::alter`): the payload of every backend implements them.
pub trait KvPayload {
    /// Change the contents so that at least one slot decodes to another token (a bit
    /// flipped on the wire or in memory, not caught by the transport). `salt` picks
    /// which.
    fn corrupt(&mut self, salt: u64);
    /// Keep only the leading half of the slots (rounded down): the DMA stopped part
    /// way, and the destination keeps its old contents in the rest.
    fn tear(&mut self);
    /// Keep only the leading `slots` slots: the byte range the writer means to place
    /// (the filled slots of a prompt's last, partial page). A one-sided write places
    /// exactly the bytes it carries, so the rest of the destination page (decode's own
    /// generated KV) is out of its reach, late or not.
    fn keep_slots(&mut self, slots: usize);
}

/// The world tests' payload-free writes.
impl KvPayload for () {
    fn corrupt(&mut self, _: u64) {}
    fn tear(&mut self) {}
    fn keep_slots(&mut self, _: usize) {}
}

/// One request of a batched decode step ([`Gpu::attend_batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttendRequest<'a> {
    /// The sequence's pages with the generations the request was given.
    pub pages: &'a [PageTag],
    /// The room use whose tag every page must carry.
    pub room: RoomKey,
    pub seq_len: u64,
    pub query_pos: u64,
}

/// The page ids of a tag list.
pub fn ids(pages: &[PageTag]) -> Vec<PageId> {
    pages.iter().map(|t| t.page).collect()
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
