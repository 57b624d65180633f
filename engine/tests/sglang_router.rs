//! The `sglang-router` policy: the observable behaviour of SGLang's gateway 0.3.2
//! (`src/routers/http/pd_router.rs`, `src/core/retry.rs` of sgl-project/sglang), one
//! hand-stepped input at a time, and end to end on the default topology.
//!
//! Not a test of prefill or decode: where a half's report is the point it is injected
//! from the right node. Invariant checked: every request gets exactly one answer, a
//! failed half never cancels the other, a retryable answer starts a new attempt in a
//! new room while attempts are left (five in all), and every room an attempt took is
//! cleared only when both its halves answered.

mod common;
use common::*;
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::RoomKey;
use kvsim_engine::msg::{Carried, Msg, Status};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::{EngineConfig, Timer};

fn sglang(seed: u64) -> EngineConfig {
    EngineConfig {
        router: RouterPolicy::SglangRouter,
        router_seed: seed,
        ..cfg()
    }
}

fn h(seed: u64) -> H {
    Harness::new(sglang(seed)).unwrap()
}

fn report(h: &mut H, from: kvsim_engine::ids::NodeId, msg: Msg) {
    handled(h.inject(from, R, msg).unwrap());
}

/// The rooms routed so far, in order (one per attempt).
fn routed(h: &H) -> Vec<RoomKey> {
    h.events()
        .iter()
        .filter_map(|(_, e)| match e {
            TraceEvent::Routed { room, .. } => Some(*room),
            _ => None,
        })
        .collect()
}

fn aborts_since(h: &H, m: kvsim_engine::harness::Mark) -> usize {
    h.sends_since(m)
        .iter()
        .filter(|s| matches!(s.msg, Carried::Msg(Msg::Abort { .. })))
        .count()
}

#[test]
fn a_failed_half_cancels_nothing_and_the_router_waits_for_the_other() {
    let mut h = h(7);
    let room = submit(&mut h, 1);
    let m = h.mark();
    report(
        &mut h,
        D,
        Msg::DecodeFinished {
            room,
            status: Status::BAD_REQUEST,
            why: None,
        },
    );
    assert_eq!(aborts_since(&h, m), 0, "no cancel of prefill");
    assert!(h.responses().is_empty(), "it waits for prefill");
    assert!(h.router_room(room).is_some());
    report(
        &mut h,
        P,
        Msg::PrefillFinished {
            room,
            status: Status::OK,
            why: None,
        },
    );
    // 400 is not retried: decode's answer goes to the client, the room is cleared.
    assert_eq!(h.response(1).unwrap().status, Status::BAD_REQUEST);
    assert!(h.router_room(room).is_none());
    assert_eq!(routed(&h).len(), 1);
}

#[test]
fn prefills_error_is_the_answer_when_only_prefill_failed() {
    let mut h = h(7);
    let room = submit(&mut h, 1);
    report(
        &mut h,
        P,
        Msg::PrefillFinished {
            room,
            status: Status::BAD_REQUEST,
            why: None,
        },
    );
    for index in 0..NEW {
        report(
            &mut h,
            D,
            Msg::TokenOut {
                room,
                index,
                token: 1,
            },
        );
    }
    let m = h.mark();
    report(
        &mut h,
        D,
        Msg::DecodeFinished {
            room,
            status: Status::OK,
            why: None,
        },
    );
    assert_eq!(aborts_since(&h, m), 0);
    let r = h.response(1).unwrap();
    assert_eq!((r.status, r.tokens.len()), (Status::BAD_REQUEST, 0));
}

#[test]
fn a_retryable_answer_starts_a_new_attempt_in_a_new_room() {
    let mut h = h(7);
    let first = submit(&mut h, 1);
    report(
        &mut h,
        P,
        Msg::PrefillFinished {
            room: first,
            status: Status::OK,
            why: None,
        },
    );
    let m = h.mark();
    report(
        &mut h,
        D,
        Msg::DecodeFinished {
            room: first,
            status: Status::INTERNAL,
            why: None,
        },
    );
    assert!(h.responses().is_empty(), "500 is retried, not answered");
    assert!(
        h.router_room(first).is_none(),
        "both halves answered: cleared"
    );
    let second = h.room_of(1).unwrap();
    assert_ne!(second, first);
    assert_eq!(routed(&h), vec![first, second]);
    let retried = h.events_since(m).iter().any(|(_, e)| {
        matches!(e, TraceEvent::RouterRetried { room, status, attempt: 2, .. }
            if *room == first && *status == Status::INTERNAL)
    });
    assert!(retried, "{:?}", h.event_names_since(m));
    // The new attempt runs to its answer.
    h.settle(300).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::OK);
    assert_eq!(h.responses().len(), 1);
}

