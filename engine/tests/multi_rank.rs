//! Rooms with several sender ranks under vLLM's pull (issue 37, class 1),
//! hand-stepped: decode posts one READ handle per remote prefill rank, each reading
//! its slice of the room's pages; the transfer ends only when every handle has been
//! counted, a failure is reported and the pages let go only once every sibling
//! stopped, and prefill frees its pages only once every rank's notification came.
//! `first-failed-handle-frees` (vllm #56104) frees at the first failure instead.
//!
//! Invariant checked: no page of a room is released while one of its READ handles
//! may still land; every request gets one answer; pools end whole.

mod common;
use common::*;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::harness::{Delivered, Harness};
use kvsim_engine::msg::{Carried, Msg, Status};
use kvsim_engine::prefill_vllm::VllmPhase;
use kvsim_engine::{EngineConfig, Node, Timer};

fn ranks(n: u32, bugs: BugSet) -> H {
    let cfg = EngineConfig {
        router: RouterPolicy::VllmRouter,
        ranks: n,
        bugs,
        ..cfg()
    };
    Harness::new(cfg).unwrap()
}

/// Deliver messages (and fire `Compute`) until decode's READ handles are all in
/// flight: `n` of them.
fn until_reads(h: &mut H, n: usize) {
    for _ in 0..200 {
        if h.count_kind("KvRead") == n {
            return;
        }
        if h.in_flight().is_empty() {
            let node = [P, D, R]
                .into_iter()
                .find(|&x| h.timer_pending(x, Timer::Compute))
                .expect("something to do");
            h.fire(node, Timer::Compute).unwrap();
        } else {
            h.deliver(0).unwrap();
        }
    }
    panic!("the READ handles never went out");
}

/// The READ requests in flight, as (rank, source pages).
fn reads(h: &H) -> Vec<(u32, usize)> {
    h.in_flight()
        .iter()
        .filter_map(|f| match &f.msg {
            Carried::Msg(Msg::KvRead { id, src, .. }) => Some((id.chunk, src.len())),
            _ => None,
        })
        .collect()
}

fn leased(h: &H, room: kvsim_engine::ids::RoomKey) -> bool {
    match h.node(P) {
        Some(Node::VllmPrefill(p)) => matches!(p.room_phase(room), Some(VllmPhase::Leased { .. })),
        _ => false,
    }
}

#[test]
fn each_rank_reads_its_slice_and_prefill_waits_for_every_notification() {
    let mut h = ranks(2, BugSet::NONE);
    let room = submit(&mut h, 1);
    until_reads(&mut h, 2);
    // A 10-token prompt in pages of 4: three pages, rank 0 reads two, rank 1 one.
    assert_eq!(reads(&h), vec![(0, 2), (1, 1)]);
    // Serve both READs and land their bytes, until one notification is in flight.
    while h.count_kind("ReadNotify") < 2 {
        h.deliver(0).unwrap();
    }
    handled(h.deliver_kind("ReadNotify", P).unwrap());
    assert!(
        leased(&h, room),
        "one rank's notification does not end the lease"
    );
    handled(h.deliver_kind("ReadNotify", P).unwrap());
    assert!(!leased(&h, room), "every rank's notification ends it");
    h.settle(500).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::OK);
    for n in [P, D] {
        let pool = h.node(n).and_then(|n| n.pool()).unwrap();
        assert_eq!(h.free_pages(n), pool.capacity(), "{n} is whole again");
    }
    h.invariants().unwrap();
}

/// One handle fails while its sibling is still on its way: the defended decode keeps
/// the room's pages until the sibling completes, then fails the request (500) and
/// frees them. Under `first-failed-handle-frees` the pages are freed at the first
/// failure, with the sibling's READ still to land in them.
fn first_failure(bugs: BugSet) -> (usize, usize, H) {
    let mut h = ranks(2, bugs);
    submit(&mut h, 1);
    until_reads(&mut h, 2);
    let first = h.find_kind("KvRead", P).unwrap();
    assert!(matches!(h.fail_write(first).unwrap(), Delivered::Failed(_)));
    // Deliver the failed completion only (the sibling READ stays in flight).
    let done = h
        .find("the failed completion", |f| {
            matches!(f.msg, Carried::Msg(Msg::WriteDone { ok: false, .. }))
        })
        .unwrap();
    handled(h.deliver(done).unwrap());
    let free_at_failure = h.free_pages(D);
    h.settle(500).unwrap();
    (free_at_failure, h.free_pages(D), h)
}

#[test]
fn a_failed_handle_frees_nothing_while_its_sibling_may_land() {
    let (at_failure, end, h) = first_failure(BugSet::NONE);
    let capacity = h.node(D).and_then(|n| n.pool()).unwrap().capacity();
    assert!(at_failure < capacity, "the room's pages are still held");
    assert_eq!(end, capacity, "released once the sibling completed");
    assert_eq!(h.response(1).unwrap().status, Status::INTERNAL);
    h.invariants().unwrap();
}

#[test]
fn first_failed_handle_frees_lets_go_of_the_pages_at_the_first_failure() {
    let (at_failure, _, h) = first_failure(BugSet::NONE.with(Bug::FirstFailedHandleFrees));
    let capacity = h.node(D).and_then(|n| n.pool()).unwrap().capacity();
    assert_eq!(
        at_failure, capacity,
        "freed with the sibling READ in flight"
    );
}
