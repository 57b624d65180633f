//! vLLM's NIXL connector (pull) under `vllm-router`, hand-stepped: the vLLM prefill
//! runs first and keeps its pages under a lease; decode starts only with prefill's
//! `kv_transfer_params`, reads the pages with one-sided RDMA READ (served by the
//! source's NIC, not its software) and NIXL's notification frees them; a lease that
//! expires first frees them under the READ, which then reads whatever the pages hold.
//!
//! Invariant checked: every request gets one answer; pools end full where the protocol
//! ends; the router never sends decode anything before prefill's 200, never retries,
//! never tells prefill of decode's answer.

mod common;
use common::*;
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::harness::Harness;
use kvsim_engine::msg::{Carried, Msg, Status};
use kvsim_engine::prefill_vllm::VllmPhase;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::{EngineConfig, Node, Timer};

fn vllm() -> EngineConfig {
    EngineConfig {
        router: RouterPolicy::VllmRouter,
        ..cfg()
    }
}

fn h() -> H {
    Harness::new(vllm()).unwrap()
}

/// The expected reply: echo attention over the prompt (the token at each position).
fn sends_of(h: &H, kind: &str) -> usize {
    h.sends().iter().filter(|s| s.msg.kind() == kind).count()
}

fn lease_of(h: &H, room: kvsim_engine::ids::RoomKey) -> Option<VllmPhase> {
    match h.node(P)? {
        Node::VllmPrefill(p) => p.room_phase(room),
        _ => None,
    }
}

#[test]
fn a_request_runs_prefill_first_then_decode_reads_and_notifies() {
    let mut h = h();
    let room = submit(&mut h, 1);
    assert_eq!(sends_of(&h, "DecodeStart") + sends_of(&h, "PullStart"), 0);
    h.settle(500).unwrap();
    let r = h.response(1).expect("answered");
    assert_eq!(r.status, Status::OK, "{r:?}");
    assert_eq!(r.tokens.len(), NEW as usize);
    // Sequential: the decode start went out after prefill's 200, with its params.
    assert_eq!(sends_of(&h, "DecodeStart"), 0);
    assert_eq!(sends_of(&h, "PullStart"), 1);
    assert_eq!(sends_of(&h, "KvRead"), 1);
    assert_eq!(sends_of(&h, "ReadNotify"), 1);
    assert_eq!(sends_of(&h, "Abort"), 0);
    let names: Vec<&str> = h.events().iter().map(|(_, e)| e.name()).collect();
    let served = names.iter().position(|n| *n == "KvReadServed").unwrap();
    let ended = names.iter().position(|n| *n == "LeaseEnded").unwrap();
    assert!(served < ended, "the notification follows the read");
    assert!(h
        .events()
        .iter()
        .any(|(_, e)| matches!(e, TraceEvent::LeaseEnded { expired: false, .. })));
    assert_eq!(lease_of(&h, room), None);
    for n in [P, D] {
        let pool = h.node(n).and_then(|n| n.pool()).unwrap();
        assert_eq!(h.free_pages(n), pool.capacity(), "{n} is whole again");
    }
    h.invariants().unwrap();
}

#[test]
fn the_read_is_served_by_the_sources_nic_and_the_completion_is_the_readers() {
    let mut h = h();
    submit(&mut h, 1);
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    h.settle(200).unwrap_or_default();
    // The READ's completion went to decode itself, the notification to prefill.
    let done = h
        .sends()
        .iter()
        .find(|s| matches!(s.msg, Carried::Msg(Msg::WriteDone { .. })))
        .expect("a completion");
    assert_eq!((done.from, done.to), (D, D));
    let notify = h
        .sends()
        .iter()
        .find(|s| s.msg.kind() == "ReadNotify")
        .unwrap();
    assert_eq!((notify.from, notify.to), (D, P));
    // No event of prefill's software names the read: only its NIC's KvReadServed.
    let served: Vec<_> = h
        .events()
        .iter()
        .filter(|(_, e)| matches!(e, TraceEvent::KvReadServed { .. }))
        .collect();
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].0, P);
}

