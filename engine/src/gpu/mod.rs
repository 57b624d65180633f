//! The `Gpu` seam: one node's KV memory and the compute over it.
//!
//! Backends: [`SymbolicGpu`] (tiny and hashable, for the model checker and the
//! simulator) and [`HostGpu`] (real f32 arithmetic on the CPU). Nodes write KV through
//! [`write_traced`], which states every write as a [`TraceEvent::KvWritten`] event:
//! that is how oracles know who wrote which slot, without reading any backend. All of them
//! implement the same toy model, "echo attention", and must produce the same tokens
//! for the same inputs (a cross-backend test checks it):
//!
//! - Position `i` of a sequence lives in page `pages[i / page_size]` at slot
//!   `i % page_size`. A slot holds a key and a value.
//! - The key written at slot `o` is row `o` of a Sylvester-Hadamard matrix of width
//!   `d = page_size.next_power_of_two()`: keys within a page are orthogonal.
//! - The value encodes the token, one ±0/1 lane per bit (32 lanes).
//! - Decode step `s` of `n` queries position `q(s)`, spread evenly over the prompt,
//!   attending over the slots of the page that holds `q(s)`: softmax of `K·q/sqrt(d)`,
//!   then the weighted sum of values. When one slot takes more than half the weight and
//!   its score is positive, each value lane above 0.5 is a 1-bit of the reply token;
//!   otherwise the step emits token 0. So the reply echoes the token stored at `q(s)`,
//!   whoever wrote it: a page that still holds another tenant's KV is echoed back,
//!   exactly as an operator's canary check would see it.
//!
//! Pages are never zeroed unless the node asks (defense 7), as in SGLang.

pub mod bytes;
mod host;
pub mod layout;
mod symbolic;

pub use bytes::{ByteWrite, LandBytesError, WireWords};
pub use host::HostGpu;
pub use symbolic::{SymbolicGpu, SymbolicPage};

use crate::counters::Counters;
use crate::ids::{Generation, NodeId, PageId, PageTag, RoomKey, Token};
use crate::trace::{NodeFault, Trace, TraceEvent};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::hash::Hash;

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
/// [`SymbolicGpu`] and [`HostGpu`] never return it.
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
    /// ([`layout::check_token_write`]): nothing of it is applied, and it is never cut
    /// short silently. Nodes call it through [`write_traced`], which states the write as
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
    /// ([`layout::check_page_write`]), never silently skipped.
    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Self::Kv) -> Result<(), WriteError>;

    /// Land a write whose payload arrives as bytes (a byte transport's receive, once
    /// the landing rule admitted the write): `w.words[i]` words for `w.dst[i]`, which
    /// `fill` reads into the buffers it is given; each page lands as
    /// [`Gpu::write_page`] would land its payload, and is stamped when its bytes are
    /// in. The default reads into `w.scratch` and writes page by page
    /// ([`bytes::land_bytes_by_page`]); a backend whose memory holds the words as they
    /// travel hands `fill` the pages' own memory.
    fn land_bytes(&mut self, w: ByteWrite<'_>, fill: &mut bytes::Fill<'_>) -> bytes::Landed
    where
        Self::Kv: WireWords,
    {
        bytes::land_bytes_by_page(self, w, fill)
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

/// The transfer digest ([`Gpu::digest`]) of the tokens at positions `0, 1, ..`.
pub fn digest_tokens(tokens: impl IntoIterator<Item = Token>) -> u64 {
    let mut d = TokenDigest::default();
    tokens.into_iter().for_each(|tok| d.push(tok));
    d.finish()
}

/// The transfer digest computed run by run: the tokens pushed, in position order,
/// give exactly [`digest_tokens`] of the same sequence (its one definition), so a
/// backend can feed its memory a page's slice at a time instead of token by token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenDigest {
    h: u64,
    /// The position the next token takes.
    pos: u64,
}

impl Default for TokenDigest {
    fn default() -> Self {
        TokenDigest {
            h: 0x6b76_7369_6d00_0001,
            pos: 0,
        }
    }
}

impl TokenDigest {
    /// The token at the next position.
    #[inline]
    pub fn push(&mut self, tok: Token) {
        self.h = splitmix64(self.h ^ splitmix64((self.pos << 32) ^ u64::from(tok)));
        self.pos += 1;
    }

    /// The tokens at the next `run.len()` positions.
    pub fn push_run(&mut self, run: &[Token]) {
        run.iter().for_each(|&tok| self.push(tok));
    }

    /// `n` zero tokens (positions beyond the pages, or slots outside the memory).
    pub fn push_zeros(&mut self, n: u64) {
        (0..n).for_each(|_| self.push(0));
    }

