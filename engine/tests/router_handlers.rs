//! Every input the router handles, one hand-stepped input at a time: the room's
//! state (live, answered, which halves reported), the messages sent, the client's
//! answer, the pending request timer and the events traced.
//!
//! Not an end-to-end test, and not a test of prefill or decode: their reports are
//! injected as messages from the right node. Invariant checked: every request gets
//! at most one answer, and the room is cleared only when both halves reported.

mod common;
use common::*;
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::{NodeId, RoomKey};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::{Bug, BugSet, EngineConfig, Timer};

/// The router's view of the room: (answered, prefill status, decode status), `None`
/// when not live.
type State = Option<(bool, Option<Status>, Option<Status>)>;

struct Want<'a> {
    state: State,
    events: &'a [&'a str],
    sends: &'a [(&'a str, NodeId)],
    timers: Vec<Timer>,
    /// The client's answers since the step.
    answers: &'a [Status],
}

fn check(h: &mut H, room: RoomKey, act: impl FnOnce(&mut H), want: Want) {
    let m = h.mark();
    act(h);
    let state = h
        .router_room(room)
        .map(|s| (s.answered, s.prefill_status, s.decode_status));
    assert_eq!(state, want.state, "state");
    assert_eq!(h.event_names_since(m), want.events, "events");
    assert_eq!(sent(h, m), want.sends, "sends");
    assert_eq!(h.timers_of(R), want.timers, "timers");
    let answers: Vec<Status> = h.responses_since(m).iter().map(|r| r.status).collect();
    assert_eq!(answers, want.answers, "answers");
    h.invariants().unwrap();
}

fn from(node: NodeId, msg: Msg) -> impl FnOnce(&mut H) {
    move |h| handled(h.inject(node, R, msg).unwrap())
}

/// The first room of a fresh harness.
const ROOM: RoomKey = RoomKey::new(1, 1);

fn live(h: &mut H) -> RoomKey {
    submit(h, 1)
}

// ---- Submit ------------------------------------------------------------------------

#[test]
fn submit_accepted_routes_both_halves_and_arms_the_request_timer() {
    let mut h = harness();
    let c = h.client();
    check(
        &mut h,
        ROOM,
        |h| handled(h.submit(1, prompt(LEN), NEW).unwrap()),
        Want {
            state: Some((false, None, None)),
            events: &["Routed"],
            sends: &[("DecodeStart", D), ("PrefillStart", P)],
            timers: vec![Timer::Request(ROOM)],
            answers: &[],
        },
    );
    let s = h.router_room(ROOM).unwrap();
    assert_eq!((s.client, s.prefill, s.decode), (c, P, D));
}

#[test]
fn submit_refused_as_a_bad_request_takes_no_room() {
    let cases: &[(&str, u32, u32)] = &[
        ("no new tokens", LEN, 0),
        ("more new tokens than the limit", LEN, 9),
        ("an empty prompt", 0, NEW),
    ];
    for &(what, len, new) in cases {
        let mut h = harness();
        let c = h.client();
        check(
            &mut h,
            ROOM,
            |h| handled(h.submit(1, prompt(len), new).unwrap()),
            Want {
                state: None,
                events: &["RouterResponse"],
                sends: &[("Response", c)],
                timers: vec![],
                answers: &[Status::BAD_REQUEST],
            },
        );
        assert_eq!(h.router().unwrap().live_rooms(), 0, "{what}");
        assert!(h.in_flight().is_empty(), "{what}");
    }
}

#[test]
fn submit_without_a_free_room_is_refused_unavailable() {
    let mut h = Harness::new(EngineConfig {
        max_rooms: 1,
        ..cfg()
    })
    .unwrap();
    let room = live(&mut h);
    let c = h.client();
    check(
        &mut h,
        room,
        |h| handled(h.submit(2, prompt(LEN), NEW).unwrap()),
        Want {
            state: Some((false, None, None)),
            events: &["RouterResponse"],
            sends: &[("Response", c)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::UNAVAILABLE],
        },
    );
}

