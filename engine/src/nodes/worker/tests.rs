//! The worker front's decisions, stepped by hand: the pairing traced at decode's
//! start, a closed intake, an abort, the cancel-both answer, prefill's early word, and
//! the epoch rule's room clearing.

use super::state::{FrontEffect, FrontInput, HalfEv, WorkerFront};
use crate::ids::{NodeId, RequestId, RoomKey};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;
use crate::trace::TraceEvent;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);

fn decode_start(room: RoomKey) -> Msg {
    Msg::DecodeStart {
        room,
        req: RequestId(room.gen.0),
        prompt: (1..=8).collect(),
        max_new_tokens: 2,
        prefill: PREFILL,
    }
}

/// Decode's half of `room` asked for, and its registration taken by prefill's
/// incarnation `epoch`: the effects of the registration's answer.
fn start(f: &mut WorkerFront, room: RoomKey, epoch: u32) -> Vec<FrontEffect> {
    let mut out = Vec::new();
    let msg = decode_start(room);
    let input = FrontInput::Start {
        room,
        msg,
        max_new_tokens: 2,
        prefill_epoch: None,
        intake_open: true,
    };
    f.handle(input, &mut out);
    let register = Msg::Register { room };
    assert_eq!(
        out,
        vec![FrontEffect::Send {
            to: PREFILL,
            msg: register
        }]
    );
    let mut out = Vec::new();
    let msg = Msg::Registered { room, epoch };
    f.handle(FrontInput::Peer { from: PREFILL, msg }, &mut out);
    out
}

fn abort(f: &mut WorkerFront, room: RoomKey) -> Vec<FrontEffect> {
    let mut out = Vec::new();
    f.handle(FrontInput::Abort { room }, &mut out);
    out
}

fn cleared(out: &[FrontEffect]) -> Vec<RoomKey> {
    out.iter()
        .filter_map(|e| match e {
            FrontEffect::Trace(TraceEvent::RoomCleared { room, .. }) => Some(*room),
            _ => None,
        })
        .collect()
}

fn decode_front(cancels_both: bool) -> WorkerFront {
    WorkerFront::new(DECODE, Role::Decode, ROUTER, cancels_both)
}

/// Decode's half traces the pairing as the router's, hands the node its start as
/// from the router, and answers with decode's tokens (the router's response traced).
#[test]
fn a_decode_half_runs_and_answers_with_its_tokens() {
    let mut f = decode_front(true);
    let room = RoomKey::new(1, 11);
    let out = start(&mut f, room, 0);
    assert!(matches!(
        &out[0],
        FrontEffect::Trace(TraceEvent::Routed {
            node: ROUTER,
            decode: DECODE,
            prefill: PREFILL,
            ..
        })
    ));
    assert_eq!(out[1], FrontEffect::ToNode(decode_start(room)));
    let mut out = Vec::new();
    for (index, token) in [(0, 7), (0, 7), (1, 8)] {
        f.from_node(Msg::TokenOut { room, index, token }, &mut out);
    }
    let status = Status::OK;
    f.from_node(
        Msg::DecodeFinished {
            room,
            status,
            why: None,
        },
        &mut out,
    );
    let done = HalfEv::Done {
        status,
        why: None,
        side: Side::Decode,
        tokens: vec![7, 8],
    };
    assert_eq!(out.last(), Some(&FrontEffect::Answer { room, ev: done }));
    assert!(out.iter().any(|e| matches!(
        e,
        FrontEffect::Trace(TraceEvent::RouterResponse { tokens, .. }) if *tokens == vec![7, 8]
    )));
    assert!(!f.has_half(room));
    assert_eq!(
        f.open_rooms().collect::<Vec<_>>(),
        vec![room],
        "prefill's half is open"
    );
}

/// With the intake closed a half is answered 503 at once and the node never sees it.
#[test]
fn a_closed_intake_answers_503() {
    let mut f = WorkerFront::new(PREFILL, Role::Prefill, ROUTER, true);
    let room = RoomKey::new(1, 1);
    let msg = Msg::PrefillStart {
        room,
        req: RequestId(1),
        prompt: vec![1, 2],
        decode: DECODE,
    };
    let mut out = Vec::new();
    let input = FrontInput::Start {
        room,
        msg,
        max_new_tokens: 2,
        prefill_epoch: None,
        intake_open: false,
    };
    f.handle(input, &mut out);
    assert!(matches!(
        out.as_slice(),
        [FrontEffect::Answer {
            ev: HalfEv::Done {
                status: Status::UNAVAILABLE,
                ..
            },
            ..
        }]
    ));
    assert!(!f.has_half(room));
}