#[test]
fn a_timed_out_attempt_is_given_up_while_its_halves_still_work_and_five_attempts_end_it() {
    let mut h = h(3);
    let mut rooms = vec![submit(&mut h, 1)];
    for attempt in 1..=5 {
        let room = *rooms.last().unwrap();
        let m = h.mark();
        h.fire(R, Timer::Request(room)).unwrap();
        // The connections close: each half of the given-up attempt is told to abort.
        assert_eq!(aborts_since(&h, m), 2, "attempt {attempt}");
        let live = h.router_room(room).unwrap();
        assert!(live.prefill_status.is_none() && live.decode_status.is_none());
        if attempt < 5 {
            assert!(h.responses().is_empty());
            rooms.push(h.room_of(1).unwrap());
        }
    }
    assert_eq!(routed(&h), rooms);
    let mut distinct = rooms.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "a new room each attempt");
    assert_eq!(h.response(1).unwrap().status, Status::BAD_GATEWAY);
    assert_eq!(h.responses().len(), 1);
    // Every attempt's halves answer their aborts; every room is cleared, every pool full.
    h.settle(500).unwrap();
    for room in rooms {
        assert!(h.router_room(room).is_none(), "{room}");
    }
    assert_eq!(h.router().unwrap().live_rooms(), 0);
    assert_eq!((h.free_pages(P), h.free_pages(D)), (8, 8));
    assert_eq!(h.responses().len(), 1);
    h.invariants().unwrap();
}

#[test]
fn a_client_disconnect_closes_both_halves_mid_transfer() {
    let mut h = h(7);
    let room = sending(&mut h);
    let m = h.mark();
    handled(h.cancel(1).unwrap());
    assert_eq!(aborts_since(&h, m), 2);
    assert_eq!(h.response(1).unwrap().status, Status::CLIENT_CLOSED);
    h.settle(300).unwrap();
    assert!(h.router_room(room).is_none());
    assert_eq!(routed(&h).len(), 1, "a disconnect is never retried");
    assert_eq!((h.free_pages(P), h.free_pages(D)), (8, 8));
}

#[test]
fn the_room_of_each_attempt_comes_from_the_routers_seed() {
    let rooms = |seed| {
        let mut h = h(seed);
        let mut rooms = vec![submit(&mut h, 1)];
        for _ in 0..4 {
            let room = *rooms.last().unwrap();
            h.fire(R, Timer::Request(room)).unwrap();
            if let Some(r) = h.room_of(1) {
                rooms.push(r);
            }
        }
        rooms
    };
    assert_eq!(rooms(11), rooms(11), "same seed, same rooms");
    assert_ne!(rooms(11), rooms(12), "another seed, other rooms");
}

/// Request 5 refused at prefill's intake (its queue of 4 is full) after decode reserved
/// pages for it and sent its page list, under `bugs`; everything that follows settled
/// without decode's waiting timeout (which `settle` never fires). Returns the room and
/// the harness.
fn refused_at_intake_after_decode_reserved(bugs: kvsim_engine::bugs::BugSet) -> (H, RoomKey) {
    let mut cfg = sglang(7);
    cfg.bugs = bugs;
    let mut h: H = Harness::new(cfg).unwrap();
    for req in 1..=5 {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
    }
    for _ in 0..4 {
        handled(h.deliver_kind("PrefillStart", P).unwrap());
    }
    let room = h.room_of(5).unwrap();
    handled(h.deliver_for("DecodeStart", D, room).unwrap());
    handled(h.deliver_for("PrefillStart", P, room).unwrap());
    assert!(h.timer_pending(D, Timer::WaitingForKv(room)));
    handled(h.deliver_for("KvMeta", P, room).unwrap());
    h.settle(256).unwrap();
    (h, room)
}

/// Issue 37, class 6: behind this router nobody cancels the half that did not fail.
/// Prefill refuses request 5 at intake (its queue is full) after decode reserved pages
/// and sent its page list. Prefill tells decode the transfer failed; decode fails the
/// room at once, quarantines, asks for the drain, prefill (no write left) acks, decode
/// releases every page and answers 500, all without its waiting timeout. Before the
/// fix (commit f4fe9ff; `prefill-drops-failed-page-list` restores it) prefill dropped
/// the page list and decode held its pages until that timeout.
#[test]
fn a_start_refused_by_prefill_frees_decodes_pages_before_its_waiting_timeout() {
    let (h, room) = refused_at_intake_after_decode_reserved(kvsim_engine::bugs::BugSet::NONE);
    assert!(!h.timer_pending(D, Timer::WaitingForKv(room)));
    assert_eq!(h.decode_phase(D, room), None);
    assert!(h.decode(D).unwrap().quarantined_rooms() == 0);
    let decode_answers: Vec<Status> = h
        .sends()
        .iter()
        .filter_map(|s| match s.msg {
            Carried::Msg(Msg::DecodeFinished {
                room: r, status, ..
            }) if r == room => Some(status),
            _ => None,
        })
        .collect();
    assert_eq!(decode_answers, vec![Status::INTERNAL]);
    h.invariants().unwrap();
}

