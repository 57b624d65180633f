//! Driving the nodes by hand: building them, posting and delivering messages, failing
//! writes, firing timers, cutting links, crashing and restarting nodes, settling.

use crate::config::EngineConfig;
use crate::env::{Input, Outbox, Timer};
use crate::gpu::{Gpu, SymbolicGpu};
use crate::ids::{NodeId, RequestId, RoomKey, TenantId, Token};
use crate::msg::{Carried, KvWrite, Msg};
use crate::node::Node;
use crate::nodes::role::Role;
use crate::shared_cfg::Cfg;
use crate::world::{self, Arrival, Arriving, CrashWalk, Flying, Timers, Topology, ROUTER};

use super::records::*;
use super::world::*;

/// The hand-stepped driver. See the module documentation.
pub struct Harness<G: Gpu> {
    pub(super) topo: Topology,
    pub(super) nodes: Vec<Node<G>>,
    pub(super) world: World<G::Kv>,
    pub(super) out: Outbox<G::Kv>,
}

impl Harness<SymbolicGpu> {
    /// One prefill and one decode node, each with a pool that just holds the
    /// configured context, on symbolic KV memory.
    pub fn new(cfg: EngineConfig) -> Result<Self, HarnessError> {
        let pages = pool_for_context(&cfg);
        Self::with_topology(
            cfg,
            Topology {
                prefill_pools: vec![pages],
                decode_pools: vec![pages],
            },
        )
    }

    /// Any topology, on symbolic KV memory.
    pub fn with_topology(cfg: EngineConfig, topo: Topology) -> Result<Self, HarnessError> {
        Self::with_gpu(cfg, topo, SymbolicGpu::new)
    }
}

/// The smallest pool (in pages) that holds `cfg.context_len` tokens.
pub fn pool_for_context(cfg: &EngineConfig) -> u32 {
    u32::try_from(cfg.pages_for(cfg.context_len)).unwrap_or(u32::MAX)
}

impl<G: Gpu> Harness<G> {
    /// Any topology and KV memory: `make_gpu(pages, page_size)` as in
    /// [`Topology::build`]. The config is validated and pre-flighted first.
    pub fn with_gpu(
        cfg: EngineConfig,
        topo: Topology,
        make_gpu: impl Fn(u32, u32) -> G,
    ) -> Result<Self, HarnessError> {
        cfg.validate()?;
        topo.preflight(&cfg)?;
        let nodes = topo.build(&Cfg::new(cfg), make_gpu);
        let client = topo.client();
        Ok(Harness {
            world: World {
                client,
                epochs: vec![0; client.0 as usize + 1],
                flights: Vec::new(),
                next_seq: 0,
                timers: Timers::new(),
                events: Vec::new(),
                sends: Vec::new(),
                responses: Vec::new(),
                cut: Vec::new(),
                order: Vec::new(),
                replaying: None,
            },
            topo,
            nodes,
            out: Outbox::new(0),
        })
    }

    /// Worker mode: every prefill and decode node behind its worker front, as
    /// [`Topology::build_behind_fronts`] builds them (before any step); a decode
    /// front ends its half on prefill's failure where `cancels_both`.
    pub fn behind_fronts(mut self, cancels_both: bool) -> Self {
        for n in self.nodes.iter_mut().skip(1) {
            n.put_behind(ROUTER, cancels_both);
        }
        self
    }

    // ---- the topology -------------------------------------------------------------

    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    pub fn client(&self) -> NodeId {
        self.topo.client()
    }
    pub fn prefills(&self) -> Vec<NodeId> {
        self.topo.prefill_ids()
    }
    pub fn decodes(&self) -> Vec<NodeId> {
        self.topo.decode_ids()
    }

    // ---- stepping -------------------------------------------------------------------

    /// Hand `node` one input and carry out its effects, in order, through
    /// [`world::apply`].
    fn step(&mut self, node: NodeId, input: Input) -> Result<(), HarnessError> {
        let n = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(HarnessError::NoSuchNode(node))?;
        self.out.reset(0);
        world::step(n, input, &mut self.out);
        let effects = std::mem::take(&mut self.out.effects);
        world::apply(node, effects, &mut self.world);
        Ok(())
    }

