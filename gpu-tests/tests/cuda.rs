//! The CUDA tests: `CudaGpu` against `HostGpu` on a device. Each starts with the probe
//! and, without a driver or device, prints `SKIPPED: no CUDA driver/device (<reason>)`
//! and returns, so `cargo test` passes on CPU-only machines with every test reported
//! as skipped. On the lent GPU machine `run-on-device.sh` runs this binary (built here)
//! with `KVSIM_GPU_SEEDS` raising the random comparison's size. Nothing here times
//! anything.

use kvsim_cuda::cuda::CudaDevice;
use kvsim_cuda::probe::{cuda_device, Probe};
use kvsim_engine::gpu::{ids, AttendRequest, Gpu, HostGpu, WriteTag};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, Token};
use kvsim_gpu_tests::compare::{compare, Workload};

/// The device, or `None` with the skip printed and recorded (expected on a machine
/// with no CUDA driver or device: the CPU CI machine).
fn device(test: &str) -> Option<CudaDevice> {
    if let Probe::Absent(reason) = cuda_device() {
        kvsim_testenv::skip_expected(test, &format!("no CUDA driver/device ({reason})"));
        return None;
    }
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) => panic!("the probe found a device but it does not open: {e}"),
    }
}

fn tag(page: u32, gen: u64) -> PageTag {
    PageTag {
        page: PageId(page),
        gen: Generation(gen),
    }
}

/// The engine's own cross-backend scenario: a room's pages reused by another room
/// that writes one token, so stale slots and stale tags are read.
#[test]
fn cuda_equals_host_on_stale_pages() {
    let Some(dev) = device("cuda_equals_host_on_stale_pages") else {
        return;
    };
    for page_size in [1u32, 2, 3, 4, 8, 16, 64] {
        let mut cuda = dev.gpu(8, page_size).unwrap_or_else(|e| panic!("{e}"));
        let mut host = HostGpu::new(8, page_size);
        let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
        let a_tags = [tag(3, 1), tag(4, 1), tag(5, 1)];
        let a_tokens: Vec<Token> = (0..3 * page_size).map(|i| 0x0001_0000 | i).collect();
        cuda.write_tokens(&a_tags, 0, &a_tokens, a).unwrap();
        host.write_tokens(&a_tags, 0, &a_tokens, a).unwrap();
        let b_tags = [tag(4, 2), tag(5, 2), tag(6, 1)];
        cuda.write_tokens(&b_tags, 0, &[0xBEEF], b).unwrap();
        host.write_tokens(&b_tags, 0, &[0xBEEF], b).unwrap();
        let seq = 3 * u64::from(page_size);
        for p in 0..=9 {
            assert_eq!(
                cuda.page_tag(PageId(p)).unwrap(),
                host.page_tag(PageId(p)).unwrap(),
                "tag of page {p}"
            );
            assert_eq!(
                cuda.read_page(PageId(p)).unwrap(),
                host.read_page(PageId(p)).unwrap(),
                "page {p}"
            );
        }
        for pages in [&a_tags, &b_tags] {
            let pids = ids(pages);
            for q in 0..=seq {
                assert_eq!(
                    cuda.attend(&pids, seq, q).unwrap(),
                    host.attend(&pids, seq, q).unwrap(),
                    "ps {page_size} q {q}"
                );
                assert_eq!(
                    cuda.token_at(&pids, q).unwrap(),
                    host.token_at(&pids, q).unwrap()
                );
            }
            assert_eq!(
                cuda.digest(&pids, seq).unwrap(),
                host.digest(&pids, seq).unwrap()
            );
            for room in [a, b] {
                assert_eq!(cuda.check_tags(pages, room), host.check_tags(pages, room));
            }
        }
        // The stale slot of page 4 echoes a's token through b's sequence.
        if page_size > 1 {
            assert_eq!(
                cuda.attend(&ids(&b_tags), seq, 1).unwrap(),
                a_tokens[page_size as usize + 1]
            );
        }
        // b's check fails at its second page (still a's tag), without reading it.
        let batch = [AttendRequest {
            pages: &b_tags,
            room: b,
            seq_len: seq,
            query_pos: 1,
        }];
        let r = cuda.attend_batch(&batch, true).unwrap();
        assert_eq!(r, host.attend_batch(&batch, true).unwrap());
        let err = r[0].unwrap_err();
        assert_eq!(err.expected, tag(5, 2));
        assert_eq!(
            err.found,
            Some(WriteTag {
                room: a,
                gen: Generation(1)
            })
        );
        // Transfers and zeroing.
        let kv = cuda.read_page(PageId(3)).unwrap();
        cuda.write_page(tag(7, 1), b, &kv).unwrap();
        let hkv = host.read_page(PageId(3)).unwrap();
        host.write_page(tag(7, 1), b, &hkv).unwrap();
        cuda.zero_page(PageId(4)).unwrap();
        host.zero_page(PageId(4)).unwrap();
        for p in 0..=8 {
            assert_eq!(
                cuda.read_page(PageId(p)).unwrap(),
                host.read_page(PageId(p)).unwrap()
            );
            assert_eq!(
                cuda.page_tag(PageId(p)).unwrap(),
                host.page_tag(PageId(p)).unwrap()
            );
        }
    }
}

/// A write whose page table repeats a page: the last write wins, as on the CPU.
#[test]
fn repeated_pages_write_in_order() {
    let Some(dev) = device("repeated_pages_write_in_order") else {
        return;
    };
    let mut cuda = dev.gpu(4, 4).unwrap_or_else(|e| panic!("{e}"));
    let mut host = HostGpu::new(4, 4);
    let table = [tag(2, 1), tag(3, 1), tag(2, 2), tag(9, 1)];
    // Positions 1..12: pages 2, 3, 2 (the fourth entry, beyond the pool, is untouched).
    let tokens: Vec<Token> = (1..=11).collect();
    let room = RoomKey::new(1, 1);
    cuda.write_tokens(&table, 1, &tokens, room).unwrap();
    host.write_tokens(&table, 1, &tokens, room).unwrap();
    // One more token would run past the table: both refuse it whole.
    let more: Vec<Token> = (1..=16).collect();
    assert!(cuda.write_tokens(&table, 1, &more, room).is_err());
    assert!(host.write_tokens(&table, 1, &more, room).is_err());
    for p in 0..=4 {
        assert_eq!(
            cuda.read_page(PageId(p)).unwrap(),
            host.read_page(PageId(p)).unwrap()
        );
        assert_eq!(
            cuda.page_tag(PageId(p)).unwrap(),
            host.page_tag(PageId(p)).unwrap()
        );
    }
}

/// Random workloads: `KVSIM_GPU_SEEDS` seeds (default 50) of 100 operations each.
#[test]
fn cuda_equals_host_on_random_workloads() {
    let Some(dev) = device("cuda_equals_host_on_random_workloads") else {
        return;
    };
    let seeds: u64 = std::env::var("KVSIM_GPU_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    for seed in 0..seeds {
        let w = Workload::from_seed(seed, 100).with_corruption();
        let mut cuda = dev
            .gpu(w.pool_pages, w.page_size)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut host = HostGpu::new(w.pool_pages, w.page_size);
        if let Err(e) = compare(&mut cuda, &mut host, &w, |a, b| a == b) {
            panic!("{e}");
        }
    }
}
