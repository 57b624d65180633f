//! The pairing between the two halves' fronts, stepped by hand: prefill's half waits
//! for decode's registration (and takes the registrant as its decode), a
//! registration may come first, a wait that runs out answers 504 and tells decode, a
//! finished prefill half tells decode, and a decode half held for its registration
//! ends with prefill's failure without reaching the node.

use super::state::{FrontEffect, FrontInput, HalfEv, WorkerFront};
use crate::ids::{NodeId, RequestId, RoomKey};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);
const WAIT: u64 = 1_000;

fn prefill_front() -> WorkerFront {
    WorkerFront::new(PREFILL, Role::Prefill, ROUTER, true).pairing(3, WAIT)
}

fn prefill_start(room: RoomKey, decode: NodeId) -> Msg {
    Msg::PrefillStart {
        room,
        req: RequestId(room.gen.0),
        prompt: vec![1, 2, 3],
        decode,
    }
}

fn feed(f: &mut WorkerFront, input: FrontInput) -> Vec<FrontEffect> {
    let mut out = Vec::new();
    f.handle(input, &mut out);
    out
}

fn ask(f: &mut WorkerFront, room: RoomKey) -> Vec<FrontEffect> {
    // The router's request names no decode node: the registrant is prefill's peer.
    let msg = prefill_start(room, NodeId(99));
    let input = FrontInput::Start {
        room,
        msg,
        max_new_tokens: 0,
        prefill_epoch: None,
        intake_open: true,
    };
    feed(f, input)
}

fn register(f: &mut WorkerFront, room: RoomKey) -> Vec<FrontEffect> {
    let msg = Msg::Register { room };
    feed(f, FrontInput::Peer { from: DECODE, msg })
}

fn send(to: NodeId, msg: Msg) -> FrontEffect {
    FrontEffect::Send { to, msg }
}

fn told(room: RoomKey, status: Status, why: Option<Why>) -> FrontEffect {
    send(DECODE, Msg::PrefillDone { room, status, why })
}

fn done(status: Status, why: Option<Why>) -> HalfEv {
    HalfEv::Done {
        status,
        why,
        side: Side::Prefill,
        tokens: Vec::new(),
    }
}

/// Prefill's half waits for decode's registration, starts with the registrant as
/// its decode, and its end is told to that decode; a copy of the registration is
/// answered again and starts nothing.
#[test]
fn a_prefill_half_waits_for_decodes_registration_and_tells_it_its_end() {
    let mut f = prefill_front();
    let room = RoomKey::new(1, 5);
    let wait = FrontEffect::Wait {
        room,
        after_ns: WAIT,
    };
    assert_eq!(ask(&mut f, room), vec![wait]);
    let registered = send(DECODE, Msg::Registered { room, epoch: 3 });
    let started = FrontEffect::ToNode(prefill_start(room, DECODE));
    // The half goes to the node first: an answer it gives at once precedes this one.
    assert_eq!(register(&mut f, room), vec![started, registered.clone()]);
    assert_eq!(register(&mut f, room), vec![registered], "a copy");
    let (status, why) = (Status::INTERNAL, Some(Why::TransferFailed));
    let mut out = Vec::new();
    f.from_node(Msg::PrefillFinished { room, status, why }, &mut out);
    let answer = FrontEffect::Answer {
        room,
        ev: done(status, why),
    };
    assert_eq!(out, vec![answer, told(room, status, why)]);
    assert_eq!(feed(&mut f, FrontInput::WaitOver { room }), Vec::new());
}

/// A registration that comes before the router's request is kept: the half starts
/// at once. One that no request takes in time is dropped and its decode told 504.
#[test]
fn a_registration_first_is_taken_and_an_untaken_one_is_dropped() {
    let mut f = prefill_front();
    let (a, b) = (RoomKey::new(1, 5), RoomKey::new(2, 6));
    let out = register(&mut f, a);
    assert_eq!(
        out[1],
        FrontEffect::Wait {
            room: a,
            after_ns: WAIT
        }
    );
    assert_eq!(
        ask(&mut f, a),
        vec![FrontEffect::ToNode(prefill_start(a, DECODE))]
    );
    register(&mut f, b);
    let out = feed(&mut f, FrontInput::WaitOver { room: b });
    assert_eq!(out, vec![told(b, Status::GATEWAY_TIMEOUT, None)]);
    assert!(ask(&mut f, b)
        .iter()
        .all(|e| !matches!(e, FrontEffect::ToNode(_))));
}

/// A half whose decode never registers is answered 504 when its wait is over; a
/// decode that registers later hears at once that prefill's half ended. A half
/// refused at a closed intake, or aborted while waiting, is told the same way.
#[test]
fn a_half_never_paired_ends_and_a_late_registrant_is_told() {
    let mut f = prefill_front();
    let room = RoomKey::new(1, 5);
    ask(&mut f, room);
    let out = feed(&mut f, FrontInput::WaitOver { room });
    let answer = FrontEffect::Answer {
        room,
        ev: done(Status::GATEWAY_TIMEOUT, None),
    };
    assert_eq!(out, vec![answer]);
    let registered = send(DECODE, Msg::Registered { room, epoch: 3 });
    let late = told(room, Status::GATEWAY_TIMEOUT, None);
    assert_eq!(register(&mut f, room), vec![registered, late]);
    let other = RoomKey::new(2, 6);
    ask(&mut f, other);
    assert_eq!(
        feed(&mut f, FrontInput::Abort { room: other }),
        vec![FrontEffect::Close { room: other }]
    );
    let out = register(&mut f, other);
    assert_eq!(out[1], told(other, Status::CLIENT_CLOSED, None));
}

/// Decode's half is held until prefill's bootstrap takes its registration; prefill's
/// failure before that ends it with prefill's status, and the node never sees it.
#[test]
fn a_held_decode_half_ends_with_prefills_failure() {
    let mut f = WorkerFront::new(DECODE, Role::Decode, ROUTER, true);
    let room = RoomKey::new(1, 5);
    let msg = Msg::DecodeStart {
        room,
        req: RequestId(5),
        prompt: vec![1, 2, 3],
        max_new_tokens: 2,
        prefill: PREFILL,
    };
    let input = FrontInput::Start {
        room,
        msg,
        max_new_tokens: 2,
        prefill_epoch: None,
        intake_open: true,
    };
    let out = feed(&mut f, input);
    assert_eq!(out, vec![send(PREFILL, Msg::Register { room })]);
    let status = Status::GATEWAY_TIMEOUT;
    let word = Msg::PrefillDone {
        room,
        status,
        why: None,
    };
    // Only the room's prefill node speaks for its half.
    let stranger = FrontInput::Peer {
        from: NodeId(7),
        msg: word.clone(),
    };
    assert!(feed(&mut f, stranger).is_empty());
    let out = feed(
        &mut f,
        FrontInput::Peer {
            from: PREFILL,
            msg: word,
        },
    );
    let answer = FrontEffect::Answer {
        room,
        ev: done(status, None),
    };
    assert_eq!(out, vec![answer]);
    assert!(!f.has_half(room));
    let late = Msg::Registered { room, epoch: 0 };
    assert!(feed(
        &mut f,
        FrontInput::Peer {
            from: PREFILL,
            msg: late
        }
    )
    .is_empty());
}
