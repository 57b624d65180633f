//! The one kernel logic: KV memory layout, tag and flag encodings, the tag check and
//! the echo-attention arithmetic, written once for the CPU.
//!
//! [`HostGpu`](crate::gpu::HostGpu) runs these functions; the CUDA kernels in
//! `cuda/kernels/kv.cu` mirror them line for line, with the same constants as
//! `#define`s (a test in `gpu-tests` parses the `.cu` file and compares them). This
//! module is not a backend and holds no state. Its invariant: every float operation
//! here is a plain IEEE-754 single-precision `+ - * /`, `floor` or comparison, in a
//! fixed order, with no fused multiply-add and no library `exp` (whose last bit
//! differs between libm and CUDA), so the CPU and a GPU compiled with `--fmad=false`
//! compute bit-identical scores, weights and tokens.
//!
//! Layout: the pool is `(pages + 1) * page_size` slots (page 0 is padding), slot `s` of
//! page `p` starts at float [`page_slot_offset`]`(p, s, ..)` and holds a key of
//! `key_width` floats then [`VALUE_LANES`] value floats. Each page has
//! [`TAG_WORDS`] `u64` tag words: `[TAG_PRESENT | room, room generation, page
//! generation]`, all zero when no write stamped a tag since the page was last zeroed.

use crate::gpu::echo::{hadamard, VALUE_LANES};
use crate::gpu::errors::{TagMismatch, WriteRefused, WriteTag};
use crate::ids::{Generation, PageTag, RoomId, RoomKey, Token};

/// `u64` words of one page's stored tag.
pub const TAG_WORDS: usize = 3;
/// Bit of tag word 0 that says a tag is stored (room ids are `u32`, so it never
/// collides with one).
pub const TAG_PRESENT: u64 = 1 << 32;
/// Per-request flag: every page carried the reader's tag (or the check was off).
pub const FLAG_OK: u32 = 0;
/// The "no mismatch found yet" value the kernel's `atomicMin` starts from.
pub const NO_MISMATCH: u32 = u32::MAX;
/// Threads per block of the attention and tag-check kernels.
pub const ATTEND_THREADS: u32 = 128;
/// Below this argument [`echo_exp`] returns 0 (its result would be subnormal).
pub const EXP_MIN: f32 = -87.0;
/// `log2(e)`, for the range reduction of [`echo_exp`].
pub const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
/// High part of `ln 2`, exactly `355/512 = 0.693359375` (9 significant bits, so
/// `k * EXP_LN2_HI` is exact).
pub const EXP_LN2_HI: f32 = 0.693_359_4;
/// Low part of `ln 2`: `ln 2 - EXP_LN2_HI`.
pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients `1/n!` of `e^r` for `n = 2..=6`.
pub const EXP_C2: f32 = 0.5;
pub const EXP_C3: f32 = 0.166_666_67;
pub const EXP_C4: f32 = 0.041_666_668;
pub const EXP_C5: f32 = 0.008_333_334;
pub const EXP_C6: f32 = 0.001_388_888_9;

/// Floats of one slot: the key then the value lanes.
pub const fn slot_floats(key_width: usize) -> usize {
    key_width + VALUE_LANES
}

/// Floats of one page.
pub const fn page_floats(page_size: u32, key_width: usize) -> usize {
    page_size as usize * slot_floats(key_width)
}

/// Float offset of slot `slot` of page `page` in the pool.
pub const fn page_slot_offset(page: u32, slot: u32, page_size: u32, key_width: usize) -> usize {
    (page as usize * page_size as usize + slot as usize) * slot_floats(key_width)
}

/// The softmax scale `1/sqrt(key_width)` (computed once on the host, passed to kernels).
pub fn score_scale(key_width: usize) -> f32 {
    1.0 / (key_width as f32).sqrt()
}

/// May a write of `tokens` tokens at positions `start..` of the page table `pages`
/// go ahead? Every position must fall inside the table and every page it touches
/// inside the pool (`1..=pool_pages`; page 0 is padding and never addressed). A
/// backend checks this before it applies anything, so a write is refused whole,
/// never cut short; the kernel launcher makes the same check before its launch.
pub fn check_token_write(
    pool_pages: u32,
    page_size: u32,
    pages: &[PageTag],
    start: u64,
    tokens: usize,
) -> Result<(), WriteRefused> {
    if tokens == 0 {
        return Ok(());
    }
    let ps = u64::from(page_size.max(1));
    let slots = (pages.len() as u64).saturating_mul(ps);
    let end = start.saturating_add(tokens as u64);
    if end > slots {
        return Err(WriteRefused::PastPageList {
            start,
            end,
            pages: pages.len() as u64,
            slots,
        });
    }
    let (first, last) = ((start / ps) as usize, ((end - 1) / ps) as usize);
    for t in &pages[first..=last] {
        if t.page.0 == 0 || t.page.0 > pool_pages {
            return Err(WriteRefused::NotAPoolPage {
                page: t.page.0,
                pool: pool_pages,
            });
        }
    }
    Ok(())
}

