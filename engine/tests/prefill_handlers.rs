//! Every input the prefill node handles, one hand-stepped input at a time: the phase
//! it moves the room to, its pages, its pending timers, the messages it sends and the
//! events it traces.
//!
//! Not an end-to-end test (the harness smoke tests and the simulator do those) and
//! not a test of decode or the router, whose inputs are driven only as far as a
//! prefill input needs. Invariant checked: after every step the nodes' own
//! invariants hold.

mod common;
use common::*;
use kvsim_engine::harness::Delivered;
use kvsim_engine::ids::RoomKey;
use kvsim_engine::kv::PageState::{self, *};
use kvsim_engine::msg::{Carried, Msg, Status, TransferOutcome};
use kvsim_engine::prefill::PrefillPhase::{self, *};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::{Bug, BugSet, Timer};

/// What one prefill step must leave behind.
struct Want<'a> {
    phase: Option<PrefillPhase>,
    events: &'a [&'a str],
    sends: &'a [(&'a str, kvsim_engine::NodeId)],
    timers: Vec<Timer>,
    /// States of prefill's pages that are not free, in page order.
    pages: &'a [PageState],
}

fn check(h: &mut H, room: RoomKey, act: impl FnOnce(&mut H), want: Want) {
    let m = h.mark();
    act(h);
    assert_eq!(h.prefill_phase(P, room), want.phase, "phase");
    assert_eq!(h.event_names_since(m), want.events, "events");
    assert_eq!(sent(h, m), want.sends, "sends");
    assert_eq!(h.timers_of(P), want.timers, "timers");
    let states: Vec<PageState> = taken(h, P).into_iter().map(|(_, s, _)| s).collect();
    assert_eq!(states, want.pages, "pages");
    // Every page still owned is this room use's, at its first generation.
    for (page, rec) in h.pages(P) {
        if rec.state.is_owned() {
            assert_eq!(rec.owner, Some(room), "{page}");
            assert_eq!(rec.gen, kvsim_engine::Generation(1), "{page}");
        }
    }
    h.invariants().unwrap();
}

fn deliver(kind: &'static str) -> impl FnOnce(&mut H) {
    move |h| assert_eq!(h.deliver_kind(kind, P).unwrap(), Delivered::Handled)
}

fn tick(h: &mut H) {
    h.fire(P, Timer::Compute).unwrap();
}

fn finished(h: &H) -> Vec<Status> {
    h.sends()
        .iter()
        .filter_map(|s| match s.msg {
            Carried::Msg(Msg::PrefillFinished { status, .. }) if s.from == P => Some(status),
            _ => None,
        })
        .collect()
}

// ---- PrefillStart ------------------------------------------------------------------

#[test]
fn start_admitted_bootstraps_and_arms_the_bootstrap_timer() {
    let mut h = harness();
    let room = submit(&mut h, 1);
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: Some(Bootstrapping),
            events: &["Admitted"],
            sends: &[],
            timers: vec![Timer::Bootstrap(room)],
            pages: &[],
        },
    );
}

fn start_with(cfg: kvsim_engine::EngineConfig, len: u32) -> (H, RoomKey) {
    let mut h = kvsim_engine::harness::Harness::new(cfg).unwrap();
    handled(h.submit(1, prompt(len), NEW).unwrap());
    let room = h.room_of(1).unwrap();
    (h, room)
}

#[test]
fn start_over_the_admission_limit_is_rejected_before_any_resource() {
    let (mut h, room) = start_with(cfg(), 33);
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: None,
            events: &["Rejected", "Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::BAD_REQUEST]);
    assert!(h.prefill(P).unwrap().is_retired(room));
}

#[test]
fn start_beyond_the_queue_is_refused_unavailable() {
    let mut h = harness();
    for req in 1..=5 {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
    }
    for _ in 0..4 {
        handled(h.deliver_kind("PrefillStart", P).unwrap());
    }
    let room = h.room_of(5).unwrap();
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: None,
            events: &["Rejected", "Responded"],
            sends: &[("PrefillFinished", R)],
            timers: (1..=4)
                .map(|r| Timer::Bootstrap(h_room(r)))
                .collect::<Vec<_>>(),
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::UNAVAILABLE]);
}

/// The room the router hands request `n` of a fresh harness (LIFO from room 1, first
/// generation).
fn h_room(n: u32) -> RoomKey {
    RoomKey::new(n, 1)
}