    /// The KV write `write` of `from` arrives at `node` and lands as the world says
    /// ([`world::receive`]); the effects are carried out as the receiver's.
    fn receive(
        &mut self,
        node: NodeId,
        from: NodeId,
        write: KvWrite<G::Kv>,
    ) -> Result<(), HarnessError> {
        let n = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(HarnessError::NoSuchNode(node))?;
        self.out.reset(0);
        world::receive(n, from, write, &mut self.out);
        let effects = std::mem::take(&mut self.out.effects);
        world::apply(node, effects, &mut self.world);
        Ok(())
    }

    /// Hand what arrived to its receiver: a message through its `handle`, a KV write
    /// through [`world::receive`].
    fn hand_over(&mut self, f: Flight<G::Kv>) -> Result<(), HarnessError> {
        match f.msg {
            Carried::Msg(msg) => self.step(f.to, Input::Message { from: f.from, msg }),
            Carried::Write(w) => self.receive(f.to, f.from, w),
        }
    }

    /// Put a message or a KV write in flight from `from` to `to`, as if `from` had
    /// sent it (a test forging a message from a wrong peer uses this). Returns its
    /// index. It is not logged as a send ([`Harness::sends`] lists what nodes sent).
    pub fn post(&mut self, from: NodeId, to: NodeId, msg: impl Into<Carried<G::Kv>>) -> usize {
        self.world.post(from, to, msg.into(), Sender::Test);
        self.world.flights.len() - 1
    }

    /// Post a message (or a write) and deliver it at once.
    pub fn inject(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: impl Into<Carried<G::Kv>>,
    ) -> Result<Delivered, HarnessError> {
        let msg = msg.into();
        if to == self.client() {
            self.world.post(from, to, msg, Sender::Test);
            return Ok(Delivered::Handled);
        }
        let i = self.post(from, to, msg);
        self.deliver(i)
    }

    /// A client submit, delivered to the router at once (tenant 0).
    pub fn submit(
        &mut self,
        req: u64,
        prompt: Vec<Token>,
        max_new_tokens: u32,
    ) -> Result<Delivered, HarnessError> {
        let msg = Msg::Submit {
            req: RequestId(req),
            tenant: TenantId(0),
            prompt,
            max_new_tokens,
        };
        self.inject(self.client(), ROUTER, msg)
    }

    /// A client cancel, delivered to the router at once.
    pub fn cancel(&mut self, req: u64) -> Result<Delivered, HarnessError> {
        let msg = Msg::Cancel {
            req: RequestId(req),
        };
        self.inject(self.client(), ROUTER, msg)
    }

    fn arriving(&self, f: &Flight<G::Kv>, delivery: Delivery) -> Arriving {
        Arriving {
            sender_alive: self.world.epoch(f.from) == f.from_epoch,
            receiver_alive: self.world.epoch(f.to) == f.to_epoch,
            receiver_restarted: self.world.epoch(f.to) > f.to_epoch,
            receiver_epoch: self
                .nodes
                .get(f.to.0 as usize)
                .and_then(|n| n.pool())
                .map_or(0, |p| p.epoch()),
            partitioned: self.world.cut.contains(&pair(f.from, f.to)),
            injected_failure: delivery == Delivery::InjectedFailure,
            // Every node holds the one config; a decode node's says the transport.
            transport: self
                .nodes
                .iter()
                .find_map(|n| n.as_decode())
                .map_or_else(Default::default, |d| d.config().transport),
        }
    }

    fn take_flight(&mut self, index: usize) -> Result<Flight<G::Kv>, HarnessError> {
        let len = self.world.flights.len();
        if index >= len {
            return Err(HarnessError::NoSuchFlight { index, len });
        }
        Ok(self.world.flights.remove(index))
    }

    fn arrive(&mut self, f: Flight<G::Kv>, delivery: Delivery) -> Result<Delivered, HarnessError> {
        match world::arrival(&f.msg, &self.arriving(&f, delivery)) {
            Arrival::Deliver => {
                self.hand_over(f)?;
                Ok(Delivered::Handled)
            }
            Arrival::Drop(why) => Ok(Delivered::Dropped(why)),
            Arrival::Fail { reason, completion } => {
                // The poster's NIC reports to the incarnation that posted it.
                let (to, epoch) = world::poster(&f.msg).unwrap_or((f.from, f.from_epoch));
                self.push_completion(f.to, to, epoch, completion);
                Ok(Delivered::Failed(reason))
            }
        }
    }