/// May a whole-page write land at `page`? The page must be one of the pool's.
pub fn check_page_write(pool_pages: u32, page: u32) -> Result<(), WriteRefused> {
    if page == 0 || page > pool_pages {
        return Err(WriteRefused::NotAPoolPage {
            page,
            pool: pool_pages,
        });
    }
    Ok(())
}

/// Whether a page payload of `len` words lands (`Gpu::write_page`): whole slots only,
/// at most a page. A short payload (a torn write, or the filled slots of a prompt's last
/// page, `KvPayload::keep_slots`) lands its leading slots and the rest of the page keeps
/// what it held; a payload of any other shape (a hostile or mismatched peer) is not
/// applied. Every backend decides by this one rule.
pub fn payload_lands(len: usize, page_size: u32, key_width: usize) -> bool {
    len <= page_floats(page_size, key_width) && len.is_multiple_of(slot_floats(key_width))
}

/// The stored words of a tag (`None`: all zero).
pub fn encode_tag(tag: Option<WriteTag>) -> [u64; TAG_WORDS] {
    match tag {
        Some(t) => [
            TAG_PRESENT | u64::from(t.room.room.0),
            t.room.gen.0,
            t.gen.0,
        ],
        None => [0; TAG_WORDS],
    }
}

/// The tag stored words describe (`None` without [`TAG_PRESENT`]).
pub fn decode_tag(words: [u64; TAG_WORDS]) -> Option<WriteTag> {
    if words[0] & TAG_PRESENT == 0 {
        return None;
    }
    Some(WriteTag {
        room: RoomKey {
            room: RoomId(words[0] as u32),
            gen: Generation(words[1]),
        },
        gen: Generation(words[2]),
    })
}

/// Does page `page`'s stored tag equal the one the reader expects? A page beyond the
/// pool never matches. The kernel's `kv_tag_matches`.
pub fn tag_matches(tags: &[u64], pool_pages: u32, page: u32, page_gen: u64, room: RoomKey) -> bool {
    if page > pool_pages {
        return false;
    }
    let t = page as usize * TAG_WORDS;
    tags[t] == (TAG_PRESENT | u64::from(room.room.0))
        && tags[t + 1] == room.gen.0
        && tags[t + 2] == page_gen
}

/// The per-request flag of the tag check over a page table: [`FLAG_OK`], or `1 +` the
/// index of the first entry whose page does not carry `room`'s tag. The kernel finds
/// the same first index with `atomicMin` over all entries in parallel.
pub fn validate_tags(tags: &[u64], pool_pages: u32, table: &[PageTag], room: RoomKey) -> u32 {
    let mut first = NO_MISMATCH;
    for (i, t) in table.iter().enumerate() {
        if !tag_matches(tags, pool_pages, t.page.0, t.gen.0, room) {
            first = first.min(i as u32);
        }
    }
    if first == NO_MISMATCH {
        FLAG_OK
    } else {
        first + 1
    }
}

/// The mismatch a non-OK flag names (`found` read from the stored words).
pub fn flag_to_result(
    flag: u32,
    table: &[PageTag],
    found: impl Fn(PageTag) -> Option<WriteTag>,
) -> Result<(), TagMismatch> {
    if flag == FLAG_OK {
        return Ok(());
    }
    match table.get(flag as usize - 1) {
        Some(&expected) => Err(TagMismatch {
            expected,
            found: found(expected),
        }),
        // A flag beyond the table cannot come from `validate_tags`; report the first.
        None => match table.first() {
            Some(&expected) => Err(TagMismatch {
                expected,
                found: found(expected),
            }),
            None => Ok(()),
        },
    }
}

/// `e^x` for `x <= 0` from `+ - * floor` only: `x = k ln2 + r`, a degree-6 Taylor
/// polynomial for `e^r`, times `2^k` built from its exponent bits. Relative error
/// about `1e-7`; bit-identical on every IEEE machine without FMA contraction.
pub fn echo_exp(x: f32) -> f32 {
    if x < EXP_MIN {
        return 0.0;
    }
    let k = (x * EXP_LOG2E + 0.5).floor();
    let r = (x - k * EXP_LN2_HI) - k * EXP_LN2_LO;
    let p =
        1.0 + r * (1.0 + r * (EXP_C2 + r * (EXP_C3 + r * (EXP_C4 + r * (EXP_C5 + r * EXP_C6)))));
    // x <= 0 and x >= EXP_MIN give k in -126..=0: a normal power of two.
    let scale = f32::from_bits(((k as i32 + 127) as u32) << 23);
    p * scale
}

