//! Benchmark of the hot path of `kv::shared::SharedPool`: taking and letting go of a
//! hold on a page, on one thread and under contention from a second.
//!
//! The goal the issue sets is an uncontended hold and release under 20 ns. The
//! single-threaded `PagePool` is measured beside it as the floor (no atomics). This is
//! not a correctness test (the loom models and proptests are); it only times. Threads
//! and clock reads live here, never in the engine. Results and the machine they were
//! taken on: docs/PERFORMANCE-LOG.md (section "kv::shared").

// A benchmark measures wall time and runs threads: the purity rules of engine/clippy.toml
// bind the engine's library code, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use criterion::{criterion_group, criterion_main, Criterion};
use kvsim_engine::ids::{PageId, PageTag, RoomKey};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::PagePool;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const OWNER: RoomKey = RoomKey::new(1, 1);

/// A pool whose pages 1..=16 are all allocated and Ready, and their tags.
fn shared_pool() -> (SharedPool, Vec<PageTag>) {
    let pool = SharedPool::new(16, 16);
    let tags = pool
        .alloc(16, OWNER)
        .expect("a fresh pool has 16 free pages");
    pool.mark_ready(OWNER, &tags)
        .expect("the owner's fresh pages");
    (pool, tags)
}

fn tag_of(tags: &[PageTag], page: u32) -> PageTag {
    *tags
        .iter()
        .find(|t| t.page == PageId(page))
        .expect("page allocated above")
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("one_thread");
    let (pool, tags) = shared_pool();
    let t = tag_of(&tags, 1);

    g.bench_function("shared_hold_unhold", |b| {
        b.iter(|| {
            pool.hold(black_box(t)).expect("current tag");
            pool.unhold(black_box(t)).expect("held above")
        })
    });
    g.bench_function("shared_begin_read_drop", |b| {
        b.iter(|| drop(pool.begin_read(black_box(t)).expect("current tag")))
    });
    g.bench_function("shared_begin_write_drop", |b| {
        b.iter(|| drop(pool.begin_write(black_box(t)).expect("current tag")))
    });
    g.bench_function("shared_stale_write_refused", |b| {
        let stale = PageTag {
            gen: kvsim_engine::ids::Generation(t.gen.0 + 1),
            ..t
        };
        b.iter(|| pool.begin_write(black_box(stale)).is_err())
    });

    let mut single = PagePool::new(16, 16);
    let st = single.alloc(1, OWNER).expect("a fresh pool has free pages")[0];
    g.bench_function("page_pool_hold_unhold", |b| {
        b.iter(|| {
            single.hold(black_box(st)).expect("current tag");
            single.unhold(black_box(st)).expect("held above")
        })
    });
    g.finish();
}

/// Two threads each take and let go of `iters` holds, on pages `p` and `q`; the time
/// is the slower thread's, so the figure per iteration is one hold-and-release pair
/// while the other thread does the same.
fn contended(pool: &SharedPool, a: PageTag, b: PageTag, iters: u64) -> Duration {
    let start = Barrier::new(2);
    let run = |t: PageTag| {
        start.wait();
        let began = Instant::now();
        for _ in 0..iters {
            pool.hold(black_box(t)).expect("current tag");
            pool.unhold(black_box(t)).expect("held above");
        }
        began.elapsed()
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| run(b));
        let mine = run(a);
        mine.max(other.join().expect("bench thread panicked"))
    })
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("two_threads");
    let (pool, tags) = shared_pool();
    // Page words are 8 bytes, packed: pages 1 and 2 share a cache line, 1 and 9 do not.
    let cases = [
        ("same_page", 1, 1),
        ("adjacent_pages_one_cache_line", 1, 2),
        ("pages_on_separate_cache_lines", 1, 9),
    ];
    for (name, p, q) in cases {
        let (a, b) = (tag_of(&tags, p), tag_of(&tags, q));
        g.bench_function(name, |bench| {
            bench.iter_custom(|iters| contended(&pool, a, b, iters))
        });
    }
    g.finish();
    if let Err(v) = pool.invariants() {
        panic!("the benchmark broke the record: {v}");
    }
}

fn config() -> Criterion {
    // Short runs: the figures are stable to a few per cent within seconds, and the
    // machines are shared.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = one_thread, two_threads
}
criterion_main!(benches);
