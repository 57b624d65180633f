//! `HostGpu`: echo attention in real f32 arithmetic on the CPU.
//!
//! The reference numeric backend where no GPU exists, and the CPU reference the CUDA
//! backend is checked against. Each slot stores a key (a Hadamard row, width
//! `page_size.next_power_of_two()`) and a 32-lane value; attention is a real softmax
//! over the query's page. It records no provenance. Memory layout, tag words, the tag
//! check and the attention arithmetic are [`layout`]'s, the functions the CUDA kernels
//! mirror line for line, so a GPU computes the same bits.

use crate::gpu::bytes::wire::{ByteWrite, Fill, Landed};
use crate::gpu::echo::{hadamard, key_width, locate, locate_tag, VALUE_LANES};
use crate::gpu::errors::{DeviceError, TagError, WriteError, WriteTag};
use crate::gpu::layout::{self, TAG_WORDS};
use crate::gpu::memory::{HostMemory, Region};
use crate::gpu::seam::{land_bytes_by_page, Gpu, KvPayload};
use crate::ids::{PageId, PageTag, RoomKey, Token};
use std::io::IoSliceMut;

/// A host page travels as its floats' bit patterns, slot by slot (key then value
/// lanes). Corruption flips one value lane of one slot between 0.0 and 1.0 (one bit
/// of that slot's token); tearing keeps the leading half of the slots. The slot
/// width is not known here, so both treat the payload as `slots` equal parts, found
/// from the value lanes: a slot is `key_width + VALUE_LANES` floats with `key_width`
/// a power of two, so the payload length fixes it.
impl KvPayload for Vec<u32> {
    fn corrupt(&mut self, salt: u64) {
        let Some((slots, sf)) = host_slots(self.len()) else {
            return;
        };
        let slot = (salt % slots as u64) as usize;
        let lane = ((salt >> 32) % 4) as usize;
        let i = slot * sf + (sf - VALUE_LANES) + lane;
        let v = f32::from_bits(self[i]);
        self[i] = if v > 0.5 { 0.0f32 } else { 1.0f32 }.to_bits();
    }

    fn tear(&mut self) {
        if let Some((slots, sf)) = host_slots(self.len()) {
            self.truncate(slots / 2 * sf);
        }
    }

    fn keep_slots(&mut self, slots: usize) {
        if let Some((all, sf)) = host_slots(self.len()) {
            self.truncate(slots.min(all) * sf);
        }
    }
}

/// `(slots, floats per slot)` of a host page payload of `len` floats: the largest
/// power-of-two key width whose slot size divides `len` (page size 1 upwards).
fn host_slots(len: usize) -> Option<(usize, usize)> {
    (0..16)
        .rev()
        .map(|k| (1usize << k) + VALUE_LANES)
        .filter(|sf| len >= *sf && len.is_multiple_of(*sf))
        .map(|sf| (len / sf, sf))
        .find(|(slots, sf)| key_width(*slots as u32) == sf - VALUE_LANES)
}

