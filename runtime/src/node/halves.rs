//! Worker mode in a node's loop: the I/O of the engine's worker front
//! ([`kvsim_engine::worker::WorkerFront`], `Io::front`), which decides everything of
//! a half (its start, its abort when its client goes away, its answer from what the
//! node sends the router, the room clearing and the epoch rule). The loop hands it
//! the worker front's events and carries out its effects: a delivery to the node is
//! a step of the node, an answer goes to the half's [`ReplySink`], an engine event
//! goes through the loop's [`Driver`] as the node's own do, a message to the other
//! half's front goes to the worker API's carrier (HTTP), the pairing's wait is a
//! timer of the loop. Not the loop's other
//! inputs ([`NodeLoop::handle`]) nor the HTTP worker API ([`crate::worker`]).

use crate::node::io::Io;
use crate::node::node_loop::NodeLoop;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::seam::NodeRuntime;
use kvsim_engine::env::{Input, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RoomKey};
use kvsim_engine::msg::{Msg, Status, Why};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::worker::{FrontEffect, FrontInput, HalfEv};
use kvsim_engine::world::Driver;
use kvsim_oracle::schema::{CancelHow, Record};
use std::collections::VecDeque;

impl<K: Clone, R: NodeRuntime<Kv = K>> Io<R> {
    /// A message the node sent its router, in worker mode: the front's half's answer.
    pub(super) fn for_half(&mut self, msg: Msg) {
        let mut out = Vec::new();
        if let Some(f) = self.front.as_mut() {
            f.from_node(msg, &mut out);
        }
        for e in out {
            let left = self.front_effect(e);
            // A node's message to the router is answered, never delivered back.
            debug_assert!(left.is_none(), "the front delivers nothing for an answer");
        }
    }

    /// Carry out one of the front's effects; a delivery to the node or an input for
    /// the front is given back, for the loop.
    fn front_effect(&mut self, e: FrontEffect) -> Option<FrontEffect> {
        match e {
            FrontEffect::Answer { room, ev } => self.answer_half(room, ev),
            FrontEffect::Close { room } => {
                self.sinks.remove(&room);
            }
            FrontEffect::ClientGone { req } => self.trace(|| Record::ClientCancel {
                req,
                how: CancelHow::Disconnect,
                plan: "the router closed its connection to this worker".into(),
            }),
            FrontEffect::Trace(ev) => self.front_event(ev),
            FrontEffect::Send { to, msg } => {
                // Carried by the worker API (HTTP); without a carrier it is lost, as
                // a message to a peer that cannot be reached.
                if let Some(tx) = &self.front_out {
                    let _ = tx.send((to, msg));
                }
            }
            FrontEffect::Wait { room, after_ns } => {
                let (id, now) = (self.id, self.rt.now_ns());
                let timer = Timer::Pairing(room);
                self.timers.apply(id, TimerOp::Set { timer, after_ns }, now);
            }
            e @ (FrontEffect::ToNode(_) | FrontEffect::Then(_)) => return Some(e),
        }
        None
    }

    /// An engine event of the front: as the node's own events go.
    fn front_event(&mut self, ev: TraceEvent) {
        let id = self.id;
        Driver::event(self, id, ev);
    }

    /// An event of `room`'s half's answer, to its sink (a terminal one closes it).
    fn answer_half(&mut self, room: RoomKey, ev: HalfEv) {
        match ev {
            HalfEv::Token { index, token } => {
                if let Some(s) = self.sinks.get_mut(&room) {
                    s.send(ReplyEv::Token { index, token });
                }
            }
            HalfEv::Params { src, tokens } => {
                if let Some(s) = self.sinks.get_mut(&room) {
                    s.send(ReplyEv::Params { src, tokens });
                }
            }
            HalfEv::Done {
                status,
                why,
                side,
                tokens,
            } => {
                // The answer of a decode half that prefill's failure ended says so.
                let peer = self.front.as_ref().is_some_and(|f| f.side() != side);
                let reason = why.map(|w| match peer {
                    true => format!("prefill: {w}"),
                    false => w.to_string(),
                });
                if let Some(mut s) = self.sinks.remove(&room) {
                    s.send(done(room, status, tokens, reason, why));
                }
            }
        }
    }
}

fn done(
    room: RoomKey,
    status: Status,
    tokens: Vec<u32>,
    reason: Option<String>,
    why: Option<Why>,
) -> ReplyEv {
    ReplyEv::Done(Reply {
        req: room.gen.0,
        status: status.0,
        tokens,
        reason,
        why,
    })
}

impl<G: Gpu, R: NodeRuntime<Kv = G::Kv>> NodeLoop<G, R> {
    /// Hand the worker front `input` and carry out its effects in order: a delivery
    /// to the node is a step of the node (whose messages to the router come back to
    /// the front as answers), an input handed back is handled after them.
    fn feed_front(&mut self, input: FrontInput) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let Some(front) = self.io.front.as_mut() else {
                return;
            };
            let router = front.router();
            let mut out = Vec::new();
            front.handle(input, &mut out);
            for e in out {
                match self.io.front_effect(e) {
                    Some(FrontEffect::ToNode(msg)) => {
                        self.dispatch(Input::Message { from: router, msg })
                    }
                    Some(FrontEffect::Then(next)) => inputs.push_back(next),
                    _ => {}
                }
            }
        }
    }

    /// Worker mode: start a half the worker front was given (`NodeEvent::StartHalf`);
    /// its answers go to `reply`.
    pub(super) fn start_half(
        &mut self,
        room: RoomKey,
        msg: Msg,
        max_new_tokens: u32,
        mut reply: ReplySink,
        (refused, prefill_epoch): (bool, Option<u32>),
    ) {
        if self.io.front.is_none() {
            reply.send(done(room, Status::UNAVAILABLE, Vec::new(), None, None));
            return;
        }
        self.io.sinks.insert(room, reply);
        let intake_open = self.intake_open && !refused;
        self.feed_front(FrontInput::Start {
            room,
            msg,
            max_new_tokens,
            prefill_epoch,
            intake_open,
        });
    }

    /// Worker mode: the worker front's client of `room` went away (`NodeEvent::AbortHalf`).
    pub(super) fn abort_half(&mut self, room: RoomKey) {
        self.feed_front(FrontInput::Abort { room });
    }

    /// Worker mode: a message from node `from`'s worker front (the pairing).
    pub(super) fn front_peer(&mut self, from: NodeId, msg: Msg) {
        self.feed_front(FrontInput::Peer { from, msg });
    }

    /// Worker mode: the front's pairing wait for `room` is over (`Timer::Pairing`).
    pub(super) fn pairing_over(&mut self, room: RoomKey) {
        self.feed_front(FrontInput::WaitOver { room });
    }
}