    /// Positions pushed so far.
    pub fn len(&self) -> u64 {
        self.pos
    }

    /// Whether no position was pushed.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    pub fn finish(self) -> u64 {
        self.h
    }
}

/// The query position of decode step `step` of `steps`, spread evenly over `prompt_len`.
pub fn query_position(step: u32, steps: u32, prompt_len: u64) -> u64 {
    if prompt_len == 0 {
        return 0;
    }
    let denom = u64::from(steps.saturating_sub(1).max(1));
    u64::from(step) * (prompt_len - 1) / denom
}

/// Width of the key vectors for a page size (a power of two, so Hadamard rows exist).
pub fn key_width(page_size: u32) -> usize {
    (page_size as usize).next_power_of_two()
}

/// Entry `(row, col)` of the Sylvester-Hadamard matrix: `(-1)^popcount(row & col)`.
pub fn hadamard(row: usize, col: usize) -> f32 {
    if (row & col).count_ones().is_multiple_of(2) {
        1.0
    } else {
        -1.0
    }
}

/// Lanes of the value vector: one per token bit.
pub const VALUE_LANES: usize = 32;

/// SplitMix64 finalizer: a cheap, well-mixed hash step.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Map a position to its page and slot; `None` if it lies beyond `pages`.
fn locate(pages: &[PageId], page_size: u32, pos: u64) -> Option<(PageId, usize)> {
    let idx = usize::try_from(pos / u64::from(page_size)).ok()?;
    let page = *pages.get(idx)?;
    Some((page, (pos % u64::from(page_size)) as usize))
}

/// [`locate`] over tags.
fn locate_tag(pages: &[PageTag], page_size: u32, pos: u64) -> Option<(PageTag, usize)> {
    let idx = usize::try_from(pos / u64::from(page_size)).ok()?;
    let page = *pages.get(idx)?;
    Some((page, (pos % u64::from(page_size)) as usize))
}

/// Write the KV of `tokens` at sequence positions `start..` of `pages` for `room` and
/// state it as a [`TraceEvent::KvWritten`] naming only the pages it touched (positions
/// renumbered from the first of them). Every KV write a node makes goes through here.
/// A write the backend refuses (past the page list, outside the pool) is stated as a
/// [`NodeFault::WriteRefused`], a device failure as a [`NodeFault::DeviceFailed`], and
/// returned: the caller fails the request.
#[allow(clippy::too_many_arguments)]
pub fn write_traced<G: Gpu, E: Trace>(
    gpu: &mut G,
    env: &mut E,
    node: NodeId,
    pages: &[PageTag],
    start: u64,
    tokens: &[Token],
    room: RoomKey,
) -> Result<(), WriteError> {
    let written = gpu.write_tokens(pages, start, tokens, room);
    trace_write(
        env,
        (node, room),
        (pages, start),
        tokens,
        gpu.page_size(),
        written,
    )
}

/// State what became of a KV write of `tokens` at positions `start..` of `pages` by
/// `node` for `room` (`written`: the backend's answer, on a device of `page_size`
/// slots a page), as [`write_traced`] does; the write itself ran elsewhere (a
/// [`crate::compute::Job`] on the device).
pub fn trace_write<E: Trace>(
    env: &mut E,
    (node, room): (NodeId, RoomKey),
    (pages, start): (&[PageTag], u64),
    tokens: &[Token],
    page_size: u32,
    written: Result<(), WriteError>,
) -> Result<(), WriteError> {
    if let Err(e) = written {
        let fault = match &e {
            WriteError::Refused(r) => NodeFault::WriteRefused {
                room,
                error: r.to_string(),
            },
            WriteError::Device(d) => device_fault(Some(room), d),
        };
        env.trace(TraceEvent::Fault { node, fault });
        return Err(e);
    }
    if tokens.is_empty() {
        return Ok(());
    }
    // In range: the backend refused anything else.
    let ps = u64::from(page_size);
    let first = (start / ps) as usize;
    let last = ((start + tokens.len() as u64 - 1) / ps) as usize;
    debug_assert!(last < pages.len(), "the backend wrote inside the page list");
    env.trace(TraceEvent::KvWritten {
        node,
        room,
        pages: pages[first..=last].to_vec(),
        start: start - first as u64 * ps,
        tokens: tokens.len() as u64,
    });
    Ok(())
}

/// The fault a node states when its device failed serving `room` (`None`: the
/// operation served no one request, such as zeroing a freed page).
pub fn device_fault(room: Option<RoomKey>, e: &DeviceError) -> NodeFault {
    NodeFault::DeviceFailed {
        room,
        op: e.op.to_string(),
        error: e.detail.clone(),
    }
}