/// KV memory of one node as f32 keys and values.
#[derive(Clone, Debug)]
pub struct HostGpu {
    page_size: u32,
    pages: u32,
    key_width: usize,
    /// `(pages + 1) * page_size` slots of `key_width + VALUE_LANES` floats.
    data: Vec<f32>,
    /// Defense-4 tag per page as [`layout::TAG_WORDS`] words, as a kernel stores it.
    tags: Vec<u64>,
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
            tags: vec![0; (pages as usize + 1) * TAG_WORDS],
        }
    }

    fn slot_floats(&self) -> usize {
        layout::slot_floats(self.key_width)
    }

    fn slot_range(&self, page: PageId, slot: usize) -> Option<std::ops::Range<usize>> {
        if page.0 > self.pages {
            return None;
        }
        let start = layout::page_slot_offset(page.0, slot as u32, self.page_size, self.key_width);
        Some(start..start + self.slot_floats())
    }

    fn page_range(&self, page: PageId) -> Option<std::ops::Range<usize>> {
        let first = self.slot_range(page, 0)?;
        Some(first.start..first.start + layout::page_floats(self.page_size, self.key_width))
    }

    /// The tag words of `page`, decoded (`None` outside the pool).
    fn stored_tag(&self, page: PageId) -> Option<WriteTag> {
        if page.0 > self.pages {
            return None;
        }
        let t = page.0 as usize * TAG_WORDS;
        let mut words = [0u64; TAG_WORDS];
        words.copy_from_slice(&self.tags[t..t + TAG_WORDS]);
        layout::decode_tag(words)
    }

    fn set_tag(&mut self, page: PageId, tag: Option<WriteTag>) {
        let t = page.0 as usize * TAG_WORDS;
        self.tags[t..t + TAG_WORDS].copy_from_slice(&layout::encode_tag(tag));
    }

    /// The stored tag words of every page (index `page * TAG_WORDS`), as a kernel sees them.
    pub fn tag_words(&self) -> &[u64] {
        &self.tags
    }

    /// The memory each payload of `words[i]` words lands in, as bytes, in `dst` order:
    /// the leading floats of each destination page. `None` where the payload does not
    /// land in place: a page outside the pool or named twice, a payload
    /// [`Gpu::write_page`] would not apply (longer than a page, not whole slots), or a
    /// big-endian host (the wire's words are little-endian).
    fn landing_memory(&mut self, dst: &[PageTag], words: &[u32]) -> Option<Vec<IoSliceMut<'_>>> {
        let (sf, page_floats) = (
            self.slot_floats(),
            layout::page_floats(self.page_size, self.key_width),
        );
        let fits = |t: &PageTag, w: u32| {
            let w = w as usize;
            layout::check_page_write(self.pages, t.page.0).is_ok()
                && w <= page_floats
                && w.is_multiple_of(sf)
        };
        if cfg!(target_endian = "big") || !dst.iter().zip(words).all(|(t, &w)| fits(t, w)) {
            return None;
        }
        let mut order: Vec<usize> = (0..dst.len()).collect();
        order.sort_unstable_by_key(|&i| dst[i].page);
        if order.windows(2).any(|p| dst[p[0]].page == dst[p[1]].page) {
            return None;
        }
        let starts: Vec<usize> = order
            .iter()
            .map(|&i| self.page_range(dst[i].page).map(|r| r.start))
            .collect::<Option<_>>()?;
        let mut parts: Vec<&mut [u8]> = Vec::with_capacity(dst.len());
        parts.resize_with(dst.len(), Default::default);
        let (mut rest, mut at) = (&mut self.data[..], 0);
        for (&i, start) in order.iter().zip(starts) {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (page, after) = tail.split_at_mut(words[i] as usize);
            parts[i] = bytemuck::cast_slice_mut(page);
            (rest, at) = (after, start + words[i] as usize);
        }
        Some(parts.into_iter().map(IoSliceMut::new).collect())
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

    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError> {
        layout::check_token_write(self.pages, self.page_size, pages, start, tokens.len())?;
        let kw = self.key_width;
        for (i, &tok) in tokens.iter().enumerate() {
            let Some((tag, slot)) = locate_tag(pages, self.page_size, start + i as u64) else {
                break;
            };
            let Some(range) = self.slot_range(tag.page, slot) else {
                continue;
            };
            self.set_tag(tag.page, Some(WriteTag { room, gen: tag.gen }));
            let s = &mut self.data[range];
            for (j, k) in s[..kw].iter_mut().enumerate() {
                *k = hadamard(slot, j);
            }
            for (bit, v) in s[kw..].iter_mut().enumerate() {
                *v = if tok & (1 << bit) != 0 { 1.0 } else { 0.0 };
            }
        }
        Ok(())
    }

    fn read_page(&self, page: PageId) -> Result<Vec<u32>, DeviceError> {
        Ok(match self.page_range(page) {
            Some(r) => self.data[r].iter().map(|f| f.to_bits()).collect(),
            None => Vec::new(),
        })
    }

    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Vec<u32>) -> Result<(), WriteError> {
        layout::check_page_write(self.pages, dst.page.0)?;
        if let Some(r) = self.page_range(dst.page) {
            if layout::payload_lands(kv.len(), self.page_size, self.key_width) {
                for (d, bits) in self.data[r].iter_mut().zip(kv) {
                    *d = f32::from_bits(*bits);
                }
                self.set_tag(dst.page, Some(WriteTag { room, gen: dst.gen }));
            }
        }
        Ok(())
    }

    /// The payload's bytes go straight into the destination pages' memory (a page
    /// stores the bit patterns that travel), in one `fill` over every page: one copy,
    /// from the transport into the pages. A payload that does not land in place
    /// ([`HostGpu::landing_memory`]) lands page by page, as any backend's does.
    fn land_bytes(&mut self, w: ByteWrite<'_>, fill: &mut Fill<'_>) -> Landed {
        assert_eq!(
            w.dst.len(),
            w.words.len(),
            "one payload per destination page"
        );
        let Some(mut memory) = self.landing_memory(w.dst, w.words) else {
            return land_bytes_by_page(self, w, fill);
        };
        fill(&mut memory)?;
        drop(memory);
        for t in w.dst {
            self.set_tag(
                t.page,
                Some(WriteTag {
                    room: w.room,
                    gen: t.gen,
                }),
            );
        }
        Ok(())
    }

    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        Ok(self.stored_tag(page))
    }

    /// The two buffers, made once in [`HostGpu::new`] and never resized: their
    /// addresses hold for the backend's life. A transport that registers them lets a
    /// peer write into them as a NIC does, outside this backend's `&mut` (the hazard
    /// one-sided transports have, which the page tags and verification exist for).
    /// Such a write races this backend's slices over the same bytes: a data race under
    /// Rust's memory model, not made sound here (docs/DECISIONS.md, "Two transports":
    /// the progress thread's writes).
    fn host_memory(&mut self) -> Option<HostMemory> {
        let region = |ptr: *mut u8, len: usize| Region {
            addr: ptr as u64,
            len: len as u64,
        };
        Some(HostMemory {
            data: region(self.data.as_mut_ptr().cast(), self.data.len() * 4),
            tags: region(self.tags.as_mut_ptr().cast(), self.tags.len() * 8),
            pages: self.pages,
            page_size: self.page_size,
            key_width: self.key_width,
        })
    }

    /// The kernel's check: [`layout::validate_tags`] over the stored words.
    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        let flag = layout::validate_tags(&self.tags, self.pages, pages, room);
        Ok(layout::flag_to_result(flag, pages, |t| {
            self.stored_tag(t.page)
        })?)
    }

    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        if query_pos >= seq_len {
            return Ok(0);
        }
        let Some((page, qslot)) = locate(pages, self.page_size, query_pos) else {
            return Ok(0);
        };
        let ps = u64::from(self.page_size);
        let page_start = query_pos / ps * ps;
        let valid = (seq_len - page_start).min(ps) as usize;
        let Some(r) = self.page_range(page) else {
            return Ok(0);
        };
        Ok(layout::attend_page(
            &self.data[r],
            valid,
            qslot,
            self.key_width,
            layout::score_scale(self.key_width),
        ))
    }

    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        let Some((page, slot)) = locate(pages, self.page_size, pos) else {
            return Ok(0);
        };
        let Some(r) = self.slot_range(page, slot) else {
            return Ok(0);
        };
        Ok(layout::decode_value(
            &self.data[r.start + self.key_width..r.end],
        ))
    }

    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        if let Some(r) = self.page_range(page) {
            self.data[r].iter_mut().for_each(|f| *f = 0.0);
            self.set_tag(page, None);
        }
        Ok(())
    }
}
