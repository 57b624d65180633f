//! The tag check (defense 4) refuses a read whenever any single entry of the page
//! table is stale, at any position: the first page, a middle page, and a partial last
//! page, in both backends, through `check_tags` and the batched `attend_batch`; and
//! names that entry.

use kvsim_engine::gpu::{AttendRequest, Gpu, HostGpu, SymbolicGpu, TagError};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, Token};
use proptest::prelude::*;

/// How one entry of an otherwise good table goes stale.
#[derive(Clone, Copy, Debug)]
enum Stale {
    /// The page was reallocated since: the table's generation is behind.
    OldGeneration,
    /// Another room use wrote the page under the same generation.
    OtherRoom,
    /// The page was never written for this room (it holds nothing).
    NeverWritten,
}

fn check<G: Gpu>(
    mut gpu: G,
    pages: usize,
    tokens: u64,
    bad: usize,
    how: Stale,
) -> Result<(), TestCaseError> {
    let ps = u64::from(gpu.page_size());
    let room = RoomKey::new(1, 1);
    let other = RoomKey::new(2, 1);
    let table: Vec<PageTag> = (0..pages)
        .map(|i| PageTag {
            page: PageId(i as u32 + 1),
            gen: Generation(5),
        })
        .collect();
    let prompt: Vec<Token> = (0..tokens).map(|i| 0x0002_0000 | i as u32).collect();
    match how {
        Stale::NeverWritten => {
            // Write every page but `bad` (position by position, so a partial last page
            // is written only as far as the prompt goes).
            for (i, t) in table.iter().enumerate() {
                let lo = i as u64 * ps;
                let hi = (lo + ps).min(tokens);
                if i != bad && lo < hi {
                    gpu.write_tokens(&[*t], 0, &prompt[lo as usize..hi as usize], room)
                        .unwrap();
                }
            }
        }
        _ => {
            gpu.write_tokens(&table, 0, &prompt, room).unwrap();
            let t = table[bad];
            match how {
                Stale::OldGeneration => {
                    let newer = PageTag {
                        gen: Generation(6),
                        ..t
                    };
                    gpu.write_tokens(&[newer], 0, &[0x0003_0000], other)
                        .unwrap();
                }
                _ => gpu.write_tokens(&[t], 0, &[0x0003_0000], other).unwrap(),
            }
        }
    }
    // The good table passes before anything goes stale (sanity), here it must fail.
    let err = match gpu.check_tags(&table, room) {
        Err(TagError::Mismatch(m)) => m,
        other => panic!("a stale table must be a mismatch, got {other:?}"),
    };
    prop_assert_eq!(err.expected, table[bad]);
    let req = AttendRequest {
        pages: &table,
        room,
        seq_len: tokens,
        query_pos: 0,
    };
    let r = gpu.attend_batch(&[req], true).unwrap();
    prop_assert!(r[0].is_err(), "attend_batch read a stale table: {:?}", r);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_single_stale_entry_refuses_the_read(
        page_size in prop::sample::select(vec![1u32, 2, 3, 4, 16]),
        pages in 1usize..6,
        short in 0u64..16,
        pick in 0usize..3,
        at in any::<prop::sample::Index>(),
        how in prop::sample::select(vec![Stale::OldGeneration, Stale::OtherRoom, Stale::NeverWritten]),
    ) {
        let ps = u64::from(page_size);
        // The last page is partial whenever `short % ps` is not 0.
        let tokens = (pages as u64 * ps - short % ps).max(1);
        // First, last, or anywhere.
        let bad = match pick {
            0 => 0,
            1 => pages - 1,
            _ => at.index(pages),
        };
        check(SymbolicGpu::new(8, page_size), pages, tokens, bad, how)?;
        check(HostGpu::new(8, page_size), pages, tokens, bad, how)?;
    }
}

/// The same table with nothing stale passes (so the property above is not vacuous).
#[test]
fn a_table_with_nothing_stale_passes() {
    for gpu_ps in [1u32, 3, 16] {
        let mut gpu = SymbolicGpu::new(8, gpu_ps);
        let room = RoomKey::new(1, 1);
        let table: Vec<PageTag> = (1..=3)
            .map(|p| PageTag {
                page: PageId(p),
                gen: Generation(5),
            })
            .collect();
        let n = 3 * u64::from(gpu_ps) - u64::from(gpu_ps > 1);
        let prompt: Vec<Token> = (0..n).map(|i| 0x0002_0000 | i as u32).collect();
        gpu.write_tokens(&table, 0, &prompt, room).unwrap();
        assert!(gpu.check_tags(&table, room).is_ok());
    }
}
