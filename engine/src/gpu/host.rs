//! `HostGpu`: echo attention in real f32 arithmetic on the CPU.
//!
//! The reference numeric backend where no GPU exists, and the CPU reference the CUDA
//! backend is checked against. Each slot stores a key (a Hadamard row, width
//! `page_size.next_power_of_two()`) and a 32-lane value; attention is a real softmax
//! over the query's page. It records no provenance.

use super::{hadamard, key_width, locate, locate_tag, Gpu, WriteTag, VALUE_LANES};
use crate::ids::{PageId, PageTag, RoomKey, Token};

/// KV memory of one node as f32 keys and values.
#[derive(Clone, Debug)]
pub struct HostGpu {
    page_size: u32,
    pages: u32,
    key_width: usize,
    /// `(pages + 1) * page_size` slots of `key_width + VALUE_LANES` floats.
    data: Vec<f32>,
    /// Defense-4 tag per page, stored beside the page as a kernel would.
    tags: Vec<Option<WriteTag>>,
}

impl HostGpu {
    pub fn new(pages: u32, page_size: u32) -> Self {
        let key_width = key_width(page_size);
        let slots = (pages as usize + 1) * page_size as usize;
        HostGpu {
            page_size,
            pages,
            key_width,
            data: vec![0.0; slots * (key_width + VALUE_LANES)],
            tags: vec![None; pages as usize + 1],
        }
    }

    fn slot_floats(&self) -> usize {
        self.key_width + VALUE_LANES
    }

    fn slot_range(&self, page: PageId, slot: usize) -> Option<std::ops::Range<usize>> {
        if page.0 > self.pages {
            return None;
        }
        let start = (page.0 as usize * self.page_size as usize + slot) * self.slot_floats();
        Some(start..start + self.slot_floats())
    }

    fn page_range(&self, page: PageId) -> Option<std::ops::Range<usize>> {
        let first = self.slot_range(page, 0)?;
        Some(first.start..first.start + self.page_size as usize * self.slot_floats())
    }

    fn decode_value(value: &[f32]) -> Token {
        value.iter().enumerate().fold(
            0u32,
            |t, (bit, &v)| if v > 0.5 { t | (1 << bit) } else { t },
        )
    }
}

impl Gpu for HostGpu {
    /// The page's floats as bit patterns (so the payload is `Ord` and `Hash`).
    type Kv = Vec<u32>;

    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn pages(&self) -> u32 {
        self.pages
    }

    fn write_tokens(&mut self, pages: &[PageTag], start: u64, tokens: &[Token], room: RoomKey) {
        let kw = self.key_width;
        for (i, &tok) in tokens.iter().enumerate() {
            let Some((tag, slot)) = locate_tag(pages, self.page_size, start + i as u64) else {
                break;
            };
            let Some(range) = self.slot_range(tag.page, slot) else {
                continue;
            };
            self.tags[tag.page.0 as usize] = Some(WriteTag { room, gen: tag.gen });
            let s = &mut self.data[range];
            for (j, k) in s[..kw].iter_mut().enumerate() {
                *k = hadamard(slot, j);
            }
            for (bit, v) in s[kw..].iter_mut().enumerate() {
                *v = if tok & (1 << bit) != 0 { 1.0 } else { 0.0 };
            }
        }
    }

    fn read_page(&self, page: PageId) -> Vec<u32> {
        match self.page_range(page) {
            Some(r) => self.data[r].iter().map(|f| f.to_bits()).collect(),
            None => Vec::new(),
        }
    }

    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Vec<u32>) {
        if let Some(r) = self.page_range(dst.page) {
            // A payload of the wrong size (a hostile or mismatched peer) is not applied.
            if kv.len() == r.len() {
                for (d, bits) in self.data[r].iter_mut().zip(kv) {
                    *d = f32::from_bits(*bits);
                }
                self.tags[dst.page.0 as usize] = Some(WriteTag { room, gen: dst.gen });
            }
        }
    }

    fn page_tag(&self, page: PageId) -> Option<WriteTag> {
        self.tags.get(page.0 as usize).copied().flatten()
    }

    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Token {
        if query_pos >= seq_len {
            return 0;
        }
        let Some((page, qslot)) = locate(pages, self.page_size, query_pos) else {
            return 0;
        };
        let ps = u64::from(self.page_size);
        let page_start = query_pos / ps * ps;
        let valid = (seq_len - page_start).min(ps) as usize;
        let kw = self.key_width;
        let scale = 1.0 / (kw as f32).sqrt();
        let mut scores = Vec::with_capacity(valid);
        for slot in 0..valid {
            let Some(r) = self.slot_range(page, slot) else {
                return 0;
            };
            let key = &self.data[r.start..r.start + kw];
            let dot: f32 = key
                .iter()
                .enumerate()
                .map(|(j, k)| k * hadamard(qslot, j))
                .sum();
            scores.push(dot * scale);
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = weights.iter().sum();
        let (best, best_w) =
            weights.iter().enumerate().fold(
                (0, 0.0f32),
                |acc, (i, &w)| if w > acc.1 { (i, w) } else { acc },
            );
        if best_w / total <= 0.5 || scores[best] <= 0.0 {
            return 0;
        }
        let mut value = [0.0f32; VALUE_LANES];
        for (slot, w) in weights.iter().enumerate() {
            let Some(r) = self.slot_range(page, slot) else {
                return 0;
            };
            for (acc, v) in value.iter_mut().zip(&self.data[r.start + kw..r.end]) {
                *acc += w / total * v;
            }
        }
        Self::decode_value(&value)
    }

    fn token_at(&self, pages: &[PageId], pos: u64) -> Token {
        let Some((page, slot)) = locate(pages, self.page_size, pos) else {
            return 0;
        };
        let Some(r) = self.slot_range(page, slot) else {
            return 0;
        };
        Self::decode_value(&self.data[r.start + self.key_width..r.end])
    }

    fn zero_page(&mut self, page: PageId) {
        if let Some(r) = self.page_range(page) {
            self.data[r].iter_mut().for_each(|f| *f = 0.0);
            self.tags[page.0 as usize] = None;
        }
    }
}
