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

use kvsim_engine::gpu::{ids, AttendRequest, DeviceError, Gpu, KvPayload};
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
    /// Transfers may carry a corrupted payload (`KvPayload::corrupt`): only between
    /// backends of one payload type (its bits flipped alike on both sides); a
    /// symbolic page's corruption is not a numeric page's.
    pub corrupt: bool,
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
            corrupt: false,
        }
    }

    /// The same workload with corrupted payloads among its transfers.
    pub fn with_corruption(self) -> Self {
        Workload {
            corrupt: true,
            ..self
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
    /// Transfers whose payload was cut short or corrupted on the way
    /// (`KvPayload::keep_slots`, `tear`, `corrupt`), identically on both sides.
    pub shaped: u64,
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
        self.shaped += o.shaped;
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
    let mut r = Run {
        a,
        b,
        same_kv,
        w: *w,
        rng: ChaCha8Rng::seed_from_u64(w.seed),
        p: w.pool_pages,
        ps: u64::from(w.page_size),
        gens: vec![0u64; w.pool_pages as usize + 2],
        held: Vec::new(),
        room_gen: 0,
        st: Stats::default(),
        op: 0,
    };
    for op in 0..w.ops {
        r.op = op;
        let kind = r.rng.random_range(0..100u32);
        if kind < 25 || r.held.is_empty() {
            r.allocate_and_prefill()?;
        } else if kind < 35 {
            r.decode_step()?;
        } else if kind < 65 {
            r.attend()?;
        } else if kind < 77 {
            r.transfer()?;
        } else if kind < 82 {
            r.zero()?;
        } else if kind < 90 {
            r.check_tags()?;
        } else if kind < 96 {
            r.digest()?;
        } else {
            r.page_tag()?;
        }
    }
    Ok(r.st)
}

/// One comparison run in progress: both backends, the draws, and what the workload
/// holds (page generations, held sequences).
struct Run<'g, A: Gpu, B: Gpu, F> {
    a: &'g mut A,
    b: &'g mut B,
    same_kv: F,
    w: Workload,
    rng: ChaCha8Rng,
    /// Pool pages and page size.
    p: u32,
    ps: u64,
    /// The latest generation handed out per page id (`0..=p + 1`).
    gens: Vec<u64>,
    held: Vec<Held>,
    room_gen: u64,
    st: Stats,
    /// The operation being run.
    op: u32,
}

