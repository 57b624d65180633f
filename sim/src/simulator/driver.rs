//! How the simulator carries out the effects a node recorded: the engine's
//! `Driver` trait for [`Simulator`]. Not the network model or the fault schedule
//! it calls into.

use super::pending::Pending;
use super::Simulator;
use kvsim_engine::env::TimerOp;
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, Token};
use kvsim_engine::msg::{KvWrite, Msg};
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::Driver;
use kvsim_oracle::schema::Record;
use std::hash::Hash;

/// The simulator carries out a node's effects: sends go through its network model,
/// timers onto its queue (a replaced or cancelled timer is recognised by its token),
/// events to the oracle and the trace, and a fault that asks for a restart crashes the
/// node now and brings it back at once.
impl<G: Gpu> Driver<Msg, TraceEvent, KvWrite<G::Kv>> for Simulator<G> {
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg) {
        Simulator::send(self, from, to, msg);
    }

    fn write(&mut self, from: NodeId, to: NodeId, write: KvWrite<G::Kv>) {
        Simulator::send(self, from, to, write);
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        match op {
            TimerOp::Set { timer, after_ns } => {
                self.seq += 1;
                let token = self.seq;
                self.timers.apply(node, op, token);
                let after = self.clocks.true_ns(node, timer, after_ns);
                let at = self.now_ns.saturating_add(after);
                self.record(|| Record::TimerSet {
                    node,
                    timer,
                    fire_at_ns: at,
                });
                self.queue
                    .push(at, token, Pending::Fire { node, timer, token });
            }
            TimerOp::Cancel { timer } => {
                if self.timers.take(node, timer).is_some() {
                    self.record(|| Record::TimerCancel { node, timer });
                }
            }
        }
    }

    fn event(&mut self, node: NodeId, ev: TraceEvent) {
        if let Some(h) = &mut self.hash {
            ev.hash(h);
        }
        self.stats.coverage.event(&ev);
        self.reach.event(&ev);
        if let TraceEvent::Routed { req, room, .. } = &ev {
            self.room_req.insert(*room, *req);
            if self.net.params().stale_replay_permille > 0 {
                self.stale_replay(*room);
            }
            if self.net.params().client_room_permille > 0 {
                self.client_room(node, &ev);
            }
        }
        // And when a use of a reused number is quarantined: a stale drain ack then is
        // what generation-blind handling gets wrong.
        if let TraceEvent::Quarantined { room, .. } = &ev {
            if self.net.params().stale_replay_permille > 0 {
                self.stale_replay(*room);
            }
        }
        self.trigger_cancels(&ev);
        self.trigger_pause(&ev);
        let restart = match &ev {
            TraceEvent::Fault { node, fault } if fault.action() == FaultAction::Restart => {
                Some(*node)
            }
            _ => None,
        };
        self.emit(Record::Engine(ev));
        if let Some(node) = restart {
            self.push(
                self.now_ns,
                Pending::Crash {
                    node,
                    restart_ns: self.now_ns,
                },
            );
        }
    }

    /// The simulated client reads only the terminal answer: the token is in the trace already (decode's `TokenOut`).
    fn stream(&mut self, _: NodeId, _: NodeId, _: RequestId, _: u32, _: Token) {}
}
