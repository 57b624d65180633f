//! The simulator's traffic: sending through the faulty network model, KV writes
//! and their failures, delivery to a node or to the client, stale replays and
//! duplicates, and dispatching one input into a node. Not the fault schedule
//! (crashes, pauses, cancels live in `faults`), nor the event loop.

use super::output::ClientReply;
use super::pending::Pending;
use super::Simulator;
use crate::net::{ControlFate, WriteFate};
use kvsim_engine::env::Input;
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{
    self as env_world, Altered, Arrival, Arriving, DataFault, DropReason, Transport, WriteFailure,
};
use kvsim_oracle::schema::{FaultEvent, MsgView, Record};
use std::hash::Hash;

/// The first request id of a client that supplies a live room use's room
/// ([`Simulator::client_room`]): far above any workload's (the world's one value).
pub const CLIENT_ROOM_REQ: u64 = env_world::COLLIDING_REQ;

impl<G: Gpu> Simulator<G> {
    /// Keep a control message of a room use for a stale replay at the number's reuse.
    fn remember_control(&mut self, from: NodeId, to: NodeId, msg: &Msg) {
        let Some(room) = msg.room() else { return };
        let sent = (from, to, self.pair_epochs(from, to), msg.clone());
        let e = self
            .last_use
            .entry(room.room.0)
            .or_insert_with(|| (room, Vec::new()));
        if e.0 != room {
            if room.gen < e.0.gen {
                return;
            }
            let old = std::mem::replace(e, (room, vec![sent]));
            self.prev_use.insert(room.room.0, old);
            return;
        }
        if e.1.len() < 8 {
            e.1.push(sent);
        }
    }

    /// The current incarnations of a sender and a receiver.
    fn pair_epochs(&self, from: NodeId, to: NodeId) -> (u32, u32) {
        let epoch = |n: NodeId| self.epochs.get(n.0 as usize).copied().unwrap_or(0);
        (epoch(from), epoch(to))
    }

    /// A room number's new use was routed: maybe redeliver its previous use's control
    /// messages right now, as stale duplicates. A copy is a duplicate on the connection
    /// the message was first sent on, so it is replayed only while both ends are still
    /// the incarnations that sent and received it: a connection (TCP, or a ZMQ socket
    /// whose queue delivered the message) does not outlive either end, and no transport
    /// hands an already delivered message to the process that restarted at an address.
    pub(super) fn stale_replay(&mut self, room: RoomKey) {
        // The latest use before `room`: the last one remembered, or the one before it
        // when `room` itself already sent control messages.
        let earlier = match self.last_use.get(&room.room.0) {
            Some(u) if u.0 == room => self.prev_use.get(&room.room.0),
            u => u,
        };
        let Some((prev, msgs)) = earlier else {
            return;
        };
        if prev.gen >= room.gen || !self.net.stale_replay() {
            return;
        }
        let msgs = msgs.clone();
        for (from, to, epochs, msg) in msgs {
            if epochs != self.pair_epochs(from, to) {
                continue;
            }
            self.stats.duplicated += 1;
            self.stats.stale_replayed += 1;
            let at = self.now_ns + self.net.latency_ns();
            let msg = Carried::Msg(msg);
            self.log_send(from, to, &msg, at, true);
            self.enqueue(at, from, to, msg, false);
        }
    }

    /// The router `router` routed a room use (`routed`): maybe a client supplies the
    /// same room for a request of its own, as SGLang's worker API lets it (the worker
    /// front delivers a client's start as from the router): a start pair from request
    /// `CLIENT_ROOM_REQ + n`, with a prompt of the same length and other tokens, reaches
    /// both halves one latency after the router's own.
    pub(super) fn client_room(&mut self, router: NodeId, routed: &TraceEvent) {
        let TraceEvent::Routed {
            room,
            prefill,
            decode,
            prompt_len,
            max_new_tokens,
            ..
        } = *routed
        else {
            return;
        };
        if !self.net.client_room() {
            return;
        }
        self.stats.client_rooms += 1;
        let req = RequestId(CLIENT_ROOM_REQ + self.stats.client_rooms);
        let prompt = env_world::colliding_prompt(prompt_len);
        let at = self.now_ns + 2 * self.net.latency_ns();
        let starts =
            env_world::colliding_starts(room, (prefill, decode), req, prompt, max_new_tokens);
        for (to, msg) in starts {
            let msg = Carried::Msg(msg);
            self.log_send(router, to, &msg, at, false);
            self.enqueue(at, router, to, msg, false);
        }
    }