/// `prefill-drops-failed-page-list` restores the silence: the same run leaves decode
/// holding request 5's room, and its pages, for its waiting timeout, and the router
/// waiting for decode; only that timer ends it (decode answers 500).
#[test]
fn prefill_drops_failed_page_list_leaves_decode_to_its_waiting_timeout() {
    let bugs =
        kvsim_engine::bugs::BugSet::NONE.with(kvsim_engine::bugs::Bug::PrefillDropsFailedPageList);
    let (mut h, room) = refused_at_intake_after_decode_reserved(bugs);
    assert!(h.timer_pending(D, Timer::WaitingForKv(room)));
    assert!(
        h.decode_phase(D, room).is_some(),
        "decode still holds the room"
    );
    assert!(h.router_room(room).is_some(), "the router still waits");
    h.fire(D, Timer::WaitingForKv(room)).unwrap();
    h.settle(256).unwrap();
    assert_eq!(h.decode_phase(D, room), None);
    h.invariants().unwrap();
}

/// Issue 37, class 3 (SGLang #29482: `execute_dual_dispatch_internal` joins both legs,
/// so a decode leg that failed to dispatch leaves the prefill leg waiting until the
/// request timeout, 1800 s by default): the router's wait is the real policy's, and
/// kvsim's nodes must survive it. Decode's start never arrives. Prefill's own bootstrap
/// timer (SGLang's `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`) bounds the orphan: the
/// room fails and retires when it fires, holding no page meanwhile (source pages are
/// taken only once decode's page list came). The router, still waiting for decode,
/// gives the attempt up at its request timer and retries in a new room, which completes.
#[test]
fn a_decode_start_that_never_arrives_leaves_prefill_to_its_bootstrap_timer() {
    let mut h = h(7);
    let room = bootstrapping(&mut h);
    let lost = h.find_kind("DecodeStart", D).unwrap();
    h.drop_flight(lost).unwrap();
    assert_eq!(h.free_pages(P), 8, "the orphan holds no page");
    assert!(h.timer_pending(P, Timer::Bootstrap(room)));
    h.fire(P, Timer::Bootstrap(room)).unwrap();
    assert_eq!(h.prefill_phase(P, room), None, "prefill let the room go");
    assert_eq!(h.prefill(P).unwrap().requests(), 0);
    handled(h.deliver_kind("PrefillFinished", R).unwrap());
    let live = h.router_room(room).unwrap();
    assert_eq!(live.prefill_status, Some(Status::INTERNAL));
    assert!(
        live.decode_status.is_none(),
        "the router still waits for decode"
    );
    assert!(h.responses().is_empty());
    h.fire(R, Timer::Request(room)).unwrap();
    let second = h.room_of(1).unwrap();
    assert_ne!(second, room, "retried in a new room");
    h.settle(400).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::OK);
    assert_eq!((h.free_pages(P), h.free_pages(D)), (8, 8));
    h.invariants().unwrap();
}

/// Issue 37, class 3, the replay (`retry-reuses-room`): a request timeout gives the
/// attempt up while its halves still work, and the retry goes out in the same room use
/// (the room drawn once for the request). The halves see a second start for the room
/// use they hold; the router has forgotten the first attempt and takes the answers its
/// halves give to their aborts for the replay's. Without the switch the retry takes a
/// new room (`a_timed_out_attempt_is_given_up_...`).
#[test]
fn retry_reuses_room_replays_the_attempt_in_the_room_it_gave_up() {
    let mut cfg = sglang(3);
    cfg.bugs = kvsim_engine::bugs::BugSet::NONE.with(kvsim_engine::bugs::Bug::RetryReusesRoom);
    let mut h: H = Harness::new(cfg).unwrap();
    let room = bootstrapping(&mut h);
    h.fire(R, Timer::Request(room)).unwrap();
    assert_eq!(
        routed(&h),
        vec![room, room],
        "the replay is in the same room use"
    );
    let starts = h
        .in_flight()
        .iter()
        .filter(|f| matches!(&f.msg, Carried::Msg(Msg::PrefillStart { room: r, .. }) if *r == room))
        .count();
    assert_eq!(
        starts, 1,
        "the replay's start is on its way to the prefill that holds it"
    );
    let live = h.router_room(room).unwrap();
    assert!(live.prefill_status.is_none() && live.decode_status.is_none());
    h.router().unwrap().invariants().unwrap();
}