/// A failed prefill half ends decode's half with prefill's status and reason, and
/// aborts it, with the cancel-both defense on; without it decode's half runs on.
/// Prefill's word that comes before decode's half started is kept for it.
#[test]
fn a_failed_prefill_ends_decodes_half_only_with_cancel_both() {
    for cancels_both in [true, false] {
        let mut f = decode_front(cancels_both);
        let room = RoomKey::new(1, 11);
        let why = Some(Why::TransferFailed);
        let mut out = Vec::new();
        let status = Status::INTERNAL;
        let msg = Msg::PrefillDone { room, status, why };
        f.handle(FrontInput::Peer { from: PREFILL, msg }, &mut out);
        assert!(out.is_empty(), "kept until decode's half starts");
        let mut out = start(&mut f, room, 0);
        let early = FrontInput::Early { room, status, why };
        assert_eq!(out.pop(), Some(FrontEffect::Then(early.clone())));
        f.handle(early, &mut out);
        let aborted = out.contains(&FrontEffect::ToNode(Msg::Abort { room }));
        assert_eq!(aborted, cancels_both);
        let answer = FrontEffect::Answer {
            room,
            ev: HalfEv::Done {
                status,
                why,
                side: Side::Prefill,
                tokens: Vec::new(),
            },
        };
        assert_eq!(out.contains(&answer), cancels_both);
        assert_eq!(f.has_half(room), !cancels_both);
    }
}

/// Worker mode: decode's stand-in for the router clears a room once both halves are
/// terminal; prefill's word of its half's end is lost when the prefill process is
/// killed, so a registration answered by a later incarnation of that prefill node ends
/// the prefill half of every room registered at an earlier one, and a room registered
/// at an incarnation already known dead is born with its prefill half over. Without
/// the restart the rooms stay open (their prefill halves may still be running).
#[test]
fn a_restarted_prefill_ends_the_halves_of_its_dead_incarnation() {
    let mut f = decode_front(true);
    let (a, b, c, d) = (
        RoomKey::new(1, 11),
        RoomKey::new(2, 12),
        RoomKey::new(3, 13),
        RoomKey::new(4, 14),
    );
    let mut all = start(&mut f, a, 0);
    let out = abort(&mut f, a);
    assert!(out.contains(&FrontEffect::ClientGone { req: RequestId(11) }));
    assert!(out.contains(&FrontEffect::Close { room: a }));
    all.extend(out);
    // The node's finish for the aborted half: decode's half is terminal.
    let (status, why) = (Status::CLIENT_CLOSED, None);
    f.from_node(
        Msg::DecodeFinished {
            room: a,
            status,
            why,
        },
        &mut all,
    );
    all.extend(start(&mut f, b, 0));
    assert!(
        cleared(&all).is_empty(),
        "no prefill word, same incarnation"
    );
    all.extend(start(&mut f, c, 1));
    assert_eq!(
        cleared(&all),
        vec![a],
        "a's prefill half died with incarnation 0"
    );
    all.extend(abort(&mut f, b));
    f.from_node(
        Msg::DecodeFinished {
            room: b,
            status,
            why,
        },
        &mut all,
    );
    assert_eq!(cleared(&all), vec![a, b]);
    all.extend(start(&mut f, d, 0));
    all.extend(abort(&mut f, d));
    f.from_node(
        Msg::DecodeFinished {
            room: d,
            status,
            why,
        },
        &mut all,
    );
    assert_eq!(
        cleared(&all),
        vec![a, b, d],
        "born with prefill's half over"
    );
    all.extend(abort(&mut f, c));
    f.from_node(
        Msg::DecodeFinished {
            room: c,
            status,
            why,
        },
        &mut all,
    );
    assert_eq!(cleared(&all), vec![a, b, d], "c's prefill half is alive");
}

