//! The harness itself: one request through every handoff step by hand ends in the
//! one right answer, with every pool back to free; timers, reordering, duplicates,
//! failed writes and crashes go through the world's rules.
//!
//! Not a test of any one handler (see the `*_handlers.rs` files). Invariant checked:
//! node invariants hold after every run here.

mod common;
use common::*;
use kvsim_engine::harness::{Delivered, HarnessError};
use kvsim_engine::msg::{Carried, Msg, Status};
use kvsim_engine::world::WriteFailure;
use kvsim_engine::Timer;

#[test]
fn one_request_by_hand_is_answered_once_with_its_tokens() {
    let mut h = harness();
    let room = decode_running(&mut h);
    h.settle(100).unwrap();
    let r = h.response(1).unwrap();
    assert_eq!(r.status, Status::OK);
    assert_eq!(r.tokens.len(), NEW as usize);
    assert_eq!(h.responses().len(), 1);
    assert!(h.router_room(room).is_none(), "the room was cleared");
    assert!(taken(&h, P).is_empty() && taken(&h, D).is_empty());
    assert_eq!(h.free_pages(P), 8);
    assert!(h.timers_of(R).is_empty());
    h.invariants().unwrap();
}

#[test]
fn settle_alone_runs_a_request_to_its_answer() {
    let mut h = harness();
    submit(&mut h, 7);
    h.settle(100).unwrap();
    assert_eq!(h.response(7).unwrap().status, Status::OK);
    h.invariants().unwrap();
}

#[test]
fn stepping_errors_are_typed() {
    let mut h = harness();
    assert!(matches!(
        h.deliver(0),
        Err(HarnessError::NoSuchFlight { index: 0, len: 0 })
    ));
    assert!(matches!(
        h.fire(P, Timer::Compute),
        Err(HarnessError::NoSuchTimer { .. })
    ));
    assert!(matches!(
        h.crash_restart(R),
        Err(HarnessError::CannotCrash(_))
    ));
    assert!(h.deliver_kind("KvDone", D).is_err());
}

#[test]
fn a_failed_write_sends_its_one_failed_completion_back() {
    let mut h = harness();
    let room = sending(&mut h);
    let w = h.find_kind("KvWrite", D).unwrap();
    assert_eq!(
        h.fail_write(w).unwrap(),
        Delivered::Failed(WriteFailure::Injected)
    );
    let done = h.find_kind("WriteDone", P).unwrap();
    let f = &h.in_flight()[done];
    assert_eq!(f.from, D);
    assert!(matches!(f.msg, Carried::Msg(Msg::WriteDone { ok: false, id }) if id.room == room));
}

#[test]
fn a_crash_fails_writes_back_and_restarts_the_node_in_a_new_epoch() {
    let mut h = harness();
    let room = sending(&mut h);
    assert_eq!(h.count_kind("KvWrite"), 2);
    assert_eq!(h.crash_restart(D).unwrap(), 1);
    assert_eq!(h.count_kind("KvWrite"), 0);
    assert_eq!(h.count_kind("WriteDone"), 2, "each write failed back once");
    assert!(h.timers_of(D).is_empty());
    assert!(h.decode_phase(D, room).is_none());
    assert_eq!(h.decode(D).unwrap().pool().epoch(), 1);
    // Prefill hears the failed completions, fails the room, and the router aborts
    // decode's new incarnation, which answers for a room it never knew.
    h.settle(100).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::INTERNAL);
    assert!(h.router_room(room).is_none(), "both halves answered");
    assert!(taken(&h, P).is_empty() && taken(&h, D).is_empty());
    h.invariants().unwrap();
}

