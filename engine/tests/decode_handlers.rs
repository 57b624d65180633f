//! Every input the decode node handles, one hand-stepped input at a time: the phase
//! it moves the room to, its pages, its pending timers, the messages it sends and the
//! events it traces; up to the drain-ack fault that stops the node, and a restart.
//!
//! Not an end-to-end test, and not a test of prefill or the router, whose inputs are
//! driven only as far as a decode input needs. Invariant checked: after every step
//! the nodes' own invariants hold.

mod common;
use common::*;
use kvsim_engine::decode::DecodePhase::{self, *};
use kvsim_engine::gpu::{Gpu, SymbolicPage};
use kvsim_engine::harness::{Delivered, Harness};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::PageState::{self, Ready, Reserved, Writing};
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status, TransferOutcome};
use kvsim_engine::trace::{FaultAction, NodeFault, TraceEvent};
use kvsim_engine::world::WriteFailure;
use kvsim_engine::{Bug, BugSet, EngineConfig, Timer};

struct Want<'a> {
    phase: Option<DecodePhase>,
    events: &'a [&'a str],
    sends: &'a [(&'a str, kvsim_engine::NodeId)],
    timers: Vec<Timer>,
    /// States of decode's pages that are not free, in page order.
    pages: &'a [PageState],
}

fn check(h: &mut H, room: RoomKey, act: impl FnOnce(&mut H), want: Want) {
    let m = h.mark();
    act(h);
    assert_eq!(h.decode_phase(D, room), want.phase, "phase");
    assert_eq!(h.event_names_since(m), want.events, "events");
    assert_eq!(sent(h, m), want.sends, "sends");
    assert_eq!(h.timers_of(D), want.timers, "timers");
    let states: Vec<PageState> = taken(h, D).into_iter().map(|(_, s, _)| s).collect();
    assert_eq!(states, want.pages, "pages");
    // The room's own list of pages agrees with the pool's records: owner and
    // generation of each.
    let pool = h.decode(D).unwrap().pool();
    for t in h.decode(D).unwrap().room_pages(room).unwrap_or_default() {
        let rec = pool.record(t.page).unwrap();
        assert_eq!((rec.owner, rec.gen), (Some(room), t.gen), "{t}");
    }
    h.invariants().unwrap();
}

fn deliver(kind: &'static str) -> impl FnOnce(&mut H) {
    move |h| assert_eq!(h.deliver_kind(kind, D).unwrap(), Delivered::Handled)
}

fn tick(h: &mut H) {
    h.fire(D, Timer::Compute).unwrap();
}

fn finished(h: &H) -> Vec<Status> {
    h.sends()
        .iter()
        .filter_map(|s| match s.msg {
            Carried::Msg(Msg::DecodeFinished { status, .. }) if s.from == D => Some(status),
            _ => None,
        })
        .collect()
}

fn transferring(n: usize) -> DecodePhase {
    Transferring {
        written: vec![false; n],
    }
}

const RESERVED: &[PageState] = &[Writing, Writing, Writing, Reserved];
const QUARANTINED: &[PageState] = &[PageState::Quarantined; 4];

// ---- DecodeStart -------------------------------------------------------------------

#[test]
fn start_admitted_reserves_pages_announces_them_and_arms_the_wait() {
    let mut h = harness();
    let room = submit(&mut h, 1);
    check(
        &mut h,
        room,
        deliver("DecodeStart"),
        Want {
            phase: Some(transferring(3)),
            events: &["Admitted", "PagesReserved", "PagesExpectWrite"],
            sends: &[("KvMeta", P)],
            timers: vec![Timer::WaitingForKv(room)],
            pages: RESERVED,
        },
    );
    let meta = h.find_kind("KvMeta", P).unwrap();
    assert!(matches!(
        &h.in_flight()[meta].msg,
        Carried::Msg(Msg::KvMeta { dst, prompt_len: 10, .. }) if dst.len() == 3
    ));
}

