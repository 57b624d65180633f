//! The arithmetic of echo attention that every backend shares: the transfer digest
//! ([`digest_tokens`], [`TokenDigest`]), where a decode step queries
//! ([`query_position`]), the key and value widths ([`key_width`], [`hadamard`],
//! [`VALUE_LANES`]), and where a position lives (page and slot). No memory, no device.

use crate::ids::{PageId, PageTag, Token};

/// The transfer digest ([`Gpu::digest`](crate::gpu::Gpu::digest)) of the tokens at positions `0, 1, ..`.
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
pub(super) fn locate(pages: &[PageId], page_size: u32, pos: u64) -> Option<(PageId, usize)> {
    let idx = usize::try_from(pos / u64::from(page_size)).ok()?;
    let page = *pages.get(idx)?;
    Some((page, (pos % u64::from(page_size)) as usize))
}

/// [`locate`] over tags.
pub(super) fn locate_tag(pages: &[PageTag], page_size: u32, pos: u64) -> Option<(PageTag, usize)> {
    let idx = usize::try_from(pos / u64::from(page_size)).ok()?;
    let page = *pages.get(idx)?;
    Some((page, (pos % u64::from(page_size)) as usize))
}