#[test]
fn messages_to_a_crashed_node_reach_its_next_incarnation_and_its_timers_die() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    assert_eq!(h.count_kind("KvMeta"), 1);
    assert_eq!(h.timers_of(P), vec![Timer::Bootstrap(room)]);
    h.crash_restart(P).unwrap();
    assert_eq!(h.count_kind("KvMeta"), 1, "still on its way");
    assert!(h.timers_of(P).is_empty());
    assert!(h.prefill_phase(P, room).is_none());
    // The new incarnation keeps it as the page list of a start it has not seen (the
    // start went to the dead one). Only the router's request timer can end it now.
    assert_eq!(h.settle(100).unwrap(), 1);
    assert_eq!(h.prefill(P).unwrap().early_meta_from(room), vec![D]);
    h.fire(R, Timer::Request(room)).unwrap();
    h.settle(100).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::INTERNAL);
    assert!(h.router_room(room).is_none());
    assert!(taken(&h, P).is_empty() && taken(&h, D).is_empty());
    h.invariants().unwrap();
}

#[test]
fn a_duplicate_start_is_ignored_and_a_reordered_start_still_runs() {
    let mut h = harness();
    let room = submit(&mut h, 1);
    let ps = h.find_kind("PrefillStart", P).unwrap();
    h.duplicate(ps).unwrap();
    // Deliver the later message (DecodeStart is first) before the earlier one.
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    let m = h.mark();
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    assert!(
        h.events_since(m).is_empty(),
        "a duplicate start changes nothing"
    );
    assert_eq!(
        h.prefill_phase(P, room),
        Some(kvsim_engine::prefill::PrefillPhase::Bootstrapping)
    );
    h.settle(100).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::OK);
}

#[test]
fn deliver_for_picks_the_message_about_one_room_out_of_order() {
    let mut h = harness();
    let first = submit(&mut h, 1);
    let second = submit(&mut h, 2);
    assert_ne!(first, second);
    handled(h.deliver_for("PrefillStart", P, second).unwrap());
    assert!(h.prefill_phase(P, first).is_none());
    assert_eq!(
        h.prefill_phase(P, second),
        Some(kvsim_engine::prefill::PrefillPhase::Bootstrapping)
    );
    // Holding a message is not delivering it: the first start is still in flight.
    assert!(h.find_kind("PrefillStart", P).is_ok());
    h.settle(200).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::OK);
    assert_eq!(h.response(2).unwrap().status, Status::OK);
}

#[test]
fn a_partition_drops_control_messages_fails_writes_and_lets_completions_through() {
    let mut h = harness();
    let room = sending(&mut h);
    h.partition(P, D);
    let w = h.find_kind("KvWrite", D).unwrap();
    assert_eq!(
        h.deliver(w).unwrap(),
        Delivered::Failed(WriteFailure::Partitioned)
    );
    assert_eq!(
        h.deliver_kind("WriteDone", P).unwrap(),
        Delivered::Handled,
        "a completion crosses the partition"
    );
    let done = h.find_kind("KvDone", D).unwrap();
    assert_eq!(
        h.deliver(done).unwrap(),
        Delivered::Dropped(kvsim_engine::world::DropReason::Partitioned)
    );
    h.heal(P, D);
    assert_eq!(h.deliver_kind("KvWrite", D).unwrap(), Delivered::Handled);
    assert!(matches!(
        h.prefill_phase(P, room),
        Some(kvsim_engine::prefill::PrefillPhase::Inflight { success: false })
    ));
}

#[test]
fn the_harness_runs_on_numeric_kv_memory_too_with_the_same_answer() {
    let mut numeric = kvsim_engine::harness::Harness::with_gpu(
        cfg(),
        kvsim_engine::world::Topology {
            prefill_pools: vec![8],
            decode_pools: vec![8],
        },
        kvsim_engine::gpu::HostGpu::new,
    )
    .unwrap();
    handled(numeric.submit(1, prompt(LEN), NEW).unwrap());
    numeric.settle(100).unwrap();
    let mut symbolic = harness();
    submit(&mut symbolic, 1);
    symbolic.settle(100).unwrap();
    let (a, b) = (numeric.response(1).unwrap(), symbolic.response(1).unwrap());
    assert_eq!(a.status, Status::OK);
    assert_eq!(a, b);
}
