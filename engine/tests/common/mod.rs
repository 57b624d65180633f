//! Shared set-up for the hand-stepped handler tests: a small configuration, the node
//! ids of the default topology, and helpers that walk one room use to a given phase.
//!
//! It is not a test itself and asserts only what a walk needs to be where it claims
//! (each walk step checks the delivery was handled). Invariant: every walk goes
//! through the harness's public API only, one input at a time.
#![allow(dead_code)]

use kvsim_engine::harness::{Delivered, Harness, Mark};
use kvsim_engine::ids::{NodeId, PageId, RoomKey, Token};
use kvsim_engine::kv::{PageRecord, PageState};
use kvsim_engine::{EngineConfig, Timer};

pub type H = Harness<kvsim_engine::gpu::SymbolicGpu>;

pub const R: NodeId = NodeId(0);
pub const P: NodeId = NodeId(1);
pub const D: NodeId = NodeId(2);

/// Pages of 4 tokens, an 8-page pool (32 tokens of context), chunks of 2 pages with
/// at most 2 in flight.
pub fn cfg() -> EngineConfig {
    EngineConfig {
        page_size: 4,
        context_len: 32,
        chunk_pages: 2,
        max_inflight_chunks: 2,
        max_rooms: 8,
        max_queue: 4,
        max_batch: 4,
        max_new_tokens_limit: 8,
        ..Default::default()
    }
}

pub fn harness() -> H {
    Harness::new(cfg()).unwrap()
}

pub fn prompt(n: u32) -> Vec<Token> {
    (1..=n).map(|i| 100 + i).collect()
}

/// The request the walks use: a 10-token prompt (3 pages on prefill) and 3 new
/// tokens (4 pages reserved on decode, 3 of them the transfer destination).
pub const LEN: u32 = 10;
pub const NEW: u32 = 3;

pub fn handled(d: Delivered) {
    assert_eq!(d, Delivered::Handled);
}

/// Submit request `req` and return its room.
pub fn submit(h: &mut H, req: u64) -> RoomKey {
    handled(h.submit(req, prompt(LEN), NEW).unwrap());
    h.room_of(req).unwrap()
}

/// Prefill admitted the room (Bootstrapping); the DecodeStart is still in flight.
pub fn bootstrapping(h: &mut H) -> RoomKey {
    let room = submit(h, 1);
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    room
}

/// Decode reserved its pages and sent the page list; prefill has not seen either.
pub fn decode_transferring(h: &mut H) -> RoomKey {
    let room = submit(h, 1);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    room
}

/// Prefill knows the page list and waits for source pages.
pub fn waiting(h: &mut H) -> RoomKey {
    let room = bootstrapping(h);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    handled(h.deliver_kind("KvMeta", P).unwrap());
    room
}

/// Prefill admitted the room into its forward batch.
pub fn forward(h: &mut H) -> RoomKey {
    let room = waiting(h);
    h.fire(P, Timer::Compute).unwrap();
    room
}

/// Prefill ran the forward and has both chunk writes in flight.
pub fn sending(h: &mut H) -> RoomKey {
    let room = forward(h);
    h.fire(P, Timer::Compute).unwrap();
    room
}

/// Every write landed and completed; prefill concluded Success, KvDone in flight.
pub fn inflight(h: &mut H) -> RoomKey {
    let room = sending(h);
    for _ in 0..2 {
        handled(h.deliver_kind("KvWrite", D).unwrap());
    }
    for _ in 0..2 {
        handled(h.deliver_kind("WriteDone", P).unwrap());
    }
    room
}

/// Decode accepted the transfer and runs the request.
pub fn decode_running(h: &mut H) -> RoomKey {
    let room = inflight(h);
    handled(h.deliver_kind("KvDone", D).unwrap());
    room
}

/// A node's page records that have an owner or are not free, as
/// `(page, state, owner)`.
pub fn taken(h: &H, node: NodeId) -> Vec<(u32, PageState, Option<RoomKey>)> {
    h.pages(node)
        .into_iter()
        .filter(|(_, r)| r.state != PageState::Free)
        .map(|(p, r)| (p.0, r.state, r.owner))
        .collect()
}

/// Every page record of every node, for before/after comparisons.
pub fn all_pages(h: &H) -> Vec<(NodeId, Vec<(PageId, PageRecord)>)> {
    (0..h.client().0)
        .map(NodeId)
        .map(|n| (n, h.pages(n)))
        .collect()
}

/// `(kind, to)` of the sends since `mark`.
pub fn sent(h: &H, mark: Mark) -> Vec<(&'static str, NodeId)> {
    h.send_kinds_since(mark)
        .into_iter()
        .map(|(_, k, to)| (k, to))
        .collect()
}