#[test]
fn a_duplicate_submit_of_a_live_request_changes_nothing() {
    let mut h = harness();
    let room = live(&mut h);
    check(
        &mut h,
        room,
        |h| handled(h.submit(1, prompt(LEN), NEW).unwrap()),
        Want {
            state: Some((false, None, None)),
            events: &[],
            sends: &[],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
}

// ---- Cancel ------------------------------------------------------------------------

#[test]
fn cancel_answers_the_client_and_aborts_both_halves() {
    let mut h = harness();
    let room = live(&mut h);
    let c = h.client();
    check(
        &mut h,
        room,
        |h| handled(h.cancel(1).unwrap()),
        Want {
            state: Some((true, None, None)),
            events: &["RouterResponse"],
            sends: &[("Response", c), ("Abort", P), ("Abort", D)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::CLIENT_CLOSED],
        },
    );
    // A second cancel finds the request answered.
    check(
        &mut h,
        room,
        |h| handled(h.cancel(1).unwrap()),
        Want {
            state: Some((true, None, None)),
            events: &[],
            sends: &[],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
}

#[test]
fn cancel_aborts_only_the_halves_still_open() {
    let mut h = harness();
    let room = live(&mut h);
    let c = h.client();
    from(
        P,
        Msg::PrefillFinished {
            room,
            status: Status::OK,
            why: None,
        },
    )(&mut h);
    check(
        &mut h,
        room,
        |h| handled(h.cancel(1).unwrap()),
        Want {
            state: Some((true, Some(Status::OK), None)),
            events: &["RouterResponse"],
            sends: &[("Response", c), ("Abort", D)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::CLIENT_CLOSED],
        },
    );
}

#[test]
fn cancel_under_the_one_half_bug_leaves_decode_waiting() {
    let mut h = Harness::new(EngineConfig {
        bugs: BugSet::NONE.with(Bug::RouterCancelsOneHalf),
        ..cfg()
    })
    .unwrap();
    let room = live(&mut h);
    let c = h.client();
    check(
        &mut h,
        room,
        |h| handled(h.cancel(1).unwrap()),
        Want {
            state: Some((true, None, None)),
            events: &["RouterResponse"],
            sends: &[("Response", c), ("Abort", P)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::CLIENT_CLOSED],
        },
    );
}

#[test]
fn cancel_of_an_unknown_request_changes_nothing() {
    let mut h = harness();
    let room = live(&mut h);
    check(
        &mut h,
        room,
        |h| handled(h.cancel(42).unwrap()),
        Want {
            state: Some((false, None, None)),
            events: &[],
            sends: &[],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
}

// ---- PrefillFinished, DecodeFinished, TokenOut ---------------------------------------

#[test]
fn prefill_ok_is_recorded_and_answers_nobody() {
    let mut h = harness();
    let room = live(&mut h);
    check(
        &mut h,
        room,
        from(
            P,
            Msg::PrefillFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        Want {
            state: Some((false, Some(Status::OK), None)),
            events: &[],
            sends: &[],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
}

#[test]
fn a_half_failing_answers_the_error_and_aborts_the_other_half() {
    let cases: &[(NodeId, bool)] = &[(P, true), (D, false)];
    for &(half, is_prefill) in cases {
        let mut h = harness();
        let room = live(&mut h);
        let c = h.client();
        let msg = if is_prefill {
            Msg::PrefillFinished {
                room,
                status: Status::INTERNAL,
                why: None,
            }
        } else {
            Msg::DecodeFinished {
                room,
                status: Status::INTERNAL,
                why: None,
            }
        };
        let (other, state) = if is_prefill {
            (D, (true, Some(Status::INTERNAL), None))
        } else {
            (P, (true, None, Some(Status::INTERNAL)))
        };
        check(
            &mut h,
            room,
            from(half, msg.clone()),
            Want {
                state: Some(state),
                events: &["RouterResponse"],
                sends: &[("Response", c), ("Abort", other)],
                timers: vec![Timer::Request(room)],
                answers: &[Status::INTERNAL],
            },
        );
        // The duplicate is ignored.
        check(
            &mut h,
            room,
            from(half, msg),
            Want {
                state: Some(state),
                events: &[],
                sends: &[],
                timers: vec![Timer::Request(room)],
                answers: &[],
            },
        );
    }
}

fn token(room: RoomKey, index: u32) -> Msg {
    Msg::TokenOut {
        room,
        index,
        token: 1000 + index,
    }
}

#[test]
fn tokens_fill_their_slots_and_one_beyond_the_limit_is_ignored() {
    let mut h = harness();
    let room = live(&mut h);
    for (index, tokens) in [
        (2, vec![None, None, Some(1002)]),
        (0, vec![Some(1000), None, Some(1002)]),
        (8, vec![Some(1000), None, Some(1002)]),
    ] {
        check(
            &mut h,
            room,
            from(D, token(room, index)),
            Want {
                state: Some((false, None, None)),
                events: &[],
                sends: &[],
                timers: vec![Timer::Request(room)],
                answers: &[],
            },
        );
        assert_eq!(h.router_room(room).unwrap().tokens, tokens);
    }
}

#[test]
fn decode_ok_answers_with_the_tokens_and_both_reports_clear_the_room() {
    let mut h = harness();
    let room = live(&mut h);
    let c = h.client();
    from(
        P,
        Msg::PrefillFinished {
            room,
            status: Status::OK,
            why: None,
        },
    )(&mut h);
    for i in 0..NEW {
        from(D, token(room, i))(&mut h);
    }
    check(
        &mut h,
        room,
        from(
            D,
            Msg::DecodeFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        Want {
            state: None,
            events: &["RouterResponse", "RoomCleared"],
            sends: &[("Response", c)],
            timers: vec![],
            answers: &[Status::OK],
        },
    );
    assert_eq!(h.response(1).unwrap().tokens, vec![1000, 1001, 1002]);
    assert_eq!(h.router().unwrap().live_rooms(), 0);
}

#[test]
fn decode_ok_first_answers_and_the_room_waits_for_prefill() {
    let mut h = harness();
    let room = live(&mut h);
    let c = h.client();
    // The whole reply streams first: a 200 needs every token the request asked for.
    for index in 0..NEW {
        handled(
            h.inject(
                D,
                R,
                Msg::TokenOut {
                    room,
                    index,
                    token: 7,
                },
            )
            .unwrap(),
        );
    }
    check(
        &mut h,
        room,
        from(
            D,
            Msg::DecodeFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        Want {
            state: Some((true, None, Some(Status::OK))),
            events: &["RouterResponse"],
            sends: &[("Response", c)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::OK],
        },
    );
    check(
        &mut h,
        room,
        from(
            P,
            Msg::PrefillFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        Want {
            state: None,
            events: &["RoomCleared"],
            sends: &[],
            timers: vec![],
            answers: &[],
        },
    );
}

#[test]
fn a_gap_in_the_token_stream_is_an_error_never_a_shorter_reply() {
    let mut h = harness();
    let room = live(&mut h);
    from(D, token(room, 0))(&mut h);
    from(D, token(room, 2))(&mut h);
    from(
        D,
        Msg::DecodeFinished {
            room,
            status: Status::OK,
            why: None,
        },
    )(&mut h);
    let r = h.response(1).unwrap();
    assert_eq!(r.status, Status::INTERNAL);
    assert!(r.tokens.is_empty());
}

// ---- Request timer -----------------------------------------------------------------

#[test]
fn the_request_timeout_answers_once_and_keeps_aborting_open_halves() {
    let mut h = harness();
    let room = live(&mut h);
    let c = h.client();
    check(
        &mut h,
        room,
        |h| h.fire(R, Timer::Request(room)).unwrap(),
        Want {
            state: Some((true, None, None)),
            events: &["RouterResponse"],
            sends: &[("Response", c), ("Abort", P), ("Abort", D)],
            timers: vec![Timer::Request(room)],
            answers: &[Status::INTERNAL],
        },
    );
    from(
        P,
        Msg::PrefillFinished {
            room,
            status: Status::CLIENT_CLOSED,
            why: None,
        },
    )(&mut h);
    check(
        &mut h,
        room,
        |h| h.fire(R, Timer::Request(room)).unwrap(),
        Want {
            state: Some((true, Some(Status::CLIENT_CLOSED), None)),
            events: &[],
            sends: &[("Abort", D)],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
    check(
        &mut h,
        room,
        from(
            D,
            Msg::DecodeFinished {
                room,
                status: Status::CLIENT_CLOSED,
                why: None,
            },
        ),
        Want {
            state: None,
            events: &["RoomCleared"],
            sends: &[],
            timers: vec![],
            answers: &[],
        },
    );
    assert_eq!(h.responses().len(), 1, "one answer per request");
}

#[test]
fn a_report_for_an_earlier_use_of_the_room_is_ignored() {
    let mut h = harness();
    let room = live(&mut h);
    let earlier = RoomKey::new(1, 0);
    check(
        &mut h,
        room,
        from(
            P,
            Msg::PrefillFinished {
                room: earlier,
                status: Status::INTERNAL,
                why: None,
            },
        ),
        Want {
            state: Some((false, None, None)),
            events: &[],
            sends: &[],
            timers: vec![Timer::Request(room)],
            answers: &[],
        },
    );
}

/// Finding: the router checks the token stream for gaps, but not for a missing tail.
/// It does not keep `max_new_tokens`, so when the last `TokenOut` is reordered after
/// `DecodeFinished` (control messages may be), the client gets 200 with fewer tokens
/// than decode generated: a silently shorter reply.
#[test]

fn a_missing_tail_of_the_token_stream_is_an_error_never_a_shorter_reply() {
    let mut h = harness();
    decode_running(&mut h);
    h.fire(P, Timer::Compute).unwrap();
    handled(h.deliver_kind("PrefillFinished", R).unwrap());
    for _ in 0..NEW {
        h.fire(D, Timer::Compute).unwrap();
    }
    // Tokens 0 and 1, then the finish; token 2 is still on its way.
    handled(h.deliver_kind("TokenOut", R).unwrap());
    handled(h.deliver_kind("TokenOut", R).unwrap());
    handled(h.deliver_kind("DecodeFinished", R).unwrap());
    let r = h.response(1).unwrap();
    assert!(
        r.status != Status::OK || r.tokens.len() == NEW as usize,
        "{r:?}"
    );
}

// ---- Streaming ----------------------------------------------------------------------

/// The router streams each token to the client once, as it takes it: from the room's
/// decode node only, a duplicate not again, and nothing after the client's answer.
#[test]
fn each_taken_token_is_streamed_once_until_the_answer() {
    use kvsim_engine::env::{Effect, Input, Outbox};
    use kvsim_engine::ids::{RequestId, TenantId};
    use kvsim_engine::router::Router;
    use kvsim_engine::shared_cfg::Cfg;
    type K = kvsim_engine::gpu::SymbolicPage;
    let (r, p, d, client) = (NodeId(0), NodeId(1), NodeId(2), NodeId(9));
    let mut router = Router::new(r, Cfg::new(EngineConfig::default()), vec![p], vec![d]);
    let mut step = |from: NodeId, msg: Msg| {
        let mut out = Outbox::<K>::new(0);
        router.handle(Input::Message { from, msg }, &mut out);
        let streamed: Vec<(NodeId, RequestId, u32, u32)> = out
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Stream {
                    to,
                    req,
                    index,
                    token,
                } => Some((*to, *req, *index, *token)),
                _ => None,
            })
            .collect();
        (out, streamed)
    };
    let (out, _) = step(
        client,
        Msg::Submit {
            req: RequestId(7),
            tenant: TenantId(1),
            prompt: vec![1, 2, 3],
            max_new_tokens: 2,
        },
    );
    let room = out
        .sends()
        .find_map(|(_, m)| match m {
            Msg::DecodeStart { room, .. } => Some(*room),
            _ => None,
        })
        .expect("decode started");
    let tok = |index, token| Msg::TokenOut { room, index, token };
    assert_eq!(
        step(p, tok(0, 99)).1,
        [],
        "prefill is not the room's decode node"
    );
    assert_eq!(step(d, tok(0, 5)).1, [(client, RequestId(7), 0, 5)]);
    assert_eq!(
        step(d, tok(0, 5)).1,
        [],
        "a duplicate is not streamed again"
    );
    assert_eq!(step(d, tok(1, 6)).1, [(client, RequestId(7), 1, 6)]);
    let done = Msg::DecodeFinished {
        room,
        status: Status::OK,
        why: None,
    };
    let (out, streamed) = step(d, done);
    assert_eq!(streamed, []);
    assert!(out
        .sends()
        .any(|(to, m)| to == client && matches!(m, Msg::Response { .. })));
    assert_eq!(
        step(d, tok(1, 7)).1,
        [],
        "nothing after the client's answer"
    );
}
