//! Random KV workloads run on two `Gpu` backends side by side, compared after every
//! operation.
//!
//! One seed draws a pool, a page size and a sequence of operations shaped like the
//! engine's: allocations that reuse pages under new generations (so earlier holders'
//! tags go stale), prefill writes that cover only part of their pages (stale slots),
//! decode-step writes, batched attention with and without the tag check (over live
//! and stale page tables, out-of-range pages, repeated pages, queries past the end),
//! page transfers, zeroing, tag reads, token reads and digests. This module is a test
//! driver, not a model of the engine's rules (it allocates with no pool discipline on
//! purpose). Invariant: a run is a pure function of its [`Workload`], so a divergence
//! names a seed that reproduces it on any backend pair.

use kvsim_engine::gpu::{ids, AttendRequest, Gpu};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, Token};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub seed: u64,
    pub pool_pages: u32,
    pub page_size: u32,
    /// Operations to run (each a write, a batch, a transfer, ...).
    pub ops: u32,
}

impl Workload {
    /// A workload drawn from a seed: pool of 4..=40 pages, page size from
    /// 1, 2, 3, 4, 8, 16, 64.
    pub fn from_seed(seed: u64, ops: u32) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b76_7369_6d67_7075);
        const SIZES: [u32; 7] = [1, 2, 3, 4, 8, 16, 64];
        Workload {
            seed,
            pool_pages: rng.random_range(4..=40),
            page_size: SIZES[rng.random_range(0..SIZES.len())],
            ops,
        }
    }
}

/// The first difference between the two backends.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("seed {seed}, op {op}: {what}")]
pub struct Divergence {
    pub seed: u64,
    pub op: u32,
    pub what: String,
}

/// What a run exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub writes: u64,
    /// Attention requests compared (batched and single).
    pub attends: u64,
    /// Requests whose tag check failed (identically on both sides).
    pub tag_mismatches: u64,
    /// Requests that echoed a nonzero token.
    pub echoed: u64,
    pub transfers: u64,
    pub zeroed: u64,
    pub digests: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.writes += o.writes;
        self.attends += o.attends;
        self.tag_mismatches += o.tag_mismatches;
        self.echoed += o.echoed;
        self.transfers += o.transfers;
        self.zeroed += o.zeroed;
        self.digests += o.digests;
    }
}

#[derive(Clone, Debug)]
struct Held {
    room: RoomKey,
    pages: Vec<PageTag>,
    seq_len: u64,
}

