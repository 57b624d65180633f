//! Issue 37, class 2: a `bootstrap_room` that collides with a live one (SGLang #40125,
//! the fix proposed in #40185; Mooncake #1400). A second start names the room use a
//! live request holds, for another request, as a client that supplies its own room
//! through SGLang's worker API does (the worker front delivers it as from the router).
//!
//! Defended: each half refuses it at the peer check (traced `PeerRefused`, counted),
//! no page moves, and the live request completes as if nothing had happened. Under
//! `duplicate-room-joins-live` the second start takes prefill's entry for the room
//! over (SGLang keys it by the room number alone) and the live request is served from
//! the other request's prompt.

mod common;
use common::*;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::{RequestId, RoomKey};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::Token;

/// Another request's prompt, of the same length.
fn other_prompt() -> Vec<Token> {
    prompt(LEN).iter().map(|t| t + 50).collect()
}

/// Request 1 started on both halves; then request 99's starts for the same room use
/// arrive from the router's address. Returns the room and each half's delivery result.
fn collide(h: &mut H) -> RoomKey {
    let room = submit(h, 1);
    handled(h.deliver_kind("DecodeStart", D).unwrap());
    handled(h.deliver_kind("PrefillStart", P).unwrap());
    let req = RequestId(99);
    let start = Msg::DecodeStart {
        room,
        req,
        prompt: other_prompt(),
        max_new_tokens: NEW,
        prefill: P,
    };
    h.inject(R, D, start).unwrap();
    let start = Msg::PrefillStart {
        room,
        req,
        prompt: other_prompt(),
        decode: D,
    };
    h.inject(R, P, start).unwrap();
    room
}

fn refusals(h: &H) -> Vec<(kvsim_engine::ids::NodeId, String)> {
    h.events()
        .iter()
        .filter_map(|(n, e)| match e {
            TraceEvent::PeerRefused { reason, .. } => Some((*n, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The tokens request 1 is answered with when nothing collides.
fn clean_reply() -> Vec<Token> {
    let mut h: H = Harness::new(cfg()).unwrap();
    submit(&mut h, 1);
    h.settle(400).unwrap();
    let r = h.response(1).unwrap();
    assert_eq!(r.status, Status::OK);
    r.tokens.clone()
}

#[test]
fn a_start_for_a_live_room_from_another_request_is_refused_and_the_live_room_is_unharmed() {
    let mut h: H = Harness::new(cfg()).unwrap();
    let before = (h.pages(P), h.pages(D));
    let room = collide(&mut h);
    let refused = refusals(&h);
    assert_eq!(refused.len(), 2, "{refused:?}");
    for (node, reason) in &refused {
        assert!(reason.contains("in use by req1"), "{node}: {reason}");
    }
    assert_eq!((h.peer_refused(P), h.peer_refused(D)), (1, 1));
    // Nothing moved for the refused start: prefill still has no page, decode only
    // the live request's reservation (made before the collision).
    assert_eq!(h.pages(P), before.0);
    assert_eq!(h.free_pages(D), 8 - 4);
    h.settle(400).unwrap();
    let r = h.response(1).unwrap();
    assert_eq!((r.status, &r.tokens), (Status::OK, &clean_reply()));
    assert_eq!(h.responses().len(), 1);
    assert!(h.router_room(room).is_none());
    assert_eq!((h.free_pages(P), h.free_pages(D)), (8, 8));
    h.invariants().unwrap();
}

#[test]
fn under_the_switch_the_second_start_takes_the_live_room_over() {
    let mut cfg = cfg();
    cfg.bugs = BugSet::NONE.with(Bug::DuplicateRoomJoinsLive);
    let mut h: H = Harness::new(cfg).unwrap();
    collide(&mut h);
    assert!(refusals(&h).is_empty(), "no half checks the room");
    h.settle(400).unwrap();
    let r = h.response(1).unwrap();
    assert_eq!(r.status, Status::OK, "served, and wrongly");
    assert_ne!(
        r.tokens,
        clean_reply(),
        "request 1 is answered from request 99's prompt"
    );
}