#[test]
fn start_over_the_limit_under_the_legacy_gate_stays_live_as_a_placeholder() {
    let cfg = kvsim_engine::EngineConfig {
        bugs: BugSet::NONE.with(Bug::GateChecksFinishedOnly),
        ..cfg()
    };
    let (mut h, room) = start_with(cfg, 33);
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: Some(Bootstrapping),
            events: &["RejectedLegacy", "Admitted"],
            sends: &[],
            timers: vec![Timer::Bootstrap(room)],
            pages: &[],
        },
    );
    let admitted = h.events().iter().find_map(|(_, e)| match e {
        TraceEvent::Admitted { prompt_len, .. } => Some(*prompt_len),
        _ => None,
    });
    assert_eq!(admitted, Some(1), "the prompt became a 1-token placeholder");
}

#[test]
fn start_over_the_limit_with_auto_truncate_is_cut_to_the_limit() {
    let cfg = kvsim_engine::EngineConfig {
        allow_auto_truncate: true,
        ..cfg()
    };
    let (mut h, room) = start_with(cfg, 33);
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: Some(Bootstrapping),
            events: &["Truncated", "Admitted"],
            sends: &[],
            timers: vec![Timer::Bootstrap(room)],
            pages: &[],
        },
    );
    assert!(h.events().iter().any(|(_, e)| matches!(
        e,
        TraceEvent::Truncated {
            from: 33,
            to: 32,
            ..
        }
    )));
}

// ---- KvMeta ------------------------------------------------------------------------

#[test]
fn page_list_moves_a_bootstrapping_room_to_waiting_and_kicks_the_scheduler() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    check(
        &mut h,
        room,
        deliver("KvMeta"),
        Want {
            phase: Some(Waiting),
            events: &[],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
}

#[test]
fn page_list_before_the_start_is_kept_and_used_when_the_start_arrives() {
    let mut h = harness();
    let room = decode_transferring(&mut h);
    check(
        &mut h,
        room,
        deliver("KvMeta"),
        Want {
            phase: None,
            events: &[],
            sends: &[],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(h.prefill(P).unwrap().early_meta_from(room), vec![D]);
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: Some(Waiting),
            events: &["Admitted"],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
    assert_eq!(
        h.prefill(P).unwrap().early_meta_from(room),
        Vec::<kvsim_engine::NodeId>::new()
    );
}

#[test]
fn a_second_page_list_for_a_waiting_room_changes_nothing() {
    let mut h = harness();
    let room = waiting(&mut h);
    let meta = h
        .sends()
        .iter()
        .find(|s| s.msg.kind() == "KvMeta")
        .unwrap()
        .msg
        .clone();
    check(
        &mut h,
        room,
        |h| handled(h.inject(D, P, meta).unwrap()),
        Want {
            phase: Some(Waiting),
            events: &[],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
}

// ---- Compute -----------------------------------------------------------------------

#[test]
fn tick_admits_a_waiting_room_into_the_forward_batch() {
    let mut h = harness();
    let room = waiting(&mut h);
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: Some(Forward {
                pages: h_pages(&[1, 2, 3]),
            }),
            events: &["PagesReserved", "Running"],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Reserved, Reserved, Reserved],
        },
    );
}

/// Tags of freshly allocated pages of a new node (generation 1 each).
fn h_pages(pages: &[u32]) -> Vec<kvsim_engine::PageTag> {
    pages
        .iter()
        .map(|&p| kvsim_engine::PageTag {
            page: kvsim_engine::PageId(p),
            gen: kvsim_engine::Generation(1),
        })
        .collect()
}

#[test]
fn tick_finishes_the_forward_and_sends_chunks_up_to_the_in_flight_limit() {
    let mut h = harness();
    let room = forward(&mut h);
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: Some(Sending {
                next_page: 3,
                in_flight: 2,
            }),
            events: &[
                "KvWritten",
                "PagesReady",
                "PagesHeld",
                "KvSent",
                "PagesHeld",
                "KvSent",
            ],
            sends: &[("KvWrite", D), ("KvWrite", D)],
            timers: vec![],
            pages: &[Ready, Ready, Ready],
        },
    );
    assert!(h.pages(P).iter().take(3).all(|(_, r)| r.holders == 1));
    assert_eq!(h.prefill(P).unwrap().writes_in_flight(room), 2);
}