    /// How much later the slow writer's writes land (during the safety phase).
    fn slow_writer_delay(&self, from: NodeId) -> u64 {
        match self.slow_writer {
            Some((node, ns)) if node == from && self.heal_at_ns.is_none_or(|h| self.now_ns < h) => {
                ns
            }
            _ => 0,
        }
    }

    fn enqueue(&mut self, at_ns: u64, from: NodeId, to: NodeId, msg: Carried<G::Kv>, doomed: bool) {
        self.enqueue_write(at_ns, from, to, msg, doomed, None);
    }

    fn enqueue_write(
        &mut self,
        at_ns: u64,
        from: NodeId,
        to: NodeId,
        msg: Carried<G::Kv>,
        doomed: bool,
        data: Option<(DataFault, u64)>,
    ) {
        let (from_epoch, to_epoch) = (self.epochs[from.0 as usize], self.epochs[to.0 as usize]);
        self.push(
            at_ns,
            Pending::Deliver {
                from,
                to,
                from_epoch,
                to_epoch,
                msg,
                doomed,
                data,
                replay: None,
            },
        );
    }

    /// A node (or the client) sends a message or posts a KV write: the network model
    /// decides its fate.
    pub(super) fn send(&mut self, from: NodeId, to: NodeId, msg: impl Into<Carried<G::Kv>>) {
        let msg = msg.into();
        if let (Some(dup), Carried::Msg(m)) = (self.replaying, &msg) {
            if env_world::duplicate_completion(dup, m) {
                return;
            }
        }
        let now = self.now_ns;
        match env_world::transport(from, to, self.client, &msg) {
            Transport::Client | Transport::Completion => {
                // The client link is the harness; completions ride the reliable
                // connection.
                let at = now + self.net.latency_ns();
                self.log_send(from, to, &msg, at, false);
                self.enqueue(at, from, to, msg, false);
            }
            Transport::Write => {
                self.stats.messages += 1;
                self.stats.writes += 1;
                match self.net.write() {
                    WriteFate::Land {
                        mut after_ns,
                        late,
                        data,
                    } => {
                        after_ns += self.slow_writer_delay(from);
                        self.stats.writes_late += u64::from(late);
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue_write(now + after_ns, from, to, msg, false, data);
                    }
                    WriteFate::Fail { after_ns } => {
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue(now + after_ns, from, to, msg, true);
                    }
                }
            }
            Transport::Control => {
                self.stats.messages += 1;
                if let (true, Carried::Msg(m)) = (self.net.params().stale_replay_permille > 0, &msg)
                {
                    self.remember_control(from, to, m);
                }
                match self.net.control(true) {
                    ControlFate::Lost => {
                        self.stats.lost += 1;
                        self.record_drop((from, to), &msg, DropReason::Lost);
                    }
                    ControlFate::Deliver { after_ns, dup_ns } => {
                        if let Some(d) = dup_ns {
                            self.stats.duplicated += 1;
                            self.log_send(from, to, &msg, now + d, true);
                            self.enqueue(now + d, from, to, msg.clone(), false);
                        }
                        self.log_send(from, to, &msg, now + after_ns, false);
                        self.enqueue(now + after_ns, from, to, msg, false);
                    }
                }
            }
        }
    }

    fn log_send(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: &Carried<G::Kv>,
        at: u64,
        duplicate: bool,
    ) {
        self.record(|| Record::Send {
            from,
            to,
            msg: MsgView::of(msg),
            deliver_at_ns: at,
            duplicate,
        });
    }