/// Zero freed `pages` (defense 7, zero-on-free) and return the ones zeroed, in order.
/// A page the device failed to zero is left out (its contents are unknown, so no
/// `PagesZeroed` may claim it) and its error handed to `failed`; the rest go on.
pub fn zero_pages<G: Gpu>(
    gpu: &mut G,
    pages: &[PageId],
    failed: &mut impl FnMut(DeviceError),
) -> Vec<PageId> {
    let mut zeroed = Vec::with_capacity(pages.len());
    for &p in pages {
        match gpu.zero_page(p) {
            Ok(()) => zeroed.push(p),
            Err(e) => failed(e),
        }
    }
    debug_assert!(zeroed.len() <= pages.len());
    zeroed
}

/// Defense 7, zero-on-free, after a release of `released`: zero those `is_free` says
/// are back on the free list, state each device failure as a fault through `counters`
/// (that page is left out: its contents are unknown), and state the pages zeroed as one
/// `PagesZeroed`.
pub fn zero_on_free<G: Gpu, E: Trace>(
    gpu: &mut G,
    env: &mut E,
    (node, counters): (NodeId, &mut Counters),
    released: &[PageTag],
    is_free: impl Fn(PageId) -> bool,
) {
    let freed: Vec<PageId> = released
        .iter()
        .map(|t| t.page)
        .filter(|&p| is_free(p))
        .collect();
    let zeroed = zero_pages(gpu, &freed, &mut |e| {
        counters.fault(env, node, device_fault(None, &e))
    });
    debug_assert!(freed.len() <= released.len());
    debug_assert!(
        zeroed.iter().all(|p| freed.contains(p)),
        "only freed pages are zeroed"
    );
    if !zeroed.is_empty() {
        env.trace(TraceEvent::PagesZeroed {
            node,
            pages: zeroed,
        });
    }
}