impl<A: Gpu, B: Gpu, F: Fn(&A::Kv, &B::Kv) -> bool> Run<'_, A, B, F> {
    /// A device error of either backend is a divergence at this operation.
    fn on_device<T>(&self, r: Result<T, DeviceError>) -> Result<T, Divergence> {
        r.map_err(|e| self.fail(e.to_string()))
    }

    fn fail(&self, what: String) -> Divergence {
        Divergence {
            seed: self.w.seed,
            op: self.op,
            what,
        }
    }

    /// A fresh page tag for `page`, under its next generation.
    fn next_tag(&mut self, page: u32) -> PageTag {
        self.gens[page as usize] += 1;
        PageTag {
            page: PageId(page),
            gen: Generation(self.gens[page as usize]),
        }
    }

    /// Allocate 1..=4 pages under new generations and prefill some of them.
    fn allocate_and_prefill(&mut self) -> Result<(), Divergence> {
        let (p, ps) = (self.p, self.ps);
        let k = self.rng.random_range(1..=4usize);
        let mut pages: Vec<PageTag> = Vec::with_capacity(k);
        for _ in 0..k {
            let page = match self.rng.random_range(0..100u32) {
                0..=2 => p + 1, // beyond the pool
                3..=6 if !pages.is_empty() => pages[self.rng.random_range(0..pages.len())].page.0,
                _ => self.rng.random_range(1..=p),
            };
            let tag = self.next_tag(page);
            pages.push(tag);
        }
        self.room_gen += 1;
        let room = RoomKey::new(self.rng.random_range(1..=6), self.room_gen);
        let cap = k as u64 * ps;
        let n = self.rng.random_range(0..=cap + 1);
        let start = if self.rng.random_range(0..8u32) == 0 {
            self.rng.random_range(0..=cap)
        } else {
            0
        };
        let tokens: Vec<Token> = (0..n).map(|_| token(&mut self.rng)).collect();
        // Both refuse a write past the table (or outside the pool) whole, alike.
        let ra = self.a.write_tokens(&pages, start, &tokens, room);
        let rb = self.b.write_tokens(&pages, start, &tokens, room);
        if ra != rb {
            return Err(self.fail(format!(
                "write_tokens at {start} of {n} over {pages:?}: {ra:?} vs {rb:?}"
            )));
        }
        self.st.writes += 1;
        self.held.push(Held {
            room,
            pages,
            seq_len: (start + n).min(cap),
        });
        if self.held.len() > 24 {
            self.held.remove(0);
        }
        Ok(())
    }

    /// A decode step's write: one token at the end of a held sequence.
    fn decode_step(&mut self) -> Result<(), Divergence> {
        let i = self.rng.random_range(0..self.held.len());
        let tok = token(&mut self.rng);
        let h = &mut self.held[i];
        let ra = self.a.write_tokens(&h.pages, h.seq_len, &[tok], h.room);
        let rb = self.b.write_tokens(&h.pages, h.seq_len, &[tok], h.room);
        if ra != rb {
            let what = format!(
                "decode-step write at {} over {:?}: {ra:?} vs {rb:?}",
                h.seq_len, h.pages
            );
            return Err(self.fail(what));
        }
        if ra.is_ok() {
            h.seq_len += 1;
        }
        self.st.writes += 1;
        Ok(())
    }

    /// The requests of an attention batch over held (possibly stale) page tables:
    /// (held index, sequence length, query position, reader's room).
    fn draw_batch(&mut self) -> Vec<(usize, u64, u64, RoomKey)> {
        let n = self.rng.random_range(1..=8usize);
        (0..n)
            .map(|_| {
                let i = self.rng.random_range(0..self.held.len());
                let h = &self.held[i];
                let seq = if self.rng.random_range(0..6u32) == 0 {
                    self.rng.random_range(0..=h.pages.len() as u64 * self.ps)
                } else {
                    h.seq_len
                };
                let q = self.rng.random_range(0..=seq + 1);
                let room = if self.rng.random_range(0..10u32) == 0 {
                    RoomKey::new(h.room.room.0, h.room.gen.0 + 1)
                } else {
                    h.room
                };
                (i, seq, q, room)
            })
            .collect()
    }

    /// A batch of attention requests, with or without the tag check, then the first
    /// request alone.
    fn attend(&mut self) -> Result<(), Divergence> {
        let picks = self.draw_batch();
        let ps = self.ps;
        let batch: Vec<AttendRequest<'_>> = picks
            .iter()
            .map(|&(i, seq, q, room)| {
                let h = &self.held[i];
                let pages_len = (seq.div_ceil(ps) as usize).min(h.pages.len());
                AttendRequest {
                    pages: &h.pages[..pages_len],
                    room,
                    seq_len: seq,
                    query_pos: q,
                }
            })
            .collect();
        let check = self.rng.random_range(0..3u32) != 0;
        let ra = self.on_device(self.a.attend_batch(&batch, check))?;
        let rb = self.on_device(self.b.attend_batch(&batch, check))?;
        if ra != rb {
            return Err(self.fail(format!(
                "attend_batch (check {check}) on {batch:?}: {ra:?} vs {rb:?}"
            )));
        }
        self.st.attends += batch.len() as u64;
        self.st.tag_mismatches += ra.iter().filter(|r| r.is_err()).count() as u64;
        self.st.echoed += ra.iter().filter(|r| matches!(r, Ok(t) if *t != 0)).count() as u64;
        let r0 = &batch[0];
        let (sa, sb) = (
            self.on_device(self.a.attend(&ids(r0.pages), r0.seq_len, r0.query_pos))?,
            self.on_device(self.b.attend(&ids(r0.pages), r0.seq_len, r0.query_pos))?,
        );
        if sa != sb {
            return Err(self.fail(format!("attend on {r0:?}: {sa} vs {sb}")));
        }
        self.st.attends += 1;
        Ok(())
    }

    /// A transfer: copy a page out and into a freshly allocated page.
    fn transfer(&mut self) -> Result<(), Divergence> {
        let p = self.p;
        let srcs: Vec<PageId> = (0..self.rng.random_range(1..=3usize))
            .map(|_| PageId(self.rng.random_range(0..=p)))
            .collect();
        let ka = self.on_device(self.a.read_pages(&srcs))?;
        let kb = self.on_device(self.b.read_pages(&srcs))?;
        if ka.len() != kb.len() || ka.iter().zip(&kb).any(|(x, y)| !(self.same_kv)(x, y)) {
            return Err(self.fail(format!("read_pages {srcs:?} differ")));
        }
        let one_a = self.on_device(self.a.read_page(srcs[0]))?;
        if !(self.same_kv)(&one_a, &kb[0]) {
            return Err(self.fail(format!("read_page {} differs", srcs[0])));
        }
        let dst = self.rng.random_range(0..=p + 1);
        let dst = self.next_tag(dst);
        self.room_gen += 1;
        let room = RoomKey::new(self.rng.random_range(1..=6), self.room_gen);
        let (mut pa, mut pb) = (ka[0].clone(), kb[0].clone());
        self.shape(&mut pa, &mut pb);
        let (ra, rb) = (
            self.a.write_page(dst, room, &pa),
            self.b.write_page(dst, room, &pb),
        );
        if ra != rb {
            return Err(self.fail(format!("write_page to {dst}: {ra:?} vs {rb:?}")));
        }
        self.held.push(Held {
            room,
            pages: vec![dst],
            seq_len: self.ps,
        });
        self.st.transfers += 1;
        Ok(())
    }

    /// Transfers carry a payload the way the world can deliver it: a third only its
    /// leading slots (a prompt's last, partial page; any count, 0 to a page and one),
    /// a sixth torn, and a sixth corrupted where the workload allows it; the same on
    /// both sides.
    fn shape(&mut self, a: &mut A::Kv, b: &mut B::Kv) {
        match self.rng.random_range(0..6u32) {
            0 | 1 => {
                let slots = self.rng.random_range(0..=self.ps as usize + 1);
                a.keep_slots(slots);
                b.keep_slots(slots);
            }
            2 => {
                a.tear();
                b.tear();
            }
            3 if self.w.corrupt => {
                let salt = self.rng.random();
                a.corrupt(salt);
                b.corrupt(salt);
            }
            _ => return,
        }
        self.st.shaped += 1;
    }

    /// Zero a drawn page (inside the pool or just past it) on both backends.
    fn zero(&mut self) -> Result<(), Divergence> {
        let page = PageId(self.rng.random_range(0..=self.p + 1));
        let za = self.a.zero_page(page);
        self.on_device(za)?;
        let zb = self.b.zero_page(page);
        self.on_device(zb)?;
        self.st.zeroed += 1;
        Ok(())
    }

    /// The tag check of a held table, by its own room or a drawn one.
    fn check_tags(&mut self) -> Result<(), Divergence> {
        let i = self.rng.random_range(0..self.held.len());
        let room = if self.rng.random_range(0..4u32) == 0 {
            RoomKey::new(
                self.rng.random_range(1..=6),
                self.rng.random_range(0..=self.room_gen),
            )
        } else {
            self.held[i].room
        };
        let h = &self.held[i];
        let (ca, cb) = (
            self.a.check_tags(&h.pages, room),
            self.b.check_tags(&h.pages, room),
        );
        if ca != cb {
            let what = format!("check_tags {:?} {room:?}: {ca:?} vs {cb:?}", h.pages);
            return Err(self.fail(what));
        }
        Ok(())
    }

    /// A digest of a held sequence's first tokens, and one token of it.
    fn digest(&mut self) -> Result<(), Divergence> {
        let i = self.rng.random_range(0..self.held.len());
        let pages = ids(&self.held[i].pages);
        let n = self
            .rng
            .random_range(0..=self.held[i].pages.len() as u64 * self.ps + 1);
        let (da, db) = (
            self.on_device(self.a.digest(&pages, n))?,
            self.on_device(self.b.digest(&pages, n))?,
        );
        if da != db {
            return Err(self.fail(format!("digest {pages:?} {n}: {da:#x} vs {db:#x}")));
        }
        let pos = self.rng.random_range(0..=n);
        let (ta, tb) = (
            self.on_device(self.a.token_at(&pages, pos))?,
            self.on_device(self.b.token_at(&pages, pos))?,
        );
        if ta != tb {
            return Err(self.fail(format!("token_at {pages:?} {pos}: {ta} vs {tb}")));
        }
        self.st.digests += 1;
        Ok(())
    }

    fn page_tag(&mut self) -> Result<(), Divergence> {
        let page = PageId(self.rng.random_range(0..=self.p + 1));
        let (ta, tb) = (self.a.page_tag(page), self.b.page_tag(page));
        if ta != tb {
            return Err(self.fail(format!("page_tag {page}: {ta:?} vs {tb:?}")));
        }
        Ok(())
    }
}

/// A token: mostly canary-shaped (`owner << 16 | index`), sometimes any 32 bits.
fn token(rng: &mut impl Rng) -> Token {
    if rng.random_range(0..4u32) == 0 {
        rng.random()
    } else {
        (rng.random_range(1..64u32) << 16) | rng.random_range(0..0x1_0000u32)
    }
}
