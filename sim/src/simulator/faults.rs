//! The simulator's faults at the nodes: client cancels armed by a phase, pauses,
//! crashes (with the walk that takes a dead incarnation's events out of the queue)
//! and restarts. Not the network's faults (`network`), nor the event loop.

use super::pending::Pending;
use super::Simulator;
use crate::scenario::ReqPhase;
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::Carried;
use kvsim_engine::node::{Node, Role};
use kvsim_engine::trace::{Side, TraceEvent};
use kvsim_engine::world::{self as env_world, CrashWalk, DropReason, Flying, Travel};
use kvsim_oracle::schema::{FaultEvent, MsgView, Record};
use std::hash::Hash;

/// A queued event as the crash walk takes it out of the queue.
struct Queued<K> {
    at_ns: u64,
    seq: u64,
    ev: Pending<K>,
}

/// A queued event as the crash walk sees it: a delivery is a message in flight (a
/// replayed one a stale duplicate); any other event is not a message.
fn flying<K>(q: &Queued<K>) -> Option<Flying<'_, K>> {
    let Pending::Deliver {
        from,
        to,
        from_epoch,
        to_epoch,
        msg,
        replay,
        ..
    } = &q.ev
    else {
        return None;
    };
    Some(Flying {
        from: *from,
        to: *to,
        msg,
        epochs: Some((*from_epoch, *to_epoch)),
        duplicate: replay.is_some(),
    })
}

/// The message of a queued delivery (the ones the crash walk took out of flight).
fn delivery<K>(q: &Queued<K>) -> Option<(NodeId, NodeId, &Carried<K>)> {
    match &q.ev {
        Pending::Deliver { from, to, msg, .. } => Some((*from, *to, msg)),
        _ => None,
    }
}

impl<G: Gpu> Simulator<G> {
    /// Arm a client cancel whose phase this event reached.
    pub(super) fn trigger_cancels(&mut self, ev: &TraceEvent) {
        if self.armed.is_empty() {
            return;
        }
        let role = |n: &NodeId| self.nodes.get(n.0 as usize).map(Node::role);
        let hit = match ev {
            TraceEvent::Admitted {
                room,
                side: Side::Prefill,
                ..
            } => Some((*room, ReqPhase::PrefillAdmitted)),
            TraceEvent::PagesReserved { node, room, .. } if role(node) == Some(Role::Decode) => {
                Some((*room, ReqPhase::DecodeReserved))
            }
            TraceEvent::KvSent { write, .. } => Some((write.room, ReqPhase::KvSent)),
            TraceEvent::KvLanded { write, .. } => Some((write.room, ReqPhase::KvLanded)),
            TraceEvent::TransferAccepted { room, .. } => Some((*room, ReqPhase::TransferAccepted)),
            TraceEvent::Attend { room, step, .. } => Some((*room, ReqPhase::Decoding(*step))),
            TraceEvent::Responded {
                room,
                side: Side::Prefill,
                ..
            } => Some((*room, ReqPhase::PrefillAnswered)),
            _ => None,
        };
        let target = match (ev, hit) {
            (TraceEvent::RouterResponse { req, .. }, _) => Some((*req, ReqPhase::Answered)),
            (_, Some((room, phase))) => self.room_req.get(&room).map(|r| (*r, phase)),
            _ => None,
        };
        let Some((req, phase)) = target else {
            return;
        };
        if let Some(&(want, delay, how)) = self.armed.get(&req) {
            if want == phase {
                self.armed.remove(&req);
                self.push(self.now_ns + delay, Pending::Cancel { req, how });
            }
        }
    }

    /// If `ev` is an input of a frozen node, the instant it wakes. Its timers wait,
    /// and so does every arrival the transport says needs its process
    /// ([`KvTransport::arrival_waits_for_receiver`]); a crash does not wait (the
    /// process is killed frozen).
    pub(super) fn held_until(&self, ev: &Pending<G::Kv>) -> Option<u64> {
        let node = match ev {
            Pending::Fire { node, .. } => *node,
            Pending::Deliver { to, msg, .. }
                if *to != self.client && self.transport.arrival_waits_for_receiver(msg) =>
            {
                *to
            }
            _ => return None,
        };
        let wake = self.paused_until.get(node.0 as usize).copied()?;
        (wake > self.now_ns).then_some(wake)
    }