#[test]
fn tick_polls_a_concluded_transfer_releases_the_source_and_answers_ok() {
    let mut h = harness();
    let room = inflight(&mut h);
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: None,
            events: &["PagesReleased", "Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::OK]);
    assert_eq!(h.free_pages(P), 8);
}

// ---- WriteDone ---------------------------------------------------------------------

#[test]
fn completions_release_holds_and_the_last_one_concludes_success() {
    let mut h = harness();
    let room = sending(&mut h);
    for _ in 0..2 {
        handled(h.deliver_kind("KvWrite", D).unwrap());
    }
    check(
        &mut h,
        room,
        deliver("WriteDone"),
        Want {
            phase: Some(Sending {
                next_page: 3,
                in_flight: 1,
            }),
            events: &["WriteCompleted", "PagesUnheld"],
            sends: &[],
            timers: vec![],
            pages: &[Ready, Ready, Ready],
        },
    );
    check(
        &mut h,
        room,
        deliver("WriteDone"),
        Want {
            phase: Some(Inflight { success: true }),
            events: &["WriteCompleted", "PagesUnheld"],
            sends: &[("KvDone", D)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    assert!(h.pages(P).iter().all(|(_, r)| r.holders == 0));
}

#[test]
fn a_failed_completion_fails_the_room_and_tells_decode() {
    let mut h = harness();
    let room = sending(&mut h);
    let w = h.find_kind("KvWrite", D).unwrap();
    h.fail_write(w).unwrap();
    check(
        &mut h,
        room,
        deliver("WriteDone"),
        Want {
            phase: Some(Inflight { success: false }),
            events: &["WriteCompleted", "PagesUnheld"],
            sends: &[("KvDone", D)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    let done = h.find_kind("KvDone", D).unwrap();
    assert!(matches!(
        h.in_flight()[done].msg,
        Carried::Msg(Msg::KvDone {
            outcome: TransferOutcome::Failed,
            ..
        })
    ));
    // The other write is still in flight and still holds its page: the poll leaves
    // that page Draining, never Free.
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: None,
            events: &["PagesReleased", "Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[Draining],
        },
    );
    assert_eq!(finished(&h), vec![Status::INTERNAL]);
}

// ---- Abort -------------------------------------------------------------------------

fn abort(h: &mut H) {
    let room = h.room_of(1).unwrap();
    handled(h.inject(R, P, Msg::Abort { room }).unwrap());
}

#[test]
fn abort_while_bootstrapping_answers_at_once() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: None,
            events: &["AbortNoted", "Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::CLIENT_CLOSED]);
}

#[test]
fn abort_while_waiting_tells_decode_and_answers() {
    let mut h = harness();
    let room = waiting(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: None,
            events: &["AbortNoted", "Responded"],
            sends: &[("KvDone", D), ("PrefillFinished", R)],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
}

#[test]
fn abort_during_the_forward_takes_effect_at_the_next_result() {
    let mut h = harness();
    let room = forward(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: Some(Forward {
                pages: h_pages(&[1, 2, 3]),
            }),
            events: &["AbortNoted"],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Reserved, Reserved, Reserved],
        },
    );
    check(
        &mut h,
        room,
        tick,
        Want {
            phase: None,
            events: &["PagesReleased", "Responded"],
            sends: &[("KvDone", D), ("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::CLIENT_CLOSED]);
    assert_eq!(
        h.count_kind("KvWrite"),
        0,
        "an aborted forward sends nothing"
    );
}

#[test]
fn abort_while_sending_concludes_failed_and_stops_sending() {
    let mut h = harness();
    let room = sending(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: Some(Inflight { success: false }),
            events: &["AbortNoted"],
            sends: &[("KvDone", D)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
}

#[test]
fn abort_after_the_transfer_concluded_is_the_answer_of_the_poll() {
    let mut h = harness();
    let room = inflight(&mut h);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: Some(Inflight { success: true }),
            events: &["AbortNoted"],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    tick(&mut h);
    assert_eq!(finished(&h), vec![Status::CLIENT_CLOSED]);
}

#[test]
fn abort_for_an_unknown_room_answers_and_retires_it() {
    let mut h = harness();
    let room = submit(&mut h, 1);
    check(
        &mut h,
        room,
        abort,
        Want {
            phase: None,
            events: &["Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    // The start message arriving late is now harmless.
    check(
        &mut h,
        room,
        deliver("PrefillStart"),
        Want {
            phase: None,
            events: &[],
            sends: &[],
            timers: vec![],
            pages: &[],
        },
    );
}

// ---- DrainRequest ------------------------------------------------------------------

fn drain(h: &mut H) {
    let room = h.room_of(1).unwrap();
    handled(h.inject(D, P, Msg::DrainRequest { room }).unwrap());
}

#[test]
fn drain_request_while_bootstrapping_fails_the_room_and_acks_at_once() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    check(
        &mut h,
        room,
        drain,
        Want {
            phase: None,
            events: &["AbortNoted", "Responded", "DrainAcked"],
            sends: &[("PrefillFinished", R), ("DrainAck", D)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::INTERNAL]);
}

#[test]
fn drain_request_while_waiting_fails_the_room_and_acks_at_once() {
    let mut h = harness();
    let room = waiting(&mut h);
    check(
        &mut h,
        room,
        drain,
        Want {
            phase: None,
            events: &["AbortNoted", "Responded", "DrainAcked"],
            sends: &[("KvDone", D), ("PrefillFinished", R), ("DrainAck", D)],
            timers: vec![Timer::Compute],
            pages: &[],
        },
    );
}

#[test]
fn drain_request_during_the_forward_acks_at_once_since_nothing_was_written() {
    let mut h = harness();
    let room = forward(&mut h);
    check(
        &mut h,
        room,
        drain,
        Want {
            phase: Some(Forward {
                pages: h_pages(&[1, 2, 3]),
            }),
            events: &["AbortNoted", "DrainAcked"],
            sends: &[("DrainAck", D)],
            timers: vec![Timer::Compute],
            pages: &[Reserved, Reserved, Reserved],
        },
    );
    tick(&mut h);
    assert_eq!(h.count_kind("KvWrite"), 0);
    assert_eq!(finished(&h), vec![Status::INTERNAL]);
}

#[test]
fn drain_request_while_sending_acks_only_after_the_last_completion() {
    let mut h = harness();
    let room = sending(&mut h);
    check(
        &mut h,
        room,
        drain,
        Want {
            phase: Some(Inflight { success: false }),
            events: &[],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    assert_eq!(h.prefill(P).unwrap().drain_owed_to(room), Some(D));
    handled(h.deliver_kind("KvWrite", D).unwrap());
    check(
        &mut h,
        room,
        deliver("WriteDone"),
        Want {
            phase: Some(Inflight { success: false }),
            events: &["WriteCompleted", "PagesUnheld"],
            sends: &[],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    handled(h.deliver_kind("KvWrite", D).unwrap());
    check(
        &mut h,
        room,
        deliver("WriteDone"),
        Want {
            phase: Some(Inflight { success: false }),
            events: &["WriteCompleted", "PagesUnheld", "DrainAcked"],
            sends: &[("DrainAck", D)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
    assert_eq!(h.prefill(P).unwrap().drain_owed_to(room), None);
}

#[test]
fn drain_request_after_the_transfer_concluded_acks_at_once() {
    let mut h = harness();
    let room = inflight(&mut h);
    check(
        &mut h,
        room,
        drain,
        Want {
            phase: Some(Inflight { success: true }),
            events: &["DrainAcked"],
            sends: &[("DrainAck", D)],
            timers: vec![Timer::Compute],
            pages: &[Ready, Ready, Ready],
        },
    );
}

// ---- Bootstrap timer ---------------------------------------------------------------

#[test]
fn bootstrap_timeout_fails_a_room_that_never_got_its_page_list() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    check(
        &mut h,
        room,
        |h| h.fire(P, Timer::Bootstrap(room)).unwrap(),
        Want {
            phase: None,
            events: &["Responded"],
            sends: &[("PrefillFinished", R)],
            timers: vec![],
            pages: &[],
        },
    );
    assert_eq!(finished(&h), vec![Status::INTERNAL]);
}

#[test]
fn the_bootstrap_timer_is_cancelled_once_the_page_list_came() {
    let mut h = harness();
    let room = waiting(&mut h);
    assert!(!h.timer_pending(P, Timer::Bootstrap(room)));
    assert!(h.fire(P, Timer::Bootstrap(room)).is_err());
}

/// Finding (fixed): an abort seen after prefill answered (its answer lost, the router
/// asking again) was answered 499, a second answer with another status than the first
/// (400). A repeated answer now repeats the first.
#[test]
fn an_abort_after_the_answer_repeats_the_first_status() {
    let (mut h, room) = start_with(cfg(), 33);
    deliver("PrefillStart")(&mut h);
    for _ in 0..2 {
        handled(h.inject(R, P, Msg::Abort { room }).unwrap());
    }
    assert_eq!(finished(&h), vec![Status::BAD_REQUEST; 3]);
}

// ---- A page list for a room prefill already failed (issue 37, class 6) ------------
//
// Behind SGLang's router nobody cancels the other half of a failed request: decode,
// which reserved pages and sent its page list, waits for the transfer. Before the fix
// prefill dropped that page list silently, so decode held its pages until its own
// waiting timeout (and the router's retry waited as long). Now prefill tells the decode
// its start named, once, that the transfer failed.

/// The `KvDone` outcomes prefill sent to decode since `m`, with their epochs.
fn kv_done_since(h: &H, m: kvsim_engine::harness::Mark) -> Vec<(TransferOutcome, u32)> {
    h.sends_since(m)
        .iter()
        .filter_map(|s| match &s.msg {
            Carried::Msg(Msg::KvDone { outcome, epoch, .. }) if s.from == P && s.to == D => {
                Some((outcome.clone(), *epoch))
            }
            _ => None,
        })
        .collect()
}

/// Requests 1-5, prefill's queue (4) full with the first four: request 5's start will
/// be refused at intake. Returns request 5's room; its starts are still in flight.
fn fifth_beyond_the_queue(h: &mut H) -> RoomKey {
    for req in 1..=5 {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
    }
    for _ in 0..4 {
        handled(h.deliver_kind("PrefillStart", P).unwrap());
    }
    h.room_of(5).unwrap()
}

/// Request 5 refused at prefill's intake after decode reserved its pages and sent its
/// page list (still in flight). Returns the room.
fn rejected_with_page_list_in_flight(h: &mut H) -> RoomKey {
    let room = fifth_beyond_the_queue(h);
    handled(h.deliver_for("DecodeStart", D, room).unwrap());
    handled(h.deliver_for("PrefillStart", P, room).unwrap());
    assert_eq!(finished(h), vec![Status::UNAVAILABLE]);
    room
}

#[test]
fn a_page_list_for_a_room_rejected_at_intake_is_answered_failed_once() {
    let mut h = harness();
    let room = rejected_with_page_list_in_flight(&mut h);
    assert_eq!(h.prefill(P).unwrap().owes_failure_to(room), Some(D));
    h.duplicate(h.find_kind("KvMeta", P).unwrap()).unwrap();
    let m = h.mark();
    handled(h.deliver_kind("KvMeta", P).unwrap());
    assert_eq!(kv_done_since(&h, m), vec![(TransferOutcome::Failed, 0)]);
    assert_eq!(h.prefill(P).unwrap().owes_failure_to(room), None);
    // A second copy of the list is told nothing more.
    let m = h.mark();
    handled(h.deliver_kind("KvMeta", P).unwrap());
    assert_eq!(kv_done_since(&h, m), vec![]);
    h.invariants().unwrap();
}

#[test]
fn a_page_list_kept_early_is_answered_failed_when_the_start_is_rejected() {
    let mut h = harness();
    let room = fifth_beyond_the_queue(&mut h);
    handled(h.deliver_for("DecodeStart", D, room).unwrap());
    handled(h.deliver_for("KvMeta", P, room).unwrap());
    assert_eq!(h.prefill(P).unwrap().early_meta_from(room), vec![D]);
    let m = h.mark();
    handled(h.deliver_for("PrefillStart", P, room).unwrap());
    assert_eq!(kv_done_since(&h, m), vec![(TransferOutcome::Failed, 0)]);
    assert_eq!(h.prefill(P).unwrap().owes_failure_to(room), None);
    assert!(h.prefill(P).unwrap().early_meta_from(room).is_empty());
}

#[test]
fn a_page_list_for_a_failed_room_from_another_node_is_refused_and_decode_still_told() {
    let mut h = harness();
    let room = rejected_with_page_list_in_flight(&mut h);
    let forged = Msg::KvMeta {
        room,
        dst: vec![],
        prompt_len: u64::from(LEN),
    };
    let m = h.mark();
    handled(h.inject(R, P, forged).unwrap());
    assert_eq!(h.peer_refused(P), 1);
    assert_eq!(kv_done_since(&h, m), vec![]);
    assert_eq!(h.prefill(P).unwrap().owes_failure_to(room), Some(D));
    handled(h.deliver_kind("KvMeta", P).unwrap());
    assert_eq!(kv_done_since(&h, m), vec![(TransferOutcome::Failed, 0)]);
}

#[test]
fn a_page_list_after_the_bootstrap_timeout_is_answered_failed() {
    let mut h = harness();
    let room = bootstrapping(&mut h);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    h.fire(P, Timer::Bootstrap(room)).unwrap();
    assert_eq!(h.prefill(P).unwrap().owes_failure_to(room), Some(D));
    let m = h.mark();
    handled(h.deliver_kind("KvMeta", P).unwrap());
    assert_eq!(kv_done_since(&h, m), vec![(TransferOutcome::Failed, 0)]);
}