    /// A failed completion travelling back to `writer` (incarnation `epoch`), as the
    /// report about a write to `about`.
    fn push_completion(&mut self, about: NodeId, writer: NodeId, epoch: u32, msg: Msg) {
        let seq = self.world.next_seq;
        self.world.next_seq += 1;
        self.world.flights.push(Flight {
            seq,
            from: about,
            to: writer,
            msg: Carried::Msg(msg),
            from_epoch: self.world.epoch(about),
            to_epoch: epoch,
        });
    }

    /// Deliver the message in flight at `index` (any index: delivering a later one
    /// first is a reordering). The world decides what arrives ([`world::arrival`]).
    pub fn deliver(&mut self, index: usize) -> Result<Delivered, HarnessError> {
        let f = self.take_flight(index)?;
        self.arrive(f, Delivery::AsSent)
    }

    /// Deliver the message in flight at `index`, but hand its receiver `msg` instead
    /// if the world delivers it: a data fault the driver decided, applied to what
    /// lands ([`world::alter`]). What arrives is judged on the message as sent.
    pub fn deliver_as(
        &mut self,
        index: usize,
        msg: impl Into<Carried<G::Kv>>,
    ) -> Result<Delivered, HarnessError> {
        let mut f = self.take_flight(index)?;
        if let Arrival::Deliver = world::arrival(&f.msg, &self.arriving(&f, Delivery::AsSent)) {
            f.msg = msg.into();
        }
        self.arrive(f, Delivery::AsSent)
    }

    /// A stale duplicate `copy` of a KV write that already landed arrives again. The
    /// world's rule for an arriving write applies; one that would fail is simply gone
    /// (its writer knows nothing of it: no completion travels back), one that lands is
    /// handed to its node, whose completion of it is dropped.
    pub fn land_duplicate(&mut self, copy: Flight<G::Kv>) -> Result<Delivered, HarnessError> {
        match world::arrival(&copy.msg, &self.arriving(&copy, Delivery::AsSent)) {
            Arrival::Deliver => {}
            Arrival::Drop(why) => return Ok(Delivered::Dropped(why)),
            Arrival::Fail { reason, .. } => return Ok(Delivered::Failed(reason)),
        }
        self.world.replaying = copy.msg.write_id();
        let handled = self.hand_over(copy);
        self.world.replaying = None;
        handled.map(|()| Delivered::Handled)
    }

    /// Deliver the first message in flight that matches.
    pub fn deliver_where(
        &mut self,
        what: &str,
        pred: impl Fn(&Flight<G::Kv>) -> bool,
    ) -> Result<Delivered, HarnessError> {
        let i = self.find(what, pred)?;
        self.deliver(i)
    }

    /// Deliver the first message in flight of this kind (see [`Carried::kind`]) to
    /// `to` about `room`.
    pub fn deliver_for(
        &mut self,
        kind: &str,
        to: NodeId,
        room: RoomKey,
    ) -> Result<Delivered, HarnessError> {
        let what = format!("{kind} to {to} for {room}");
        self.deliver_where(&what, |f| {
            f.msg.kind() == kind && f.to == to && f.msg.room() == Some(room)
        })
    }

    /// Deliver the first message in flight of this kind (see [`Carried::kind`]) to
    /// `to`.
    pub fn deliver_kind(&mut self, kind: &str, to: NodeId) -> Result<Delivered, HarnessError> {
        let what = format!("{kind} to {to}");
        self.deliver_where(&what, |f| f.msg.kind() == kind && f.to == to)
    }

    /// Fail the KV write in flight at `index` (the injected write failure): nothing of
    /// it lands and its failed completion goes into flight. A message that is not a
    /// KV write is unaffected by the injection and is delivered as usual.
    pub fn fail_write(&mut self, index: usize) -> Result<Delivered, HarnessError> {
        let f = self.take_flight(index)?;
        self.arrive(f, Delivery::InjectedFailure)
    }

    /// Lose the message at `index` (the network lost it). For a KV write this is
    /// outside the fault model (RDMA never loses a write silently): use
    /// [`Harness::fail_write`] for a write that does not land.
    pub fn drop_flight(&mut self, index: usize) -> Result<Flight<G::Kv>, HarnessError> {
        self.take_flight(index)
    }

