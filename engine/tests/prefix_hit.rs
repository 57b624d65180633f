//! A prefill radix-cache hit (`prefix_hit_pages`): the cached prefix is no send of its
//! own, the first KV write carries it with the first computed chunk, and every chunk is
//! written at its own position; under `chunk-index-by-position` (sglang #30545) a chunk
//! after the first lands at the grid slot of its index instead, inside the room's own
//! pages, and decode's verification refuses the transfer.

mod common;
use common::*;
use kvsim_engine::ids::PageTag;
use kvsim_engine::msg::Status;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::{Bug, BugSet, EngineConfig};

/// Pages of 4 tokens, chunks of 2 pages, a prefix hit of 1 page: off the grid.
fn hit_cfg(bugs: BugSet) -> EngineConfig {
    EngineConfig {
        prefix_hit_pages: 1,
        max_inflight_chunks: 4,
        bugs,
        ..cfg()
    }
}

/// A KV write prefill sent: its source and destination page ids.
type Sent = (Vec<u32>, Vec<u32>);

/// Serve one request of `len` tokens (3 new) and return the writes prefill sent, as
/// (source page ids, destination page ids), and the client's status. Both pools are
/// fresh, so each hands out its pages in order from 1.
fn serve(bugs: BugSet, len: u32) -> (Vec<Sent>, Status) {
    let mut h = kvsim_engine::harness::Harness::new(hit_cfg(bugs)).unwrap();
    handled(h.submit(1, prompt(len), NEW).unwrap());
    h.settle(10_000).unwrap();
    h.invariants().unwrap();
    let ids = |t: &[PageTag]| t.iter().map(|t| t.page.0).collect::<Vec<u32>>();
    let writes = h
        .events()
        .iter()
        .filter_map(|(_, e)| match e {
            TraceEvent::KvSent { src, dst, .. } => Some((ids(src), ids(dst))),
            _ => None,
        })
        .collect();
    let status = h.responses().first().map(|r| r.status).unwrap();
    (writes, status)
}

#[test]
fn the_first_send_carries_the_cached_prefix_and_every_chunk_lands_at_its_position() {
    // 18 tokens: 5 pages. The cached page and the first computed chunk (pages 1..3),
    // then chunks of two from page 3: [4, 5], each at its own position.
    let (writes, status) = serve(BugSet::NONE, 18);
    assert_eq!(
        writes,
        vec![(vec![1, 2, 3], vec![1, 2, 3]), (vec![4, 5], vec![4, 5])]
    );
    assert_eq!(status, Status::OK);
}

#[test]
fn a_prefix_hit_on_the_grid_skews_nothing_even_under_the_switch() {
    // A hit of 2 pages is one whole chunk: the first send (4 pages) ends on the grid.
    let cfg = EngineConfig {
        prefix_hit_pages: 2,
        ..hit_cfg(BugSet::NONE.with(Bug::ChunkIndexByPosition))
    };
    let mut h = kvsim_engine::harness::Harness::new(cfg).unwrap();
    handled(h.submit(1, prompt(18), NEW).unwrap());
    h.settle(10_000).unwrap();
    assert_eq!(h.responses()[0].status, Status::OK);
}

#[test]
fn under_the_switch_a_chunk_after_the_prefix_lands_at_its_grid_slot_and_is_refused() {
    // The second chunk starts at page 3 (index 3 / 2 = 1): it lands at the grid slot
    // of chunk 1, decode's pages 3 and 4 (list positions 2..4), not 4 and 5; decode's
    // page 5 is never written, and verification refuses the transfer.
    let (writes, status) = serve(BugSet::NONE.with(Bug::ChunkIndexByPosition), 18);
    assert_eq!(
        writes,
        vec![(vec![1, 2, 3], vec![1, 2, 3]), (vec![4, 5], vec![3, 4])]
    );
    assert_eq!(status, Status::INTERNAL);
}
