//! A prefill or decode node behind its worker front, under an engine router (the
//! simulator's and the model checker's worker topology,
//! [`Topology::build_behind_fronts`](crate::world::Topology::build_behind_fronts)):
//! the router reaches the node only through the front, as `sglang-router` reaches a
//! worker only through its HTTP front. What the router sends the node (a half's
//! start, an abort) is the front's input; what the node sends the router is the
//! front's ([`WorkerFront::from_node`]), and the front's answer goes back to the
//! router as the engine's own message of that half (`TokenOut`, `PrefillFinished`,
//! `DecodeFinished`). The front is in the node's process: what passes between them
//! is no message the world carries; what passes between the router and the front is,
//! and so is the pairing between the two halves' fronts (`Msg::Register`,
//! `Msg::Registered`, `Msg::PrefillDone`, sent as the node; `Timer::Pairing` is
//! the node's timer).
//!
//! The one rule of the trace (docs/DECISIONS.md, "Worker fronts under an engine
//! router"): where an engine router runs, it is the real router and traces what it
//! always traces (each attempt's `routed`, the client's one `router_response`, each
//! room's `room_cleared`, retries under one request id); the front traces nothing
//! the router traces ([`router_traced`]). A front traces those records only where no
//! router trace exists (`kvsim serve --worker-http`), so each record has one author
//! and the one oracle judges both deployments.

use super::state::{FrontEffect, FrontInput, HalfEv, WorkerFront};
use crate::env::{Effect, Input, Outbox, Timer};
use crate::ids::RoomKey;
use crate::msg::{Msg, Side, Status};
use crate::trace::TraceEvent;
use std::collections::VecDeque;

/// Is `ev` a record the engine router authors where one runs (and so not the front's)?
pub fn router_traced(ev: &TraceEvent) -> bool {
    matches!(
        ev,
        TraceEvent::Routed { .. }
            | TraceEvent::RouterResponse { .. }
            | TraceEvent::RoomCleared { .. }
    )
}

/// The router's message a front's start or abort is, as a front input (`None`: the
/// worker API has no such request, and the node never sees it).
fn from_router(msg: Msg) -> Option<FrontInput> {
    match msg {
        Msg::DecodeStart {
            room,
            max_new_tokens,
            ..
        } => Some(start(room, msg, max_new_tokens)),
        Msg::PrefillStart { room, .. } => Some(start(room, msg, 0)),
        Msg::Abort { room } => Some(FrontInput::Abort { room }),
        _ => None,
    }
}

fn start(room: RoomKey, msg: Msg, max_new_tokens: u32) -> FrontInput {
    FrontInput::Start {
        room,
        msg,
        max_new_tokens,
        prefill_epoch: None,
        intake_open: true,
    }
}

/// Is `msg` one the fronts exchange (the pairing), not one for the node?
fn between_fronts(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Register { .. } | Msg::Registered { .. } | Msg::PrefillDone { .. }
    )
}

/// The engine's message to the router that a half's answer event is.
fn answer_msg(side: Side, room: RoomKey, ev: HalfEv) -> Msg {
    match (ev, side) {
        (HalfEv::Token { index, token }, _) => Msg::TokenOut { room, index, token },
        (HalfEv::Params { src, tokens }, _) => Msg::KvParams { room, src, tokens },
        (HalfEv::Done { status, why, .. }, Side::Prefill) => {
            Msg::PrefillFinished { room, status, why }
        }
        (HalfEv::Done { status, why, .. }, Side::Decode) => {
            Msg::DecodeFinished { room, status, why }
        }
    }
}