#[test]
fn start_over_the_admission_limit_is_rejected_without_pages() {
    let mut h = harness();
    handled(h.submit(1, prompt(30), NEW).unwrap());
    let room = h.room_of(1).unwrap();
    check(
        &mut h,
        room,
        deliver("DecodeStart"),
        Want {
            phase: None,
            events: &["Rejected", "Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::BAD_REQUEST]);
}

#[test]
fn start_without_free_pages_waits_in_prealloc_until_pages_come_back() {
    let mut h = harness();
    let first = decode_transferring(&mut h);
    handled(h.submit(2, prompt(20), NEW).unwrap());
    let second = h.room_of(2).unwrap();
    check(
        &mut h,
        second,
        deliver("DecodeStart"),
        Want {
            phase: Some(Prealloc),
            events: &["Admitted"],
            sends: &[],
            timers: vec![Timer::WaitingForKv(first)],
            pages: RESERVED,
        },
    );
    // The first room is aborted and quarantined; its drain ack frees its pages and
    // the second room gets them.
    handled(h.inject(R, D, Msg::Abort { room: first }).unwrap());
    check(
        &mut h,
        second,
        |h| handled(h.inject(P, D, Msg::DrainAck { room: first }).unwrap()),
        Want {
            phase: Some(transferring(5)),
            events: &["QuarantineReleased", "PagesReserved", "PagesExpectWrite"],
            sends: &[("KvMeta", P)],
            timers: vec![Timer::WaitingForKv(second)],
            pages: &[Writing, Writing, Writing, Writing, Writing, Reserved],
        },
    );
}

// ---- KvWrite -----------------------------------------------------------------------

#[test]
fn a_write_lands_marks_its_pages_written_and_completes_ok() {
    let mut h = harness();
    let room = sending(&mut h);
    check(
        &mut h,
        room,
        deliver("KvWrite"),
        Want {
            phase: Some(Transferring {
                written: vec![true, true, false],
            }),
            events: &["KvLanded"],
            sends: &[("WriteDone", P)],
            timers: vec![Timer::WaitingForKv(room)],
            pages: RESERVED,
        },
    );
    let done = h.find_kind("WriteDone", P).unwrap();
    assert!(matches!(
        h.in_flight()[done].msg,
        Carried::Msg(Msg::WriteDone { ok: true, .. })
    ));
    assert!(h
        .decode(D)
        .unwrap()
        .gpu()
        .page_tag(PageId(1))
        .unwrap()
        .is_some());
}

/// The first chunk write in flight to decode, with its destination replaced.
fn forged_write(h: &H, dst: Vec<PageTag>, kv_len: usize) -> KvWrite<SymbolicPage> {
    let i = h.find_kind("KvWrite", D).unwrap();
    match h.in_flight()[i].msg.clone() {
        Carried::Write(KvWrite { id, src, kv, .. }) => KvWrite {
            id: WriteId { chunk: 99, ..id },
            src,
            dst,
            kv: kv.into_iter().cycle().take(kv_len).collect(),
        },
        other => panic!("{other:?}"),
    }
}

fn refused_write(h: &mut H, room: RoomKey, msg: KvWrite<SymbolicPage>, why: &str) {
    let before = h.pages(D);
    check(
        h,
        room,
        |h| handled(h.inject(P, D, msg).unwrap()),
        Want {
            phase: Some(transferring(3)),
            events: &["KvRefused"],
            sends: &[("WriteDone", P)],
            timers: vec![Timer::WaitingForKv(room)],
            pages: RESERVED,
        },
    );
    assert_eq!(h.pages(D), before, "a refused write moves no page");
    assert!(
        h.decode(D)
            .unwrap()
            .gpu()
            .page_tag(PageId(1))
            .unwrap()
            .is_none(),
        "nothing of it was applied"
    );
    // The node's software counts what it refused: on one-sided RDMA the receiver's
    // NIC refuses (an address outside the registered memory) and no software runs.
    let d = h.decode(D).unwrap();
    let software = d.config().transport == kvsim_engine::world::KvTransport::TwoSided;
    assert_eq!(d.counters().writes_refused, u64::from(software));
    let reason = h.events().iter().rev().find_map(|(_, e)| match e {
        TraceEvent::KvRefused { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert!(reason.as_deref().unwrap_or("").contains(why), "{reason:?}");
    let done = h.find_kind("WriteDone", P).unwrap();
    assert!(matches!(
        h.in_flight()[done].msg,
        Carried::Msg(Msg::WriteDone { ok: false, .. })
    ));
}

#[test]
fn a_write_with_a_stale_tag_is_refused_whole() {
    let mut h = two_sided();
    let room = sending(&mut h);
    let stale = vec![
        PageTag {
            page: PageId(1),
            gen: Generation(1),
        },
        PageTag {
            page: PageId(2),
            gen: Generation(7),
        },
    ];
    let msg = forged_write(&h, stale, 2);
    refused_write(&mut h, room, msg, "stale generation");
}

#[test]
fn a_write_into_another_rooms_page_is_refused() {
    let mut h = two_sided();
    let room = sending(&mut h);
    // A second room owns pages 5 and 6 (generation 1) on decode.
    handled(h.submit(2, prompt(4), 1).unwrap());
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    let other = h.room_of(2).unwrap();
    let theirs = vec![PageTag {
        page: PageId(5),
        gen: Generation(1),
    }];
    assert_eq!(
        h.decode(D).unwrap().pool().record(PageId(5)).unwrap().owner,
        Some(other)
    );
    let msg = forged_write(&h, theirs, 1);
    let m = h.mark();
    handled(h.inject(P, D, msg).unwrap());
    assert_eq!(h.event_names_since(m), vec!["KvRefused"]);
    assert!(matches!(
        &h.events_since(m)[0].1,
        TraceEvent::KvRefused { reason, .. } if reason.contains("owned by")
    ));
    assert!(h
        .decode(D)
        .unwrap()
        .gpu()
        .page_tag(PageId(5))
        .unwrap()
        .is_none());
    assert_eq!(h.decode_phase(D, room), Some(transferring(3)));
}

/// The landing gate exists only where the receiver's software sees a write before it
/// lands: on two-sided (these refusal tests), not on one-sided RDMA.
fn two_sided() -> H {
    let mut c = cfg();
    c.transport = kvsim_engine::world::KvTransport::TwoSided;
    Harness::new(c).unwrap()
}

/// On one-sided (the default) the same write lands where it points, unchecked, and
/// stamps the tag its writer meant: the other room's page now carries the writer's
/// room use, which that room's read-time tag check refuses.
#[test]
fn a_one_sided_write_into_another_rooms_page_lands_with_its_writers_tag() {
    let mut h = harness();
    let room = sending(&mut h);
    handled(h.submit(2, prompt(4), 1).unwrap());
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    let theirs = vec![PageTag {
        page: PageId(5),
        gen: Generation(1),
    }];
    let msg = forged_write(&h, theirs, 1);
    let m = h.mark();
    handled(h.inject(P, D, msg).unwrap());
    assert_eq!(h.event_names_since(m), vec!["KvLanded"]);
    let tag = h
        .decode(D)
        .unwrap()
        .gpu()
        .page_tag(PageId(5))
        .unwrap()
        .unwrap();
    assert_eq!(tag.room, room, "the write stamps its own room use");
    assert_eq!(h.decode(D).unwrap().counters().writes_refused, 0);
}

#[test]
fn a_malformed_write_is_refused() {
    let mut h = harness();
    let room = sending(&mut h);
    let dst = vec![
        PageTag {
            page: PageId(1),
            gen: Generation(1),
        },
        PageTag {
            page: PageId(2),
            gen: Generation(1),
        },
    ];
    let msg = forged_write(&h, dst, 1);
    refused_write(&mut h, room, msg, "differ in length");
}

// ---- KvDone ------------------------------------------------------------------------

#[test]
fn a_verified_success_runs_the_request() {
    let mut h = harness();
    let room = inflight(&mut h);
    check(
        &mut h,
        room,
        deliver("KvDone"),
        Want {
            phase: Some(Running {
                step: 0,
                seq_len: 10,
            }),
            events: &[
                "TransferReported",
                "PagesReady",
                "TransferAccepted",
                "Running",
            ],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready, Reserved],
        },
    );
}

fn quarantining(h: &mut H, room: RoomKey, act: impl FnOnce(&mut H), first: &[&str]) {
    let events: Vec<&str> = first
        .iter()
        .copied()
        .chain(["Quarantined", "Responded"])
        .collect();
    check(
        h,
        room,
        act,
        Want {
            phase: Some(Quarantined { retries: 0 }),
            events: &events,
            sends: &[("DrainRequest", P), ("DecodeFinished", R)],
            timers: vec![Timer::DrainRetry(room, 0)],
            pages: QUARANTINED,
        },
    );
    assert_eq!(finished(h).last(), Some(&Status::INTERNAL));
}

#[test]
fn a_success_that_fails_verification_is_refused_and_quarantined() {
    let mut h = harness();
    let room = sending(&mut h);
    for _ in 0..2 {
        handled(h.deliver_kind("KvWrite", D).unwrap());
    }
    let lie = Msg::KvDone {
        room,
        outcome: TransferOutcome::Success {
            tokens: 9,
            pages: 3,
            checksum: 0,
        },
        epoch: 0,
    };
    quarantining(
        &mut h,
        room,
        |h| handled(h.inject(P, D, lie).unwrap()),
        &["TransferReported", "TransferRefused"],
    );
    assert_eq!(h.decode(D).unwrap().counters().transfers_failed, 1);
}

#[test]
fn a_reported_failure_fails_the_room_and_quarantines_its_pages() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    let failed = Msg::KvDone {
        room,
        outcome: TransferOutcome::Failed,
        epoch: 0,
    };
    quarantining(
        &mut h,
        room,
        |h| handled(h.inject(P, D, failed).unwrap()),
        &["TransferReported", "TransferFailed"],
    );
}

// ---- Compute -----------------------------------------------------------------------

#[test]
fn ticks_step_the_request_stream_tokens_and_finish_it() {
    let mut h = harness();
    let room = decode_running(&mut h);
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: Some(Running {
                step: 1,
                seq_len: 11,
            }),
            events: &["Attend", "KvWritten"],
            sends: &[("TokenOut", R)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready, Reserved],
        },
    );
    tick(&mut h);
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: None,
            events: &["Attend", "KvWritten", "PagesReleased", "Responded"],
            sends: &[("TokenOut", R), ("DecodeFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::OK]);
}

#[test]
fn a_step_over_pages_without_the_readers_tag_is_refused() {
    // Fail-open runs the request on pages nothing was written into.
    let cfg = EngineConfig {
        bugs: BugSet::NONE.with(Bug::FailOpenOnRecvError),
        ..cfg()
    };
    let mut h = Harness::new(cfg).unwrap();
    let room = decode_transferring(&mut h);
    let failed = Msg::KvDone {
        room,
        outcome: TransferOutcome::Failed,
        epoch: 0,
    };
    handled(h.inject(P, D, failed).unwrap());
    assert_eq!(
        h.decode_phase(D, room),
        Some(Running {
            step: 0,
            seq_len: 10
        })
    );
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: None,
            events: &["TagMismatch", "PagesReleased", "Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(h.decode(D).unwrap().counters().tag_mismatches, 1);
    assert_eq!(finished(&h), vec![Status::INTERNAL]);
}

// ---- WaitingForKv, Abort -----------------------------------------------------------

#[test]
fn the_waiting_timeout_fails_a_transfer_and_quarantines_its_pages() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    quarantining(
        &mut h,
        room,
        |h| h.fire(D, Timer::WaitingForKv(room)).unwrap(),
        &["TransferFailed"],
    );
}

#[test]
fn the_waiting_timeout_of_a_running_request_does_nothing() {
    let mut h = harness();
    let room = decode_running(&mut h);
    assert!(
        !h.timer_pending(D, Timer::WaitingForKv(room)),
        "cancelled on accept"
    );
}

fn abort(h: &mut H) {
    let room = h.room_of(1).unwrap();
    handled(h.inject(R, D, Msg::Abort { room }).unwrap());
}

#[test]
fn abort_while_transferring_quarantines() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    let events: &[&str] = &["AbortNoted", "Quarantined", "Responded"];
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: Some(Quarantined { retries: 0 }),
            events,
            sends: &[("DrainRequest", P), ("DecodeFinished", R)],
            timers: vec![Timer::DrainRetry(room, 0)],
            pages: QUARANTINED,
        },
    );
    assert_eq!(finished(&h), vec![Status::CLIENT_CLOSED]);
}

#[test]
fn abort_while_running_releases_at_once() {
    let mut h = harness();
    let room = decode_running(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: None,
            events: &["AbortNoted", "PagesReleased", "Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
}

#[test]
fn abort_while_in_prealloc_answers_without_pages() {
    let mut h = harness();
    decode_transferring(&mut h);
    handled(h.submit(2, prompt(20), NEW).unwrap());
    let second = h.room_of(2).unwrap();
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    let first = h.room_of(1).unwrap();
    check(
        &mut h,
        second,
        |h| handled(h.inject(R, D, Msg::Abort { room: second }).unwrap()),
        Want {
            phase: None,
            events: &["AbortNoted", "Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![Timer::WaitingForKv(first)],
            pages: RESERVED,
        },
    );
}

#[test]
fn abort_for_an_unknown_room_answers_again() {
    let mut h = harness();
    let room = submit(&mut h, 1);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: None,
            events: &["Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert!(h.decode(D).unwrap().is_retired(room));
}

// ---- DrainAck, DrainRetry ----------------------------------------------------------

#[test]
fn the_drain_ack_releases_the_quarantine_and_cancels_the_retry() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    abort(&mut h);
    check(
        &mut h,
        room,
        |h| handled(h.inject(P, D, Msg::DrainAck { room }).unwrap()),
        Want {
            phase: None,
            events: &["QuarantineReleased"],
            sends: &[],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(h.free_pages(D), 8);
}

#[test]
fn a_drain_ack_for_another_use_of_the_room_releases_nothing() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    abort(&mut h);
    let older = RoomKey {
        gen: Generation(room.gen.0 + 5),
        ..room
    };
    check(
        &mut h,
        room,
        |h| handled(h.inject(P, D, Msg::DrainAck { room: older }).unwrap()),
        Want {
            phase: Some(Quarantined { retries: 0 }),
            events: &[],
            sends: &[],
            timers: vec![Timer::DrainRetry(room, 0)],
            pages: QUARANTINED,
        },
    );
}

#[test]
fn drain_retries_ask_again_and_the_last_one_stops_the_node() {
    let mut cfg = cfg();
    cfg.timeouts.drain_retries = 2;
    let mut h = Harness::new(cfg).unwrap();
    let room = decode_transferring(&mut h);
    abort(&mut h);
    for retries in 1..=2 {
        check(
            &mut h,
            room,
            |h| h.fire(D, Timer::DrainRetry(room, retries - 1)).unwrap(),
            Want {
                phase: Some(Quarantined { retries }),
                events: &[],
                sends: &[("DrainRequest", P)],
                timers: vec![Timer::DrainRetry(room, retries)],
                pages: QUARANTINED,
            },
        );
    }
    check(
        &mut h,
        room,
        |h| h.fire(D, Timer::DrainRetry(room, 2)).unwrap(),
        Want {
            phase: Some(Quarantined { retries: 3 }),
            events: &["Fault"],
            sends: &[("DrainRequest", P)],
            timers: vec![Timer::DrainRetry(room, 3)],
            pages: QUARANTINED,
        },
    );
    let faults = h.faults();
    assert_eq!(
        faults,
        vec![(D, NodeFault::DrainAckMissing { room, retries: 2 })]
    );
    assert_eq!(faults[0].1.action(), FaultAction::Stop);
    assert!(h.decode(D).unwrap().fatal().is_some());
    // It keeps asking, once per retry, and never faults twice.
    check(
        &mut h,
        room,
        |h| h.fire(D, Timer::DrainRetry(room, 3)).unwrap(),
        Want {
            phase: Some(Quarantined { retries: 3 }),
            events: &[],
            sends: &[("DrainRequest", P)],
            timers: vec![Timer::DrainRetry(room, 3)],
            pages: QUARANTINED,
        },
    );
    // A stopped node takes no new request.
    handled(h.submit(2, prompt(2), 1).unwrap());
    let next = h.room_of(2).unwrap();
    check(
        &mut h,
        next,
        deliver("DecodeStart"),
        Want {
            phase: None,
            events: &["Rejected", "Responded"],
            sends: &[("DecodeFinished", R)],
            timers: vec![Timer::DrainRetry(room, 3)],
            pages: QUARANTINED,
        },
    );
    assert_eq!(finished(&h).last(), Some(&Status::UNAVAILABLE));
    // The ack, late as it is, still releases the pages.
    handled(h.inject(P, D, Msg::DrainAck { room }).unwrap());
    assert_eq!(h.free_pages(D), 8);
}

/// A timer wheel may deliver a drain-retry timer that already fired (or was
/// cancelled) again while the real one is pending. Such a stale copy is no retry: it
/// neither uses up the budget nor asks again; the real ones still count, and the last
/// real one still stops the node loudly.
#[test]
fn a_refired_drain_retry_uses_up_no_retry_and_the_real_ones_still_count() {
    let mut cfg = cfg();
    cfg.timeouts.drain_retries = 2;
    let mut h = Harness::new(cfg).unwrap();
    let room = decode_transferring(&mut h);
    abort(&mut h);
    let stale = |retries: u32| Want {
        phase: Some(Quarantined { retries }),
        events: &[],
        sends: &[],
        timers: vec![Timer::DrainRetry(room, retries)],
        pages: QUARANTINED,
    };
    for retries in 1..=2 {
        check(
            &mut h,
            room,
            |h| h.fire(D, Timer::DrainRetry(room, retries - 1)).unwrap(),
            Want {
                phase: Some(Quarantined { retries }),
                events: &[],
                sends: &[("DrainRequest", P)],
                timers: vec![Timer::DrainRetry(room, retries)],
                pages: QUARANTINED,
            },
        );
        // Every spent arming, delivered again (more than the budget's worth of
        // them), while the real retry is pending: nothing happens.
        for arming in 0..retries {
            for _ in 0..3 {
                let timer = Timer::DrainRetry(room, arming);
                check(
                    &mut h,
                    room,
                    |h| h.refire(D, timer).unwrap(),
                    stale(retries),
                );
            }
        }
        assert!(h.faults().is_empty(), "{:?}", h.faults());
        assert!(h.decode(D).unwrap().fatal().is_none());
    }
    // The last real retry still stops the node loudly.
    check(
        &mut h,
        room,
        |h| h.fire(D, Timer::DrainRetry(room, 2)).unwrap(),
        Want {
            phase: Some(Quarantined { retries: 3 }),
            events: &["Fault"],
            sends: &[("DrainRequest", P)],
            timers: vec![Timer::DrainRetry(room, 3)],
            pages: QUARANTINED,
        },
    );
    assert_eq!(
        h.faults(),
        vec![(D, NodeFault::DrainAckMissing { room, retries: 2 })]
    );
    // After the ack, any copy of the timer finds no quarantine and does nothing.
    handled(h.inject(P, D, Msg::DrainAck { room }).unwrap());
    assert_eq!(h.free_pages(D), 8);
    for arming in 0..=3 {
        let m = h.mark();
        h.refire(D, Timer::DrainRetry(room, arming)).unwrap();
        assert!(h.events_since(m).is_empty() && h.sends_since(m).is_empty());
        assert!(h.timers_of(D).is_empty());
    }
}

// ---- restart -----------------------------------------------------------------------

#[test]
fn a_restart_forgets_everything_and_hands_out_tags_of_the_new_epoch() {
    let mut h = harness();
    let room = decode_running(&mut h);
    assert_eq!(h.crash_restart(D).unwrap(), 1);
    assert_eq!(h.decode_phase(D, room), None);
    assert!(h.timers_of(D).is_empty());
    assert!(taken(&h, D).is_empty());
    // A new request after the first is answered (the router's timer aborts the first).
    h.fire(R, Timer::Request(room)).unwrap();
    h.settle(100).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::INTERNAL);
    handled(h.submit(2, prompt(LEN), NEW).unwrap());
    let next = h.room_of(2).unwrap();
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    let tags = h.decode(D).unwrap().room_pages(next).unwrap();
    assert!(tags.iter().all(|t| t.gen.epoch() == 1), "{tags:?}");
    h.settle(100).unwrap();
    assert_eq!(h.response(2).unwrap().status, Status::OK);
    h.invariants().unwrap();
}

#[test]
fn a_write_addressed_before_the_restart_fails_as_a_stale_registration() {
    let mut h = harness();
    let room = waiting(&mut h);
    h.crash_restart(D).unwrap();
    // Prefill still has the page list of the dead incarnation and sends into it.
    h.fire(P, Timer::Compute).unwrap();
    h.fire(P, Timer::Compute).unwrap();
    let w = h.find_kind("KvWrite", D).unwrap();
    let m = h.mark();
    assert_eq!(
        h.deliver(w).unwrap(),
        Delivered::Failed(WriteFailure::StaleRegistration)
    );
    assert!(h.events_since(m).is_empty(), "decode never saw it");
    let done = h.find_kind("WriteDone", P).unwrap();
    assert!(
        matches!(h.in_flight()[done].msg, Carried::Msg(Msg::WriteDone { ok: false, id }) if id.room == room)
    );
}

/// Zero-on-free blanks every page decode lets go of: after a request ran to its
/// answer, no page of decode's pool still holds a token of it. Without the defense
/// its KV stays in the freed pages (what a stale read would see).
#[test]
fn zero_on_free_blanks_every_page_decode_frees() {
    for zero in [false, true] {
        let mut c = cfg();
        c.defenses.zero_on_free = zero;
        let mut h = Harness::new(c).unwrap();
        handled(h.submit(1, prompt(LEN), NEW).unwrap());
        h.settle(10_000).unwrap();
        assert!(taken(&h, D).is_empty(), "decode still holds pages");
        let gpu = h.decode(D).unwrap().gpu();
        let holding = (1..=gpu.pages())
            .filter(|&p| {
                gpu.read_page(PageId(p))
                    .unwrap()
                    .tokens
                    .iter()
                    .any(|&t| t != 0)
            })
            .count();
        if zero {
            assert_eq!(holding, 0, "zero-on-free left KV in {holding} freed pages");
        } else {
            assert!(holding > 0, "the request's KV never reached decode's pages");
        }
    }
}

/// Finding (fixed): an abort seen after decode answered 500 (the transfer timed out)
/// was answered 499: two answers with different statuses. A repeat now repeats the
/// first.
#[test]
fn an_abort_after_the_answer_repeats_the_first_status() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    h.fire(D, Timer::WaitingForKv(room)).unwrap();
    for _ in 0..2 {
        handled(h.inject(R, D, Msg::Abort { room }).unwrap());
    }
    assert_eq!(finished(&h), vec![Status::INTERNAL; 3]);
}
