//! Benchmark of the read-time page-tag check (defense 4) on the host backend: one
//! decode step for a batch of requests through `Gpu::attend_batch`, with the check and
//! without it, and the check alone per page.
//!
//! Why a kernel-level figure: end to end over loopback (`kvsim bench-client`, tags on
//! and off) the check's cost is far below the run-to-run noise of a shared machine, so
//! the end-to-end A/B cannot show whether it is under 1%. Here the two variants run
//! the same batch on the same memory, so the difference is the check. The echo
//! attention of the model reads one page per request and query, while the check reads
//! the tag of every page of the request: the ratio below is therefore an upper bound on
//! what the check costs next to real attention, which reads every page. Results and
//! the machine: docs/PERFORMANCE-LOG.md (section "The read-time tag check").

// A benchmark measures wall time: the purity rules of engine/clippy.toml bind the
// engine's library code, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvsim_engine::gpu::{AttendRequest, Gpu, HostGpu};
use kvsim_engine::ids::{PageId, PageTag, RoomKey};
use kvsim_engine::Generation;
use std::hint::black_box;

const PAGE_SIZE: u32 = 16;

/// A host pool holding `requests` sequences of `pages_each` full pages, each written by
/// its own room at generation 1, and the page tables the requests carry.
fn pool(requests: u32, pages_each: u32) -> (HostGpu, Vec<(RoomKey, Vec<PageTag>)>) {
    let mut gpu = HostGpu::new(requests * pages_each, PAGE_SIZE);
    let mut tables = Vec::new();
    for r in 0..requests {
        let room = RoomKey::new(r, 1);
        let tags: Vec<PageTag> = (0..pages_each)
            .map(|i| PageTag {
                page: PageId(r * pages_each + i + 1),
                gen: Generation(1),
            })
            .collect();
        let len = u64::from(pages_each * PAGE_SIZE);
        let tokens: Vec<u32> = (0..len as u32)
            .map(|t| t.wrapping_mul(2_654_435_761))
            .collect();
        gpu.write_tokens(&tags, 0, &tokens, room)
            .expect("every page of the table is a pool page");
        tables.push((room, tags));
    }
    (gpu, tables)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode step, host backend");
    for &(requests, pages_each) in &[(8u32, 8u32), (64, 32), (64, 256)] {
        let (gpu, tables) = pool(requests, pages_each);
        let seq_len = u64::from(pages_each * PAGE_SIZE);
        let batch: Vec<AttendRequest<'_>> = tables
            .iter()
            .map(|(room, tags)| AttendRequest {
                pages: tags,
                room: *room,
                seq_len,
                query_pos: seq_len - 1,
            })
            .collect();
        // Every request's tags match: the check passes and attention runs in both.
        assert!(gpu
            .attend_batch(&batch, true)
            .unwrap()
            .iter()
            .all(|r| r.is_ok()));
        let label = format!("{requests}x{pages_each}p");
        g.bench_with_input(BenchmarkId::new("tags on", &label), &batch, |b, batch| {
            b.iter(|| black_box(gpu.attend_batch(black_box(batch), true)))
        });
        g.bench_with_input(BenchmarkId::new("tags off", &label), &batch, |b, batch| {
            b.iter(|| black_box(gpu.attend_batch(black_box(batch), false)))
        });
        g.bench_with_input(
            BenchmarkId::new("check only", &label),
            &batch,
            |b, batch| {
                b.iter(|| {
                    for r in batch.iter() {
                        let _ = black_box(gpu.check_tags(black_box(r.pages), r.room));
                    }
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
