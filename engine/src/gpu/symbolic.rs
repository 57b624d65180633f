//! `SymbolicGpu`: KV memory as tokens, for checkers.
//!
//! It stores each slot's token (so echo attention replies exactly as the numeric
//! backends do) and each page's defense-4 tag. It is small, `Hash` and `Eq`, so model
//! states stay few. It computes no arithmetic, and it records no provenance: who wrote
//! which slot is the oracle's to know, from the trace's write events, never from the
//! engine's memory.

use crate::gpu::bytes::wire::WireWords;
use crate::gpu::echo::{locate, TokenDigest};
use crate::gpu::errors::{DeviceError, WriteError, WriteTag};
use crate::gpu::layout;
use crate::gpu::seam::{Gpu, KvPayload};
use crate::ids::{PageId, PageTag, RoomKey, Token};

/// One page's contents: tokens per slot plus the stamped tag.
#[derive(
    Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SymbolicPage {
    pub tokens: Vec<Token>,
    /// The defense-4 tag stamped by the last write (not copied by transfers: the
    /// receiving side stamps its own).
    pub tag: Option<WriteTag>,
}

impl KvPayload for SymbolicPage {
    fn corrupt(&mut self, salt: u64) {
        if self.tokens.is_empty() {
            return;
        }
        let slot = (salt % self.tokens.len() as u64) as usize;
        // Flip a low bit: the token still names its own request (a canary check cannot
        // see it), only its position is wrong.
        self.tokens[slot] ^= 1u32 << ((salt >> 32) % 4);
    }

    fn tear(&mut self) {
        self.tokens.truncate(self.tokens.len() / 2);
    }

    fn keep_slots(&mut self, slots: usize) {
        self.tokens.truncate(slots);
    }
}

/// KV memory of one node as tokens and tags.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct SymbolicGpu {
    page_size: u32,
    /// Index 0 is the padding page.
    pages: Vec<SymbolicPage>,
}

impl SymbolicGpu {
    pub fn new(pages: u32, page_size: u32) -> Self {
        let blank = SymbolicPage {
            tokens: vec![0; page_size as usize],
            tag: None,
        };
        SymbolicGpu {
            page_size,
            pages: vec![blank; pages as usize + 1],
        }
    }

    fn page_mut(&mut self, page: PageId) -> Option<&mut SymbolicPage> {
        self.pages.get_mut(page.0 as usize)
    }
}

impl Gpu for SymbolicGpu {
    type Kv = SymbolicPage;

    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn pages(&self) -> u32 {
        (self.pages.len() - 1) as u32
    }

    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        writer: RoomKey,
    ) -> Result<(), WriteError> {
        let ps = self.page_size;
        layout::check_token_write(self.pages(), ps, pages, start, tokens.len())?;
        // Page run by page run: the check above put every position inside `pages` and
        // every page it touches inside the pool.
        let ps = u64::from(ps);
        let (mut pos, mut rest) = (start, tokens);
        while !rest.is_empty() {
            let Some(&tag) = usize::try_from(pos / ps).ok().and_then(|i| pages.get(i)) else {
                break;
            };
            let slot = (pos % ps) as usize;
            let n = rest.len().min(ps as usize - slot);
            let (run, later) = rest.split_at(n);
            if let Some(p) = self.page_mut(tag.page) {
                p.tokens[slot..slot + n].copy_from_slice(run);
                p.tag = Some(WriteTag {
                    room: writer,
                    gen: tag.gen,
                });
            }
            (pos, rest) = (pos + n as u64, later);
        }
        Ok(())
    }

    fn read_page(&self, page: PageId) -> Result<SymbolicPage, DeviceError> {
        Ok(self
            .pages
            .get(page.0 as usize)
            .cloned()
            .unwrap_or_else(|| SymbolicPage {
                tokens: vec![0; self.page_size as usize],
                tag: None,
            }))
    }

    fn write_page(
        &mut self,
        dst: PageTag,
        room: RoomKey,
        kv: &SymbolicPage,
    ) -> Result<(), WriteError> {
        layout::check_page_write(self.pages(), dst.page.0)?;
        if let Some(p) = self.page_mut(dst.page) {
            // A short (torn) payload lands its leading slots; the rest keep theirs.
            for (slot, tok) in p.tokens.iter_mut().zip(&kv.tokens) {
                *slot = *tok;
            }
            p.tag = Some(WriteTag { room, gen: dst.gen });
        }
        Ok(())
    }

    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        Ok(self.pages.get(page.0 as usize).and_then(|p| p.tag))
    }

    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        if query_pos >= seq_len {
            return Ok(0);
        }
        self.token_at(pages, query_pos)
    }

    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        Ok(locate(pages, self.page_size, pos)
            .and_then(|(page, slot)| self.pages.get(page.0 as usize).map(|p| p.tokens[slot]))
            .unwrap_or(0))
    }

    /// [`Gpu::digest`]'s value, read page by page: the tokens at positions
    /// `0..tokens` in order, 0 where a position lies beyond `pages` or a page outside
    /// the memory (as [`Gpu::token_at`] reads them).
    fn digest(&self, pages: &[PageId], tokens: u64) -> Result<u64, DeviceError> {
        let ps = u64::from(self.page_size);
        let mut d = TokenDigest::default();
        for p in pages {
            let want = (tokens - d.len()).min(ps);
            if want == 0 {
                break;
            }
            match self.pages.get(p.0 as usize) {
                // `want` is at most the page size, which every page's slots are.
                Some(page) => d.push_run(&page.tokens[..want as usize]),
                None => d.push_zeros(want),
            }
        }
        d.push_zeros(tokens - d.len());
        Ok(d.finish())
    }

    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        if let Some(p) = self.page_mut(page) {
            p.tokens.iter_mut().for_each(|t| *t = 0);
            p.tag = None;
        }
        Ok(())
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