/// The page ids of a tag list.
pub fn ids(pages: &[PageTag]) -> Vec<PageId> {
    pages.iter().map(|t| t.page).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transfer digest binds each token to its position: the same tokens in
    /// another order, or one token moved to the next slot, digest differently. (The
    /// data faults only flip or drop contents; this is the check for reordering. The
    /// chained hash gives it even without the position term.)
    #[test]
    fn the_digest_binds_tokens_to_their_positions() {
        let d = |t: &[Token]| digest_tokens(t.iter().copied());
        assert_ne!(d(&[7, 9]), d(&[9, 7]));
        assert_ne!(d(&[7, 7, 9]), d(&[7, 9, 9]));
        assert_ne!(d(&[0, 5]), d(&[5, 0]));
        assert_eq!(d(&[7, 9]), d(&[7, 9]));
    }

    /// The symbolic backend's page-by-page digest is the token-by-token one of
    /// [`Gpu::digest`]'s definition: fewer positions than the pages hold, more (zeros
    /// beyond them), and a page outside the memory (zeros), at every page size.
    #[test]
    fn the_page_by_page_digest_is_the_token_by_token_one() {
        for page_size in [1u32, 3, 16] {
            let mut sym = SymbolicGpu::new(4, page_size);
            let tags: Vec<PageTag> = (1..=4).map(tag).collect();
            let tokens: Vec<Token> = (0..4 * page_size).map(|i| 0x0002_0000 | i).collect();
            sym.write_tokens(&tags, 0, &tokens, RoomKey::new(1, 1))
                .unwrap();
            let pages = [PageId(2), PageId(99), PageId(4), PageId(1)];
            let ps = u64::from(page_size);
            for n in [0, 1, ps, ps + 1, 3 * ps - 1, 4 * ps, 4 * ps + 5] {
                let by_token = (0..n).map(|pos| sym.token_at(&pages, pos).unwrap());
                assert_eq!(
                    sym.digest(&pages, n).unwrap(),
                    digest_tokens(by_token),
                    "page size {page_size}, {n} positions"
                );
            }
        }
    }

    const PAGE_SIZES: [u32; 7] = [1, 2, 3, 4, 8, 16, 64];
    const A: RoomKey = RoomKey::new(1, 1);
    const B: RoomKey = RoomKey::new(2, 1);

    fn tag(p: u32) -> PageTag {
        PageTag {
            page: PageId(p),
            gen: Generation(1),
        }
    }

    fn tag_of(room: RoomKey) -> Option<WriteTag> {
        Some(WriteTag {
            room,
            gen: Generation(1),
        })
    }

    /// Both backends after the same writes: room A fills pages 3-5, then room B is
    /// given pages 4-6 and writes only one token (the incident's stub), so pages 4 and
    /// 5 hold A's stale KV and page 6 was never written.
    struct TwoRooms {
        sym: SymbolicGpu,
        host: HostGpu,
        a_tags: [PageTag; 3],
        b_tags: [PageTag; 3],
        a_tokens: Vec<Token>,
    }

    fn two_rooms(page_size: u32) -> TwoRooms {
        let mut sym = SymbolicGpu::new(8, page_size);
        let mut host = HostGpu::new(8, page_size);
        let a_tags = [tag(3), tag(4), tag(5)];
        let a_tokens: Vec<Token> = (0..(3 * page_size)).map(|i| 0x0001_0000 | i).collect();
        sym.write_tokens(&a_tags, 0, &a_tokens, A).unwrap();
        host.write_tokens(&a_tags, 0, &a_tokens, A).unwrap();
        let b_tags = [tag(4), tag(5), tag(6)];
        sym.write_tokens(&b_tags, 0, &[0xBEEF], B).unwrap();
        host.write_tokens(&b_tags, 0, &[0xBEEF], B).unwrap();
        TwoRooms {
            sym,
            host,
            a_tags,
            b_tags,
            a_tokens,
        }
    }

    /// Both backends stamp the same tags: A's first page is still A's, B's first page
    /// is B's, B's second page still carries A's tag (B never wrote it).
    #[test]
    fn symbolic_and_host_agree_on_tags() {
        for page_size in PAGE_SIZES {
            let w = two_rooms(page_size);
            for gpu in [&w.sym as &dyn TagView, &w.host] {
                assert_eq!(gpu.tag_of(PageId(3)), tag_of(A));
                assert_eq!(gpu.tag_of(PageId(4)), tag_of(B));
                assert_eq!(gpu.tag_of(PageId(5)), tag_of(A));
            }
            assert!(w.sym.check_tags(&w.a_tags[..1], A).is_ok());
            let err = w.sym.check_tags(&w.b_tags, B).unwrap_err();
            assert!(
                matches!(err, TagError::Mismatch(m) if m.expected == tag(5)),
                "{err}"
            );
        }
    }

    /// Both backends give the same reply for the same writes, including pages that
    /// hold another room's stale KV and slots never written.
    #[test]
    fn symbolic_and_host_agree() {
        for page_size in PAGE_SIZES {
            let w = two_rooms(page_size);
            let (a_pages, b_pages) = (ids(&w.a_tags), ids(&w.b_tags));
            let seq = 3 * u64::from(page_size);
            for pages in [&a_pages, &b_pages] {
                for q in 0..seq {
                    assert_eq!(
                        w.sym.attend(pages, seq, q).unwrap(),
                        w.host.attend(pages, seq, q).unwrap(),
                        "page_size {page_size} q {q}"
                    );
                    assert_eq!(
                        w.sym.token_at(pages, q).unwrap(),
                        w.host.token_at(pages, q).unwrap()
                    );
                }
                assert_eq!(
                    w.sym.digest(pages, seq).unwrap(),
                    w.host.digest(pages, seq).unwrap()
                );
            }
            // The stale slots of page 4 still echo A's tokens through B's sequence.
            if page_size > 1 {
                assert_eq!(
                    w.sym.attend(&b_pages, seq, 1).unwrap(),
                    w.a_tokens[page_size as usize + 1]
                );
            }
        }
    }

    /// Copying a page moves its contents; the receiver stamps its own tag.
    #[test]
    fn symbolic_and_host_agree_on_a_page_copy() {
        for page_size in PAGE_SIZES {
            let TwoRooms {
                mut sym, mut host, ..
            } = two_rooms(page_size);
            let kv = sym.read_page(PageId(3)).unwrap();
            sym.write_page(tag(7), B, &kv).unwrap();
            let hkv = host.read_page(PageId(3)).unwrap();
            host.write_page(tag(7), B, &hkv).unwrap();
            assert_eq!(sym.page_tag(PageId(7)).unwrap(), tag_of(B));
            assert_eq!(
                sym.attend(&[PageId(7)], 1, 0).unwrap(),
                host.attend(&[PageId(7)], 1, 0).unwrap()
            );
        }
    }

    trait TagView {
        fn tag_of(&self, page: PageId) -> Option<WriteTag>;
    }
    impl<G: Gpu> TagView for G {
        fn tag_of(&self, page: PageId) -> Option<WriteTag> {
            self.page_tag(page).unwrap()
        }
    }

    /// Both backends refuse a write that runs past its page list or names a page
    /// outside the pool, whole: nothing of it lands (not even the slots that would
    /// fit), and `write_traced` states the refusal instead of a `KvWritten`.
    #[test]
    fn every_backend_refuses_a_write_past_its_pages_whole() {
        fn check<G: Gpu>(mut gpu: G) {
            let room = RoomKey::new(1, 1);
            let tag = |p: u32| PageTag {
                page: PageId(p),
                gen: Generation(1),
            };
            let pages = [tag(2), tag(3)];
            // Four slots; five tokens is one too many, at any start.
            for (start, n) in [(0u64, 5usize), (3, 2), (4, 1), (1, 4)] {
                let tokens: Vec<Token> = (0..n as u32).map(|i| 0x0002_0000 | i).collect();
                let err = gpu.write_tokens(&pages, start, &tokens, room).unwrap_err();
                assert!(
                    matches!(err, WriteError::Refused(WriteRefused::PastPageList { .. })),
                    "{err}"
                );
                assert_eq!(
                    gpu.page_tag(PageId(2)).unwrap(),
                    None,
                    "a refused write stamped a tag"
                );
                assert_eq!(gpu.token_at(&ids(&pages), start.min(3)).unwrap(), 0);
            }
            // Exactly the capacity is fine.
            gpu.write_tokens(&pages, 3, &[7], room).unwrap();
            assert_eq!(gpu.token_at(&ids(&pages), 3).unwrap(), 7);
            // A page outside the pool (or the padding page) is refused, by both paths.
            for bad in [0u32, 9] {
                let err = gpu.write_tokens(&[tag(bad)], 0, &[1], room).unwrap_err();
                assert_eq!(
                    err,
                    WriteError::Refused(WriteRefused::NotAPoolPage { page: bad, pool: 4 })
                );
                let kv = gpu.read_page(PageId(2)).unwrap();
                assert!(gpu.write_page(tag(bad), room, &kv).is_err());
            }
            let mut out: crate::env::Outbox<G::Kv> = crate::env::Outbox::new(0);
            let r = write_traced(&mut gpu, &mut out, NodeId(3), &pages, 4, &[1], room);
            assert!(r.is_err());
            let evs: Vec<&TraceEvent> = out.traces().collect();
            assert!(
                matches!(
                    evs.as_slice(),
                    [TraceEvent::Fault {
                        fault: NodeFault::WriteRefused { .. },
                        ..
                    }]
                ),
                "{evs:?}"
            );
        }
        check(SymbolicGpu::new(4, 2));
        check(HostGpu::new(4, 2));
    }

    /// A torn payload lands its leading slots only, the rest keep their contents; a
    /// corrupted one decodes to another token in one slot. Both backends alike.
    #[test]
    fn torn_and_corrupted_payloads_land_as_stated() {
        fn check<G: Gpu>(mut gpu: G) {
            let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
            let tag = |p: u32| PageTag {
                page: PageId(p),
                gen: Generation(1),
            };
            let old: Vec<Token> = (0..4).map(|i| 0x0001_0000 | i).collect();
            let new: Vec<Token> = (0..4).map(|i| 0x0002_0000 | i).collect();
            gpu.write_tokens(&[tag(1)], 0, &old, a).unwrap();
            gpu.write_tokens(&[tag(2)], 0, &new, b).unwrap();
            let mut kv = gpu.read_page(PageId(2)).unwrap();
            kv.tear();
            gpu.write_page(tag(1), b, &kv).unwrap();
            let got: Vec<Token> = (0..4)
                .map(|q| gpu.token_at(&[PageId(1)], q).unwrap())
                .collect();
            assert_eq!(got, vec![new[0], new[1], old[2], old[3]]);
            let mut kv = gpu.read_page(PageId(2)).unwrap();
            kv.corrupt(0x0000_0001_0000_0002);
            gpu.write_page(tag(3), b, &kv).unwrap();
            let got: Vec<Token> = (0..4)
                .map(|q| gpu.token_at(&[PageId(3)], q).unwrap())
                .collect();
            let differ = got.iter().zip(&new).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 1, "{got:x?}");
            assert_eq!(got[2], new[2] ^ 2);
        }
        check(SymbolicGpu::new(4, 4));
        check(HostGpu::new(4, 4));
    }

    #[test]
    fn query_positions_cover_the_prompt() {
        assert_eq!(query_position(0, 4, 100), 0);
        assert_eq!(query_position(3, 4, 100), 99);
        assert_eq!(query_position(0, 1, 100), 0);
        assert_eq!(query_position(5, 1, 1), 0);
    }
}