/// Run `w` on `a` and `b` (both fresh, of `w.pool_pages` pages of `w.page_size`),
/// comparing every answer; `same_kv` compares transferred page payloads.
pub fn compare<A: Gpu, B: Gpu>(
    a: &mut A,
    b: &mut B,
    w: &Workload,
    same_kv: impl Fn(&A::Kv, &B::Kv) -> bool,
) -> Result<Stats, Divergence> {
    let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
    let p = w.pool_pages;
    let ps = u64::from(w.page_size);
    let mut gens = vec![0u64; p as usize + 2];
    let mut held: Vec<Held> = Vec::new();
    let mut room_gen = 0u64;
    let mut st = Stats::default();
    for op in 0..w.ops {
        let fail = |what: String| Divergence {
            seed: w.seed,
            op,
            what,
        };
        let kind = rng.random_range(0..100u32);
        if kind < 25 || held.is_empty() {
            // Allocate 1..=4 pages under new generations and prefill some of them.
            let k = rng.random_range(1..=4usize);
            let mut pages = Vec::with_capacity(k);
            for _ in 0..k {
                let page = match rng.random_range(0..100u32) {
                    0..=2 => p + 1, // beyond the pool
                    3..=6 if !pages.is_empty() => {
                        let t: &PageTag = &pages[rng.random_range(0..pages.len())];
                        t.page.0
                    }
                    _ => rng.random_range(1..=p),
                };
                gens[page as usize] += 1;
                pages.push(PageTag {
                    page: PageId(page),
                    gen: Generation(gens[page as usize]),
                });
            }
            room_gen += 1;
            let room = RoomKey::new(rng.random_range(1..=6), room_gen);
            let cap = k as u64 * ps;
            let n = rng.random_range(0..=cap + 1);
            let start = if rng.random_range(0..8u32) == 0 {
                rng.random_range(0..=cap)
            } else {
                0
            };
            let tokens: Vec<Token> = (0..n).map(|_| token(&mut rng)).collect();
            // Both refuse a write past the table (or outside the pool) whole, alike.
            let ra = a.write_tokens(&pages, start, &tokens, room);
            let rb = b.write_tokens(&pages, start, &tokens, room);
            if ra != rb {
                return Err(fail(format!(
                    "write_tokens at {start} of {n} over {pages:?}: {ra:?} vs {rb:?}"
                )));
            }
            st.writes += 1;
            held.push(Held {
                room,
                pages,
                seq_len: (start + n).min(cap),
            });
            if held.len() > 24 {
                held.remove(0);
            }
        } else if kind < 35 {
            // A decode step's write: one token at the end of a held sequence.
            let i = rng.random_range(0..held.len());
            let h = &mut held[i];
            let tok = token(&mut rng);
            let ra = a.write_tokens(&h.pages, h.seq_len, &[tok], h.room);
            let rb = b.write_tokens(&h.pages, h.seq_len, &[tok], h.room);
            if ra != rb {
                return Err(fail(format!(
                    "decode-step write at {} over {:?}: {ra:?} vs {rb:?}",
                    h.seq_len, h.pages
                )));
            }
            if ra.is_ok() {
                h.seq_len += 1;
            }
            st.writes += 1;
        } else if kind < 65 {
            // A batch of attention requests over held (possibly stale) page tables.
            let n = rng.random_range(1..=8usize);
            let picks: Vec<(usize, u64, u64, RoomKey)> = (0..n)
                .map(|_| {
                    let i = rng.random_range(0..held.len());
                    let h = &held[i];
                    let seq = if rng.random_range(0..6u32) == 0 {
                        rng.random_range(0..=h.pages.len() as u64 * ps)
                    } else {
                        h.seq_len
                    };
                    let q = rng.random_range(0..=seq + 1);
                    let room = if rng.random_range(0..10u32) == 0 {
                        RoomKey::new(h.room.room.0, h.room.gen.0 + 1)
                    } else {
                        h.room
                    };
                    (i, seq, q, room)
                })
                .collect();
            let batch: Vec<AttendRequest<'_>> = picks
                .iter()
                .map(|&(i, seq, q, room)| {
                    let h = &held[i];
                    let pages_len = (seq.div_ceil(ps) as usize).min(h.pages.len());
                    AttendRequest {
                        pages: &h.pages[..pages_len],
                        room,
                        seq_len: seq,
                        query_pos: q,
                    }
                })
                .collect();
            let check = rng.random_range(0..3u32) != 0;
            let ra = a
                .attend_batch(&batch, check)
                .map_err(|e| fail(e.to_string()))?;
            let rb = b
                .attend_batch(&batch, check)
                .map_err(|e| fail(e.to_string()))?;
            if ra != rb {
                return Err(fail(format!(
                    "attend_batch (check {check}) on {batch:?}: {ra:?} vs {rb:?}"
                )));
            }
            st.attends += batch.len() as u64;
            st.tag_mismatches += ra.iter().filter(|r| r.is_err()).count() as u64;
            st.echoed += ra.iter().filter(|r| matches!(r, Ok(t) if *t != 0)).count() as u64;
            let r0 = &batch[0];
            let (sa, sb) = (
                a.attend(&ids(r0.pages), r0.seq_len, r0.query_pos)
                    .map_err(|e| fail(e.to_string()))?,
                b.attend(&ids(r0.pages), r0.seq_len, r0.query_pos)
                    .map_err(|e| fail(e.to_string()))?,
            );
            if sa != sb {
                return Err(fail(format!("attend on {r0:?}: {sa} vs {sb}")));
            }
            st.attends += 1;
        } else if kind < 77 {
            // A transfer: copy a page out and into a freshly allocated page.
            let srcs: Vec<PageId> = (0..rng.random_range(1..=3usize))
                .map(|_| PageId(rng.random_range(0..=p)))
                .collect();
            let ka = a.read_pages(&srcs).map_err(|e| fail(e.to_string()))?;
            let kb = b.read_pages(&srcs).map_err(|e| fail(e.to_string()))?;
            if ka.len() != kb.len() || ka.iter().zip(&kb).any(|(x, y)| !same_kv(x, y)) {
                return Err(fail(format!("read_pages {srcs:?} differ")));
            }
            let one_a = a.read_page(srcs[0]).map_err(|e| fail(e.to_string()))?;
            if !same_kv(&one_a, &kb[0]) {
                return Err(fail(format!("read_page {} differs", srcs[0])));
            }
            let dst = rng.random_range(0..=p + 1);
            gens[dst as usize] += 1;
            let dst = PageTag {
                page: PageId(dst),
                gen: Generation(gens[dst as usize]),
            };
            room_gen += 1;
            let room = RoomKey::new(rng.random_range(1..=6), room_gen);
            let (ra, rb) = (
                a.write_page(dst, room, &ka[0]),
                b.write_page(dst, room, &kb[0]),
            );
            if ra != rb {
                return Err(fail(format!("write_page to {dst}: {ra:?} vs {rb:?}")));
            }
            held.push(Held {
                room,
                pages: vec![dst],
                seq_len: ps,
            });
            st.transfers += 1;
        } else if kind < 82 {
            let page = PageId(rng.random_range(0..=p + 1));
            a.zero_page(page).map_err(|e| fail(e.to_string()))?;
            b.zero_page(page).map_err(|e| fail(e.to_string()))?;
            st.zeroed += 1;
        } else if kind < 90 {
            let h = &held[rng.random_range(0..held.len())];
            let room = if rng.random_range(0..4u32) == 0 {
                RoomKey::new(rng.random_range(1..=6), rng.random_range(0..=room_gen))
            } else {
                h.room
            };
            let (ca, cb) = (a.check_tags(&h.pages, room), b.check_tags(&h.pages, room));
            if ca != cb {
                return Err(fail(format!(
                    "check_tags {:?} {room:?}: {ca:?} vs {cb:?}",
                    h.pages
                )));
            }
        } else if kind < 96 {
            let h = &held[rng.random_range(0..held.len())];
            let pages = ids(&h.pages);
            let n = rng.random_range(0..=h.pages.len() as u64 * ps + 1);
            let (da, db) = (
                a.digest(&pages, n).map_err(|e| fail(e.to_string()))?,
                b.digest(&pages, n).map_err(|e| fail(e.to_string()))?,
            );
            if da != db {
                return Err(fail(format!("digest {pages:?} {n}: {da:#x} vs {db:#x}")));
            }
            let pos = rng.random_range(0..=n);
            let (ta, tb) = (
                a.token_at(&pages, pos).map_err(|e| fail(e.to_string()))?,
                b.token_at(&pages, pos).map_err(|e| fail(e.to_string()))?,
            );
            if ta != tb {
                return Err(fail(format!("token_at {pages:?} {pos}: {ta} vs {tb}")));
            }
            st.digests += 1;
        } else {
            let page = PageId(rng.random_range(0..=p + 1));
            let (ta, tb) = (a.page_tag(page), b.page_tag(page));
            if ta != tb {
                return Err(fail(format!("page_tag {page}: {ta:?} vs {tb:?}")));
            }
        }
    }
    Ok(st)
}

/// A token: mostly canary-shaped (`owner << 16 | index`), sometimes any 32 bits.
fn token(rng: &mut impl Rng) -> Token {
    if rng.random_range(0..4u32) == 0 {
        rng.random()
    } else {
        (rng.random_range(1..64u32) << 16) | rng.random_range(0..0x1_0000u32)
    }
}
