//! The engine's reason for an error travels with its status: from the node that
//! refused (`PrefillFinished`/`DecodeFinished`'s `why`) through the router's
//! `Response` to the client, in the words the refusing node traced; a repeated answer
//! repeats the first one's reason; the router's own refusals name theirs.
//!
//! Each test walks the default harness one input at a time (the walk order is the
//! test's, so which half refuses first is fixed).

mod common;
use common::*;
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::harness::Harness;
use kvsim_engine::msg::{Carried, Msg, Status, Why};
use kvsim_engine::trace::{Side, TraceEvent};

/// The reason the node `node` traced in its `Rejected` event.
fn rejected_reason(h: &H, node: kvsim_engine::ids::NodeId) -> String {
    h.events()
        .iter()
        .find_map(|(n, e)| match e {
            TraceEvent::Rejected { reason, .. } if *n == node => Some(reason.clone()),
            _ => None,
        })
        .expect("the node traced its refusal")
}

/// The `why` of the last answer `node` sent the router.
fn last_why(h: &H, node: kvsim_engine::ids::NodeId) -> Option<Why> {
    h.sends()
        .iter()
        .rev()
        .find_map(|s| match (&s.msg, s.from == node) {
            (
                Carried::Msg(Msg::PrefillFinished { why, .. } | Msg::DecodeFinished { why, .. }),
                true,
            ) => Some(*why),
            _ => None,
        })
        .expect("the node answered")
}

#[test]
fn prefills_refusal_reaches_the_client_in_its_own_words() {
    let mut h = harness();
    handled(h.submit(1, prompt(33), NEW).unwrap());
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    handled(h.deliver_kind("PrefillFinished", R).unwrap());
    let r = h.response(1).expect("answered").clone();
    assert_eq!(r.status, Status::BAD_REQUEST);
    let why = Why::PromptTooLong {
        tokens: 33,
        limit: 32,
    };
    assert_eq!(r.why, Some(why));
    assert_eq!(why.to_string(), rejected_reason(&h, P), "the traced words");
    h.settle(1000).unwrap();
    h.invariants().unwrap();
}

#[test]
fn decodes_refusal_reaches_the_client_in_its_own_words() {
    let mut h = harness();
    handled(h.submit(1, prompt(30), NEW).unwrap());
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    handled(h.deliver_kind("DecodeFinished", R).unwrap());
    let r = h.response(1).expect("answered").clone();
    assert_eq!(r.status, Status::BAD_REQUEST);
    let why = Why::ReplyTooLong {
        tokens: 30,
        new_tokens: NEW,
        limit: 32,
    };
    assert_eq!(r.why, Some(why));
    assert_eq!(why.to_string(), rejected_reason(&h, D));
}

#[test]
fn a_repeated_answer_repeats_the_first_reason() {
    let mut h = harness();
    handled(h.submit(1, prompt(30), NEW).unwrap());
    let room = h.room_of(1).unwrap();
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    let first = last_why(&h, D);
    assert!(matches!(first, Some(Why::ReplyTooLong { .. })), "{first:?}");
    // An abort for the answered use (a lost answer, a router that asks again): the
    // node answers again with its first status and its first reason.
    handled(h.inject(R, D, Msg::Abort { room }).unwrap());
    assert_eq!(last_why(&h, D), first);
    let repeats = h
        .sends()
        .iter()
        .filter(|s| matches!(s.msg, Carried::Msg(Msg::DecodeFinished { status, .. }) if status == Status::BAD_REQUEST))
        .count();
    assert_eq!(repeats, 2, "the same answer twice");
}

#[test]
fn a_full_queue_is_named_with_its_half() {
    let mut h = harness();
    for req in 1..=5 {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
    }
    for _ in 0..5 {
        handled(h.deliver_kind("PrefillStart", P).unwrap());
    }
    assert_eq!(
        last_why(&h, P),
        Some(Why::QueueFull {
            side: Side::Prefill
        })
    );
    assert_eq!(rejected_reason(&h, P), "prefill queue full");
}

#[test]
fn the_routers_own_refusals_name_their_reason() {
    let mut h = harness();
    // Eight rooms: the ninth request finds the table full.
    for req in 1..=9 {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
    }
    let r = h.response(9).expect("answered");
    assert_eq!((r.status, r.why), (Status::UNAVAILABLE, Some(Why::NoRoom)));
    handled(h.submit(10, prompt(LEN), 0).unwrap());
    let r = h.response(10).expect("answered");
    assert_eq!(
        (r.status, r.why),
        (
            Status::BAD_REQUEST,
            Some(Why::InvalidRequest {
                max_new_tokens_limit: 8
            })
        )
    );
    // A request the engine answers 200 carries no reason.
    h.settle(10_000).unwrap();
    let ok = h.response(1).expect("answered");
    assert_eq!((ok.status, ok.why), (Status::OK, None));
}

#[test]
fn under_sglang_router_the_answer_carries_the_failed_halfs_reason() {
    let cfg = kvsim_engine::EngineConfig {
        router: RouterPolicy::SglangRouter,
        ..cfg()
    };
    let mut h = Harness::new(cfg).unwrap();
    handled(h.submit(1, prompt(33), NEW).unwrap());
    h.settle(10_000).unwrap();
    let r = h.response(1).expect("answered");
    assert_eq!(r.status, Status::BAD_REQUEST);
    // Both halves refuse; the router answers decode's error (SGLang's gateway).
    assert_eq!(
        r.why,
        Some(Why::ReplyTooLong {
            tokens: 33,
            new_tokens: NEW,
            limit: 32
        })
    );
}