    /// A KV write (or an RDMA READ) failed on the wire: it is not applied, and its one
    /// failed completion travels back to the incarnation that posted it
    /// (`world::poster`: the writer, or a READ's reader).
    pub(super) fn write_failed(
        &mut self,
        from: NodeId,
        to: NodeId,
        id: WriteId,
        completion: Msg,
        reason: WriteFailure,
    ) {
        self.stats.writes_failed += 1;
        self.reach.write_done(id);
        self.emit(Record::WriteFailed {
            from,
            to,
            write: id,
            reason,
        });
        let at = self.now_ns + self.net.latency_ns();
        self.push(
            at,
            Pending::Deliver {
                from: to,
                to: id.writer,
                from_epoch: self.epochs[to.0 as usize],
                to_epoch: id.epoch,
                msg: Carried::Msg(completion),
                doomed: false,
                data: None,
                replay: None,
            },
        );
    }

    /// What the world knows of a message's arrival from `from`'s incarnation
    /// `from_epoch` at `to`'s `to_epoch`; `None` for an address outside the topology.
    fn arriving(
        &self,
        (from, from_epoch): (NodeId, u32),
        (to, to_epoch): (NodeId, u32),
        injected_failure: bool,
    ) -> Option<Arriving> {
        let (ti, fi) = (to.0 as usize, from.0 as usize);
        if ti >= self.nodes.len() || fi >= self.epochs.len() {
            return None;
        }
        Some(Arriving {
            sender_alive: self.epochs[fi] == from_epoch,
            receiver_alive: !self.down[ti] && self.epochs[ti] == to_epoch,
            receiver_restarted: !self.down[ti] && self.epochs[ti] > to_epoch,
            receiver_epoch: self.epochs[ti],
            partitioned: self.partitioned(from, to),
            injected_failure,
            transport: self.transport,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        msg: Carried<G::Kv>,
        doomed: bool,
        data: Option<(DataFault, u64)>,
    ) {
        if to == self.client {
            if let Carried::Msg(msg) = msg {
                self.deliver_to_client(msg);
            }
            return;
        }
        let Some(at) = self.arriving((from, from_epoch), (to, to_epoch), doomed) else {
            return;
        };
        match env_world::arrival(&msg, &at) {
            Arrival::Deliver => {}
            Arrival::Drop(reason) => {
                if reason == DropReason::SenderCrashed {
                    self.stats.writes_flushed += 1;
                } else {
                    self.stats.dropped += 1;
                }
                self.record_drop((from, to), &msg, reason);
                return;
            }
            Arrival::Fail { reason, completion } => {
                if let Some(id) = msg.write_id() {
                    self.write_failed(from, to, id, completion, reason);
                }
                return;
            }
        }
        match msg {
            Carried::Msg(msg) => {
                self.record(|| Record::Deliver {
                    from,
                    to,
                    msg: MsgView::of(&msg),
                });
                self.dispatch(to, Input::Message { from, msg });
            }
            Carried::Write(w) => self.land(from, to, w, data),
        }
    }

    /// A KV write the world delivered lands at `to`, after the data fault it drew
    /// (and, for a stale duplicate, the earlier copy it schedules).
    fn land(
        &mut self,
        from: NodeId,
        to: NodeId,
        mut w: KvWrite<G::Kv>,
        data: Option<(DataFault, u64)>,
    ) {
        if self.net.params().stale_duplicate_write_permille > 0 {
            if let Some((DataFault::StaleDuplicate, salt)) = data {
                self.schedule_stale_duplicate(to, &w, salt);
            }
            self.history.remember(from, to, &w);
        }
        if let Some((fault, salt)) = data {
            self.alter_landing(from, to, &mut w, fault, salt);
        }
        self.record(|| Record::Deliver {
            from,
            to,
            msg: MsgView::of(&w),
        });
        self.receive(to, from, w);
    }

    /// A KV write landing at `to` drew a stale duplicate: queue a copy of an earlier
    /// write to `to` ([`WriteHistory::duplicate`]), if it took one.
    fn schedule_stale_duplicate(&mut self, to: NodeId, msg: &KvWrite<G::Kv>, salt: u64) {
        let Some((writer, dup, a)) = self.history.duplicate(to, msg, salt) else {
            return;
        };
        let at = self.now_ns + crate::net::stale_duplicate_delay(salt);
        let (from_epoch, to_epoch) = (dup.id.epoch, self.epochs[to.0 as usize]);
        let dup = Carried::Write(dup);
        self.log_send(writer, to, &dup, at, true);
        self.push(
            at,
            Pending::Deliver {
                from: writer,
                to,
                from_epoch,
                to_epoch,
                msg: dup,
                doomed: false,
                data: None,
                replay: Some(a),
            },
        );
    }

    /// A landing KV write suffers its drawn data fault ([`env_world::alter`]): count
    /// it and record it for the oracle.
    fn alter_landing(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: &mut KvWrite<G::Kv>,
        fault: DataFault,
        salt: u64,
    ) {
        let pages = self.header.node(to).and_then(|n| n.pool_pages).unwrap_or(0);
        let Some(a) = env_world::alter(msg, fault, pages, salt) else {
            return;
        };
        self.stats.data_faults += 1;
        match a.fault {
            DataFault::Corrupt => self.stats.corrupted += 1,
            DataFault::Misdirect => self.stats.misdirected += 1,
            DataFault::Torn => self.stats.torn += 1,
            // `alter` leaves the write itself alone; the copy is counted
            // when it lands (`deliver_duplicate`).
            DataFault::StaleDuplicate => {}
        }
        self.emit(Record::Fault(FaultEvent::data_fault(from, to, msg.id, &a)));
    }

    /// A stale duplicate of an earlier KV write arrives. The world's rule for an
    /// arriving write applies; one that would fail is simply gone (its writer knows
    /// nothing of it: no completion), one that lands is recorded as a `data_fault`
    /// and handed to its node, whose completion of it is dropped.
    pub(super) fn deliver_duplicate(
        &mut self,
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        msg: Carried<G::Kv>,
        a: Altered,
    ) {
        let Carried::Write(w) = msg else { return };
        let write = w.id;
        let msg = Carried::Write(w);
        let Some(at) = self.arriving((from, from_epoch), (to, to_epoch), false) else {
            return;
        };
        let gone = match env_world::arrival(&msg, &at) {
            Arrival::Deliver => None,
            Arrival::Drop(reason) => Some(reason),
            Arrival::Fail { reason, .. } => Some(match reason {
                WriteFailure::Partitioned => DropReason::Partitioned,
                _ => DropReason::ReceiverGone,
            }),
        };
        if let Some(reason) = gone {
            self.record_drop((from, to), &msg, reason);
            return;
        }
        self.stats.data_faults += 1;
        self.stats.stale_duplicates += 1;
        self.emit(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
        self.record(|| Record::Deliver {
            from,
            to,
            msg: MsgView::of(&msg),
        });
        let Carried::Write(w) = msg else { return };
        self.replaying = Some(write);
        self.receive(to, from, w);
        self.replaying = None;
    }

    fn deliver_to_client(&mut self, msg: Msg) {
        if let Msg::Response {
            req,
            status,
            tokens,
            ..
        } = msg
        {
            if let Some(h) = &mut self.hash {
                (self.now_ns, req, status, &tokens).hash(h);
            }
            self.emit(Record::Response {
                req,
                status,
                tokens: tokens.clone(),
            });
            self.replies
                .entry(req)
                .or_default()
                .push(ClientReply { status, tokens });
        }
    }

    /// The KV write `w` of `from` arrives at `node` and lands as the world says
    /// ([`env_world::receive`]); its effects are carried out as the receiver's.
    fn receive(&mut self, node: NodeId, from: NodeId, w: KvWrite<G::Kv>) {
        let i = node.0 as usize;
        if let Some(h) = &mut self.hash {
            (self.now_ns, node, from, &w).hash(h);
        }
        self.outbox.reset(self.now_ns);
        env_world::receive(&mut self.nodes[i], from, w, &mut self.outbox);
        let mut effects = std::mem::take(&mut self.outbox.effects);
        env_world::apply(node, effects.drain(..), self);
        self.outbox.effects = effects;
    }

    /// Feed one input to one node and carry out its effects, in the order issued.
    pub(super) fn dispatch(&mut self, node: NodeId, input: Input) {
        let i = node.0 as usize;
        if let Some(h) = &mut self.hash {
            (self.now_ns, node, &input).hash(h);
        }
        self.outbox.reset(self.now_ns);
        env_world::step(&mut self.nodes[i], input, &mut self.outbox);
        let mut effects = std::mem::take(&mut self.outbox.effects);
        env_world::apply(node, effects.drain(..), self);
        // Give the buffer back so the next call reuses its capacity.
        self.outbox.effects = effects;
    }
}
