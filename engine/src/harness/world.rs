//! The hand-stepped driver's [`Driver`]: its network (the messages in flight), its
//! timers and its logs, kept apart from the nodes so that a node can be handed its
//! input while the driver takes its effects.

use crate::env::TimerOp;
use crate::ids::{NodeId, RequestId, Token, WriteId};
use crate::msg::{Carried, KvWrite, Msg};
use crate::trace::TraceEvent;
use crate::world::{self, Driver, Timers};

use super::records::*;

/// The harness's [`Driver`]: the network (messages in flight), the timers and the
/// logs. Kept apart from the nodes so that a node can be handed its input while the
/// driver takes its effects.
#[derive(Debug)]
pub(super) struct World<K> {
    pub(super) client: NodeId,
    /// Each node's current incarnation, indexed by node id (the client's is 0).
    pub(super) epochs: Vec<u32>,
    pub(super) flights: Vec<Flight<K>>,
    pub(super) next_seq: u64,
    pub(super) timers: Timers<u64>,
    pub(super) events: Vec<(NodeId, TraceEvent)>,
    pub(super) sends: Vec<Sent<K>>,
    pub(super) responses: Vec<ClientResponse>,
    /// Pairs of nodes cut from each other, each as (lower id, higher id).
    pub(super) cut: Vec<(NodeId, NodeId)>,
    /// The events, sends and dropped completions in the order they happened.
    pub(super) order: Vec<Logged>,
    /// The write whose stale duplicate is being delivered: its receiver's completion
    /// of it is dropped ([`world::duplicate_completion`]).
    pub(super) replaying: Option<WriteId>,
}

pub(super) fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl<K: Clone> World<K> {
    pub(super) fn epoch(&self, node: NodeId) -> u32 {
        self.epochs.get(node.0 as usize).copied().unwrap_or(0)
    }

    /// Put a message or a write on its way; a node's send is logged as one.
    pub(super) fn post(&mut self, from: NodeId, to: NodeId, msg: Carried<K>, sender: Sender) {
        if sender == Sender::Node {
            self.order.push(Logged::Send);
            self.sends.push(Sent {
                from,
                to,
                msg: msg.clone(),
            });
        }
        if to == self.client {
            if let Carried::Msg(Msg::Response {
                req,
                status,
                tokens,
                why,
            }) = msg
            {
                self.responses.push(ClientResponse {
                    req,
                    status,
                    tokens,
                    why,
                });
            }
            return;
        }
        let flight = Flight {
            seq: self.next_seq,
            from,
            to,
            msg,
            from_epoch: self.epoch(from),
            to_epoch: self.epoch(to),
        };
        self.next_seq += 1;
        self.flights.push(flight);
    }
}

impl<K: Clone> Driver<Msg, TraceEvent, KvWrite<K>> for World<K> {
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg) {
        if let Some(dup) = self.replaying {
            if world::duplicate_completion(dup, &msg) {
                self.order.push(Logged::DroppedCompletion(from));
                return;
            }
        }
        self.post(from, to, Carried::Msg(msg), Sender::Node);
    }

    fn write(&mut self, from: NodeId, to: NodeId, write: KvWrite<K>) {
        self.post(from, to, Carried::Write(write), Sender::Node);
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        let after = match op {
            TimerOp::Set { after_ns, .. } => after_ns,
            TimerOp::Cancel { .. } => 0,
        };
        self.timers.apply(node, op, after);
    }

    fn event(&mut self, node: NodeId, event: TraceEvent) {
        self.order.push(Logged::Event);
        self.events.push((node, event));
    }

    /// The harness's client reads only the terminal answer: the token is in the trace already (decode's `TokenOut`).
    fn stream(&mut self, _: NodeId, _: NodeId, _: RequestId, _: u32, _: Token) {}
}