/// A killed decode process's front left open the rooms it routed and did not clear
/// (not a room another decode node serves, nor one traced by this node as its own
/// router); the next process clears each, as the router it stood in for.
#[test]
fn a_killed_decode_front_leaves_its_open_rooms_to_be_cleared() {
    use super::killed::LeftOpen;
    let routed = |room: RoomKey, node: NodeId, decode: NodeId| TraceEvent::Routed {
        node,
        req: RequestId(room.gen.0),
        tenant: crate::ids::TenantId(0),
        room,
        prefill: PREFILL,
        decode,
        prompt_len: 4,
        max_new_tokens: 2,
    };
    let (a, b, c, d) = (
        RoomKey::new(1, 1),
        RoomKey::new(2, 2),
        RoomKey::new(3, 3),
        RoomKey::new(4, 4),
    );
    let mut left = LeftOpen::new(DECODE);
    for ev in [
        routed(a, ROUTER, DECODE),
        routed(b, ROUTER, DECODE),
        routed(c, ROUTER, NodeId(3)),
        routed(d, DECODE, DECODE),
        TraceEvent::RoomCleared {
            node: ROUTER,
            room: b,
        },
    ] {
        left.event(&ev);
    }
    let cleared = vec![TraceEvent::RoomCleared {
        node: ROUTER,
        room: a,
    }];
    assert_eq!(left.cleared(), cleared);
}

/// The page and the room of the vLLM pair tests.
fn vllm_room() -> (RoomKey, Vec<crate::ids::PageTag>) {
    use crate::ids::{Generation, PageId, PageTag};
    let src = vec![PageTag {
        page: PageId(5),
        gen: Generation(2),
    }];
    (RoomKey::new(3, 33), src)
}

/// vLLM's prefill half under the real `vllm-router`: its `KvParams` is its answer's
/// `kv_transfer_params`, before its 200, and no word of its end goes to a decode
/// front (vllm-router asks decode only after prefill's 200).
#[test]
fn a_vllm_prefill_half_answers_params_and_tells_no_decode() {
    let (room, src) = vllm_room();
    let vllm = crate::config::Protocol::Vllm;
    let mut p = WorkerFront::new(PREFILL, Role::Prefill, ROUTER, false).protocol(vllm);
    let mut out = Vec::new();
    let msg = Msg::PrefillStart {
        room,
        req: RequestId(33),
        prompt: (1..=8).collect(),
        decode: DECODE,
    };
    let input = FrontInput::Start {
        room,
        msg: msg.clone(),
        max_new_tokens: 1,
        prefill_epoch: None,
        intake_open: true,
    };
    p.handle(input, &mut out);
    assert_eq!(out, vec![FrontEffect::ToNode(msg)]);
    let mut out = Vec::new();
    let (src2, tokens) = (src.clone(), 8);
    p.from_node(
        Msg::KvParams {
            room,
            src: src2,
            tokens,
        },
        &mut out,
    );
    let params = HalfEv::Params {
        src: src.clone(),
        tokens,
    };
    assert_eq!(out, vec![FrontEffect::Answer { room, ev: params }]);
    let (status, why) = (Status::OK, None::<Why>);
    // No word of prefill's end goes to decode's front: it was prefill's 200.
    let mut out = Vec::new();
    p.from_node(Msg::PrefillFinished { room, status, why }, &mut out);
    assert!(
        !out.iter().any(|e| matches!(e, FrontEffect::Send { .. })),
        "{out:?}"
    );
}

/// vLLM's decode half: its `PullStart` is traced as the pairing, its prefill half
/// already over (the router asks decode only after prefill's 200), so decode's answer
/// clears the room.
#[test]
fn a_vllm_decode_half_is_the_pairing_and_clears_the_room_at_its_answer() {
    let (room, src) = vllm_room();
    let vllm = crate::config::Protocol::Vllm;
    let mut d = decode_front(false).protocol(vllm);
    let mut out = Vec::new();
    let pull = Msg::PullStart {
        room,
        req: RequestId(33),
        prompt: (1..=8).collect(),
        max_new_tokens: 2,
        prefill: PREFILL,
        src,
    };
    let input = FrontInput::Start {
        room,
        msg: pull.clone(),
        max_new_tokens: 2,
        prefill_epoch: Some(0),
        intake_open: true,
    };
    d.handle(input, &mut out);
    assert!(matches!(
        &out[0],
        FrontEffect::Trace(TraceEvent::Routed {
            prefill: PREFILL,
            ..
        })
    ));
    assert!(out.contains(&FrontEffect::ToNode(pull)));
    assert!(cleared(&out).is_empty(), "decode's half is not over yet");
    let mut out = Vec::new();
    let (status, why) = (Status::OK, None::<Why>);
    d.from_node(Msg::DecodeFinished { room, status, why }, &mut out);
    assert_eq!(cleared(&out), vec![room]);
}