#[test]
fn a_prefill_failure_answers_500_and_decode_is_never_contacted() {
    let mut h = h();
    // Longer than the pool admits: prefill refuses it with 400, a 4xx passes through.
    handled(h.submit(1, prompt(40), NEW).unwrap());
    h.settle(100).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::BAD_REQUEST);
    assert_eq!(sends_of(&h, "PullStart"), 0);
    // A prefill 5xx is the router's own 500.
    let mut h = h_with_room();
    let room = h.room_of(1).unwrap();
    handled(
        h.inject(
            P,
            R,
            Msg::PrefillFinished {
                room,
                status: Status::UNAVAILABLE,
                why: None,
            },
        )
        .unwrap(),
    );
    assert_eq!(h.response(1).unwrap().status, Status::INTERNAL);
    assert_eq!(sends_of(&h, "PullStart"), 0);
    assert_eq!(h.router().unwrap().live_rooms(), 0);
}

fn h_with_room() -> H {
    let mut h = h();
    submit(&mut h, 1);
    h
}

#[test]
fn a_decode_failure_passes_through_and_prefill_is_never_told() {
    let mut h = h();
    let room = submit(&mut h, 1);
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    h.fire(P, Timer::Compute).unwrap();
    handled(h.deliver_kind("KvParams", R).unwrap());
    handled(h.deliver_kind("PrefillFinished", R).unwrap());
    let m = h.mark();
    handled(
        h.inject(
            D,
            R,
            Msg::DecodeFinished {
                room,
                status: Status::UNAVAILABLE,
                why: None,
            },
        )
        .unwrap(),
    );
    assert_eq!(h.response(1).unwrap().status, Status::UNAVAILABLE);
    assert!(
        h.sends_since(m).iter().all(|s| s.to != P),
        "prefill is never told"
    );
}

#[test]
fn a_client_disconnect_closes_only_the_open_upstream() {
    let mut h = h();
    submit(&mut h, 1);
    let m = h.mark();
    handled(h.cancel(1).unwrap());
    let aborts: Vec<_> = h
        .sends_since(m)
        .iter()
        .filter(|s| s.msg.kind() == "Abort")
        .map(|s| s.to)
        .collect();
    assert_eq!(aborts, vec![P], "decode was never started");
}

#[test]
fn a_heartbeat_renews_the_lease_and_its_expiry_frees_the_pages_under_the_read() {
    let mut h = h();
    let room = submit(&mut h, 1);
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    h.fire(P, Timer::Compute).unwrap();
    assert!(matches!(lease_of(&h, room), Some(VllmPhase::Leased { .. })));
    assert!(h.timer_pending(P, Timer::Lease(room)));
    handled(h.deliver_kind("KvParams", R).unwrap());
    handled(h.deliver_kind("PrefillFinished", R).unwrap());
    handled(h.deliver_kind("PullStart", D).unwrap());
    // Decode reserved its pages and posted its READ; it heartbeats meanwhile.
    h.fire(D, Timer::Heartbeat(room)).unwrap();
    handled(h.deliver_kind("Heartbeat", P).unwrap());
    assert!(h.timer_pending(P, Timer::Lease(room)));
    // The lease runs out before the READ arrives: the pages are freed under it.
    h.fire(P, Timer::Lease(room)).unwrap();
    assert_eq!(lease_of(&h, room), None);
    assert!(h
        .events()
        .iter()
        .any(|(_, e)| matches!(e, TraceEvent::LeaseEnded { expired: true, .. })));
    // The NIC serves it anyway: a READ reads what the pages hold now.
    handled(h.deliver_kind("KvRead", P).unwrap());
    assert!(h
        .events()
        .iter()
        .any(|(n, e)| *n == P && matches!(e, TraceEvent::KvReadServed { .. })));
    h.settle(500).unwrap();
    // The reply is 200 all the same (aws-samples/aws-do-eks#84): only the oracle can
    // tell (S2 at the read, S3 where decode attends over what it read).
    assert_eq!(h.response(1).unwrap().status, Status::OK);
}