/// Token of a value vector: lane `b` above 0.5 is bit `b`.
pub fn decode_value(value: &[f32]) -> Token {
    value.iter().enumerate().fold(
        0u32,
        |t, (bit, &v)| if v > 0.5 { t | (1 << bit) } else { t },
    )
}

/// Echo attention over one page: `page` holds the page's floats (at least `valid`
/// slots), the query sits at slot `qslot`. The kernel `kv_attend` computes the same
/// steps: scores (one per slot, a sequential dot product), their maximum, weights
/// `echo_exp(score - max)`, their sequential sum, the first strictly largest weight,
/// the acceptance test, then per lane the sequential weighted sum of values.
pub fn attend_page(
    page: &[f32],
    valid: usize,
    qslot: usize,
    key_width: usize,
    scale: f32,
) -> Token {
    let sf = slot_floats(key_width);
    let mut scores = Vec::with_capacity(valid);
    for slot in 0..valid {
        let key = &page[slot * sf..slot * sf + key_width];
        let mut dot = 0.0f32;
        for (j, k) in key.iter().enumerate() {
            dot += k * hadamard(qslot, j);
        }
        scores.push(dot * scale);
    }
    let mut max = f32::NEG_INFINITY;
    for &s in &scores {
        max = max.max(s);
    }
    let weights: Vec<f32> = scores.iter().map(|s| echo_exp(s - max)).collect();
    let mut total = 0.0f32;
    let mut best = 0usize;
    let mut best_w = 0.0f32;
    for (i, &w) in weights.iter().enumerate() {
        total += w;
        if w > best_w {
            best = i;
            best_w = w;
        }
    }
    if valid == 0 || best_w / total <= 0.5 || scores[best] <= 0.0 {
        return 0;
    }
    let mut value = [0.0f32; VALUE_LANES];
    for (slot, w) in weights.iter().enumerate() {
        let v = &page[slot * sf + key_width..(slot + 1) * sf];
        for (acc, x) in value.iter_mut().zip(v) {
            *acc += w / total * x;
        }
    }
    decode_value(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PageId;

    /// Whole slots up to a page land (a short payload too: the CUDA backend once
    /// dropped every payload shorter than a page, and the incident's 1-token
    /// placeholder page with it); any other shape does not.
    #[test]
    fn a_payload_lands_in_whole_slots_up_to_a_page() {
        let (ps, kw) = (4, 8);
        let sf = slot_floats(kw);
        let page = page_floats(ps, kw);
        for slots in 0..=ps as usize {
            assert!(payload_lands(slots * sf, ps, kw), "{slots} whole slots");
        }
        assert!(!payload_lands(page + sf, ps, kw), "more than a page");
        assert!(!payload_lands(sf + 1, ps, kw), "a slot and a word");
        assert!(!payload_lands(page - 1, ps, kw), "a page less a word");
    }

    #[test]
    fn echo_exp_is_close_to_exp() {
        let mut x = 0.0f32;
        while x > -90.0 {
            let want = x.exp();
            let got = echo_exp(x);
            if x < EXP_MIN {
                assert_eq!(got, 0.0);
            } else {
                assert!((got - want).abs() <= want * 4e-7, "x {x}: {got} vs {want}");
            }
            x -= 0.0137;
        }
        assert_eq!(echo_exp(0.0), 1.0);
    }

    #[test]
    fn tags_round_trip_and_validate() {
        let room = RoomKey::new(7, 3);
        let tag = WriteTag {
            room,
            gen: Generation(9),
        };
        assert_eq!(decode_tag(encode_tag(Some(tag))), Some(tag));
        assert_eq!(decode_tag(encode_tag(None)), None);
        let mut tags = vec![0u64; 4 * TAG_WORDS];
        tags[2 * TAG_WORDS..3 * TAG_WORDS].copy_from_slice(&encode_tag(Some(tag)));
        let t = |p, g| PageTag {
            page: PageId(p),
            gen: Generation(g),
        };
        assert_eq!(validate_tags(&tags, 3, &[t(2, 9)], room), FLAG_OK);
        assert_eq!(validate_tags(&tags, 3, &[t(2, 9), t(2, 8)], room), 2);
        assert_eq!(validate_tags(&tags, 3, &[t(9, 9)], room), 1);
        assert_eq!(validate_tags(&tags, 3, &[t(2, 9)], RoomKey::new(7, 4)), 1);
    }
}