    /// A node freezes for `len_ns`, at most until the heal (a live one; a pause of a
    /// crashed node is nothing). Its inputs are held by [`Simulator::held_until`].
    fn pause(&mut self, node: NodeId, len_ns: u64) {
        let i = node.0 as usize;
        let heal = self.heal_at_ns.unwrap_or(u64::MAX);
        let until_ns = self.now_ns.saturating_add(len_ns).min(heal);
        if i >= self.nodes.len() || self.down[i] || until_ns <= self.now_ns {
            return;
        }
        self.paused_until[i] = self.paused_until[i].max(until_ns);
        self.stats.pauses += 1;
        self.reach.paused(node);
        self.emit(Record::Fault(FaultEvent::Pause {
            node,
            until_ns: self.paused_until[i],
        }));
    }

    /// A planned pause: it strikes now, or is armed for the node's next transfer step.
    pub(super) fn on_pause(&mut self, node: NodeId, len_ns: u64, on_transfer: bool) {
        if on_transfer {
            self.armed_pauses.push((node, len_ns));
        } else {
            self.pause(node, len_ns);
        }
    }

    /// Strike an armed pause whose node this event is a transfer step of: the node
    /// freezes once the step's handling is over (its later effects are held).
    pub(super) fn trigger_pause(&mut self, ev: &TraceEvent) {
        if self.armed_pauses.is_empty() {
            return;
        }
        let hit = self
            .armed_pauses
            .iter()
            .position(|(node, _)| crate::stall::transfer_step(*node, ev));
        if let Some(i) = hit {
            let (node, len_ns) = self.armed_pauses.remove(i);
            self.pause(node, len_ns);
        }
    }

    /// A crash: the node's incarnation dies with its timers and memory registrations
    /// (KV writes to it fail back to their writers; other messages to it reach the
    /// restarted incarnation late) and its NIC's queue (its own writes are flushed,
    /// never applied). The world's one crash walk ([`CrashWalk`], with
    /// [`env_world::crash_fate`]) decides each message in flight.
    pub(super) fn crash(&mut self, node: NodeId, restart_ns: u64) {
        let i = node.0 as usize;
        if i >= self.nodes.len() || node == self.router || self.down[i] {
            return;
        }
        self.stats.crashes += 1;
        self.reach.crashed(node);
        // A frozen process can be killed: its held inputs are in the queue, and the
        // crash walk below decides them as any other in flight.
        self.paused_until[i] = 0;
        let dead = self.epochs[i];
        self.epochs[i] += 1;
        self.down[i] = true;
        self.timers.crash(node);
        self.history.crash(node);
        let queue = self.queue.take_all().into_iter();
        let mut walk = CrashWalk::new(node, dead).walk(
            queue.map(|(at_ns, seq, ev)| Queued { at_ns, seq, ev }),
            flying,
        );
        for (mut q, travel) in std::mem::take(&mut walk.kept) {
            if travel == Travel::Late {
                // On its way to the dead incarnation: it reaches the restarted one, its
                // remaining delay counted from the restart (late, and reordered with
                // what is sent after the restart).
                let left = q.at_ns.saturating_sub(self.now_ns);
                q.at_ns = restart_ns.max(self.now_ns) + 1 + left;
            }
            self.queue.push(q.at_ns, q.seq, q.ev);
        }
        self.report_crash(walk);
        self.push(restart_ns.max(self.now_ns), Pending::Restart { node });
    }

    /// Record a crash and carry out what it did to the messages in flight: flushed
    /// writes, lost messages, failed-back writes.
    fn report_crash(&mut self, walk: CrashWalk<Queued<G::Kv>>) {
        let CrashWalk {
            node,
            dead,
            flushed,
            failed,
            lost,
            ..
        } = walk;
        self.stats.writes_flushed += flushed.len() as u64;
        self.emit(Record::Fault(FaultEvent::Crash {
            node,
            epoch: dead,
            flushed,
        }));
        for (from, to, msg) in lost.iter().filter_map(delivery) {
            self.stats.dropped += 1;
            self.record(|| Record::Drop {
                from,
                to,
                msg: MsgView::of(msg),
                reason: DropReason::ReceiverGone,
            });
        }
        for (q, done) in failed {
            if let Some((from, to, id)) =
                delivery(&q).and_then(|(f, t, m)| Some((f, t, m.write_id()?)))
            {
                let why = env_world::crash_failure(node, to);
                self.write_failed(from, to, id, done, why);
            }
        }
    }

    pub(super) fn restart(&mut self, node: NodeId) {
        let i = node.0 as usize;
        if !self.down[i] {
            return;
        }
        self.down[i] = false;
        let epoch = self.epochs[i];
        if let Some(h) = &mut self.hash {
            (self.now_ns, node, epoch).hash(h);
        }
        env_world::restart(&mut self.nodes[i], epoch);
        self.emit(Record::Fault(FaultEvent::Restart { node, epoch }));
    }
}