    /// Put a copy of the message at `index` in flight (a duplicate delivery); returns
    /// the copy's index.
    pub fn duplicate(&mut self, index: usize) -> Result<usize, HarnessError> {
        let len = self.world.flights.len();
        let mut copy = self
            .world
            .flights
            .get(index)
            .cloned()
            .ok_or(HarnessError::NoSuchFlight { index, len })?;
        copy.seq = self.world.next_seq;
        self.world.next_seq += 1;
        self.world.flights.push(copy);
        Ok(len)
    }

    /// Fire a pending timer of `node` (any of them, in any order).
    pub fn fire(&mut self, node: NodeId, timer: Timer) -> Result<(), HarnessError> {
        if self.world.timers.take(node, timer).is_none() {
            return Err(HarnessError::NoSuchTimer { node, timer });
        }
        self.step(node, Input::Timer(timer))
    }

    /// Deliver `timer` to `node` again, whether or not it is pending (a timer wheel
    /// handing out a stale entry: a timer that already fired or was cancelled). A
    /// pending timer of that value stays pending.
    pub fn refire(&mut self, node: NodeId, timer: Timer) -> Result<(), HarnessError> {
        self.step(node, Input::Timer(timer))
    }

    /// Cut `a` and `b` from each other: from now on a message between them arrives
    /// as [`world::arrival`] says a partitioned one does (control messages dropped,
    /// KV writes failed back, completions through).
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        if !self.world.cut.contains(&pair(a, b)) {
            self.world.cut.push(pair(a, b));
        }
    }

    /// Heal a partition made by [`Harness::partition`].
    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        self.world.cut.retain(|p| *p != pair(a, b));
    }

    /// Crash `node` and restart it as its next incarnation: every message in flight
    /// meets the world's crash walk ([`CrashWalk`], with [`world::crash_fate`]), the node's timers die, and the node restarts
    /// with the next epoch. Returns the new epoch. (A node that stays down is not
    /// modelled here: the restart is immediate.)
    pub fn crash_restart(&mut self, node: NodeId) -> Result<u32, HarnessError> {
        self.crash_report(node).map(|r| r.epoch)
    }

    /// [`Harness::crash_restart`], saying what the crash did to the messages in
    /// flight.
    pub fn crash_report(&mut self, node: NodeId) -> Result<CrashReport, HarnessError> {
        let dead = match self.nodes.get(node.0 as usize) {
            Some(n) if n.role() != Role::Router => n.pool().map_or(0, |p| p.epoch()),
            Some(_) => return Err(HarnessError::CannotCrash(node)),
            None => return Err(HarnessError::NoSuchNode(node)),
        };
        let flights = std::mem::take(&mut self.world.flights);
        let walk = CrashWalk::new(node, dead).walk(flights, |f| {
            Some(Flying {
                from: f.from,
                to: f.to,
                msg: &f.msg,
                epochs: Some((f.from_epoch, f.to_epoch)),
                duplicate: false,
            })
        });
        let mut report = CrashReport {
            dead,
            epoch: walk.epoch(),
            flushed: walk.flushed,
            failed: Vec::new(),
        };
        self.world.flights = walk.kept.into_iter().map(|(f, _)| f).collect();
        for (f, done) in walk.failed {
            if let Some(write) = done.write_id() {
                report.failed.push((f.from, f.to, write));
            }
            // To its poster: a write's sender, or the reader of a READ response.
            let (poster, epoch) = if f.to == node {
                (f.from, f.from_epoch)
            } else {
                (f.to, f.to_epoch)
            };
            self.push_completion(node, poster, epoch, done);
        }
        self.world.timers.crash(node);
        if let Some(n) = self.nodes.get_mut(node.0 as usize) {
            world::restart(n, report.epoch);
        }
        if let Some(e) = self.world.epochs.get_mut(node.0 as usize) {
            *e = report.epoch;
        }
        Ok(report)
    }

    /// Deliver every message in flight, oldest first, and fire `Compute` timers when
    /// nothing is in flight, until neither is left. Timeouts (bootstrap, waiting,
    /// drain retry, request) are never fired here: a test fires those itself. Returns
    /// the steps taken.
    pub fn settle(&mut self, max_steps: usize) -> Result<usize, HarnessError> {
        for steps in 0..max_steps {
            if !self.world.flights.is_empty() {
                self.deliver(0)?;
                continue;
            }
            let compute = self.world.timers.iter().find(|(_, t)| *t == Timer::Compute);
            match compute {
                Some((node, timer)) => self.fire(node, timer)?,
                None => return Ok(steps),
            }
        }
        Err(HarnessError::NotSettled(max_steps))
    }
}