/// Handle `input` for the node behind `front`: `node` is the node's own `handle`.
/// The node's effects and the front's go to `out`, in the order issued; a device
/// job the node asked for stays the last effect (`step::step` carries it out).
pub(crate) fn handle_behind<K>(
    front: &mut WorkerFront,
    input: Input,
    out: &mut Outbox<K>,
    node: &mut dyn FnMut(Input, &mut Outbox<K>),
) {
    match input {
        Input::Message { from, msg } if from == front.router() => {
            if let Some(first) = from_router(msg) {
                feed(front, first, out, node);
            }
        }
        Input::Message { from, msg } if between_fronts(&msg) => {
            feed(front, FrontInput::Peer { from, msg }, out, node)
        }
        Input::Timer(Timer::Pairing(room)) => feed(front, FrontInput::WaitOver { room }, out, node),
        input => to_node(front, input, out, node),
    }
    jobs_last(out);
}

/// Hand the front `first` and carry out its effects in order; an input it hands
/// back is handled after them.
fn feed<K>(
    front: &mut WorkerFront,
    first: FrontInput,
    out: &mut Outbox<K>,
    node: &mut dyn FnMut(Input, &mut Outbox<K>),
) {
    let mut inputs = VecDeque::from([first]);
    while let Some(input) = inputs.pop_front() {
        let mut fx = Vec::new();
        front.handle(input, &mut fx);
        for e in fx {
            match e {
                FrontEffect::ToNode(msg) => {
                    let from = front.router();
                    to_node(front, Input::Message { from, msg }, out, node);
                }
                FrontEffect::Then(next) => inputs.push_back(next),
                e => carry(front, e, out),
            }
        }
    }
}

/// The node handles `input`; each message it sends the router goes to the front
/// instead, whose answer takes its place in the order.
fn to_node<K>(
    front: &mut WorkerFront,
    input: Input,
    out: &mut Outbox<K>,
    node: &mut dyn FnMut(Input, &mut Outbox<K>),
) {
    let mark = out.effects.len();
    node(input, out);
    let tail: Vec<_> = out.effects.drain(mark..).collect();
    for e in tail {
        match e {
            Effect::Send { to, msg } if to == front.router() => {
                let mut fx = Vec::new();
                front.from_node(msg, &mut fx);
                for f in fx {
                    carry(front, f, out);
                }
            }
            e => out.effects.push(e),
        }
    }
}

/// One effect of the front that is neither a delivery to the node nor an input
/// handed back: a message to the other half's front and the pairing's timer are
/// the world's; an answer goes to the router as the half's message; a closed
/// answer channel is the router's own closed connection, which it notices as the
/// half's end (499); an event the router authors is not the front's.
fn carry<K>(front: &WorkerFront, e: FrontEffect, out: &mut Outbox<K>) {
    let (router, side) = (front.router(), front.side());
    match e {
        FrontEffect::Answer { room, ev } => out.send(router, answer_msg(side, room, ev)),
        FrontEffect::Close { room } => {
            let ev = HalfEv::Done {
                status: Status::CLIENT_CLOSED,
                why: None,
                side,
                tokens: Vec::new(),
            };
            out.send(router, answer_msg(side, room, ev));
        }
        FrontEffect::Trace(ev) if !router_traced(&ev) => out.trace(ev),
        FrontEffect::Send { to, msg } => out.send(to, msg),
        FrontEffect::Wait { room, after_ns } => out.set_timer(Timer::Pairing(room), after_ns),
        // The router's abort is not a client's disconnect: the router traces its own.
        FrontEffect::Trace(_) | FrontEffect::ClientGone { .. } => {}
        FrontEffect::ToNode(_) | FrontEffect::Then(_) => {
            unreachable!("a delivery or an input handed back is the feed's")
        }
    }
}

/// Move every device job to the end, in order: a step carries out the last effect's
/// job ([`crate::step::step`]), and the front's answers may follow the node's.
fn jobs_last<K>(out: &mut Outbox<K>) {
    let (jobs, rest): (Vec<_>, Vec<_>) = out
        .effects
        .drain(..)
        .partition(|e| matches!(e, Effect::Compute(_)));
    out.effects.extend(rest);
    out.effects.extend(jobs);
}
