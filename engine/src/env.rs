//! The seam between the engine and whatever drives it: `Clock`, `Network`, `Trace`.
//!
//! Nodes never read a clock, open a socket or spawn a thread; they call these traits
//! and the driver decides what they mean (virtual time and a seeded network in the
//! simulator, nondeterministic timers and stateright's network in the model checker,
//! `Instant` and TCP on hardware). The third seam, [`crate::gpu::Gpu`], is owned by
//! each node because its memory is part of the node's state.
//!
//! Pitfall this shape avoids: a timeout is a timer the node set and then handles as an
//! input, never a comparison of `now` against a stored deadline, so a model checker
//! whose timers carry no time can fire every timeout in every order.

use crate::compute::{Done, Job};
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token, WriteId};
use crate::kv::Refusal;
use crate::msg::{KvWrite, Msg};
pub use crate::trace::Trace;
use crate::trace::TraceEvent;
use serde::{Deserialize, Serialize};

/// A timer a node can set. At most one of each value is pending per node: setting it
/// again replaces it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Timer {
    /// The node's scheduler loop has work (prefill forward and inflight poll, decode step).
    Compute,
    /// Prefill: the room never received decode's page list.
    Bootstrap(RoomKey),
    /// Decode: the room's KV never completed.
    WaitingForKv(RoomKey),
    /// Decode: ask again for the drain ack of a quarantined room. The number is the
    /// arming: how many retries the quarantine had made when decode set it. A timer
    /// wheel may deliver a cancelled or already fired timer again; decode counts a
    /// firing as a retry only when its arming is the one it set last, so a stale
    /// copy cannot use up the retry budget.
    DrainRetry(RoomKey, u32),
    /// Router: the request got no terminal answer in time.
    Request(RoomKey),
    /// vLLM prefill: the lease on a finished room's pages ran out (setting it again
    /// is a renewal).
    Lease(RoomKey),
    /// vLLM decode: renew the lease on the room's pages at its prefill (a heartbeat).
    Heartbeat(RoomKey),
    /// Prefill's worker front: the room's pairing (decode's registration, or the
    /// router's request for prefill's half) did not complete in time.
    Pairing(RoomKey),
}

impl Timer {
    /// The timer as integers: its variant's place in declaration order, its room
    /// (the default key for `Compute`) and a drain retry's arming (0 otherwise).
    /// One-to-one, and ordered as the timer is.
    pub fn parts(self) -> (u8, RoomKey, u32) {
        match self {
            Timer::Compute => (0, RoomKey::default(), 0),
            Timer::Bootstrap(r) => (1, r, 0),
            Timer::WaitingForKv(r) => (2, r, 0),
            Timer::DrainRetry(r, n) => (3, r, n),
            Timer::Request(r) => (4, r, 0),
            Timer::Lease(r) => (5, r, 0),
            Timer::Heartbeat(r) => (6, r, 0),
            Timer::Pairing(r) => (7, r, 0),
        }
    }
}

/// One input to a node: a delivered message, a fired timer, or a KV write that the
/// receiver's own copy already landed (or refused). Every input enters a node through
/// its `handle`, which applies the same peer checks to each. No input carries KV
/// bytes: a node never handles them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Input {
    Message {
        from: NodeId,
        msg: Msg,
    },
    Timer(Timer),
    /// Decode only, on a transport whose receiver software sees every write
    /// (`Semantics::receiver_sees`, two-sided): the KV write `id` of `from` was
    /// copied into (or refused by) the node's memory by the receiver's copy,
    /// [`crate::kv::land`] with the landing gate ([`crate::world::receive`]; the
    /// hardware runtime's transfer thread). The node traces it and completes the write
    /// exactly once; a landing whose sender is not the room's writer is refused.
    /// On a one-sided transport no receiver software runs, and no such input exists:
    /// the world traces the landing and the writer's NIC completes it.
    Landed {
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
    },
    /// What the device did with a [`Job`] the node asked for ([`Effect::Compute`]).
    /// Never written to a file or a schedule: a driver makes it from the job, in the
    /// step that issued it.
    #[serde(skip)]
    Computed(Done),
}

/// A timer request recorded by an [`Outbox`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimerOp {
    Set { timer: Timer, after_ns: u64 },
    Cancel { timer: Timer },
}

/// One effect of a handler call, as an [`Outbox`] records it: over `Msg`,
/// `TraceEvent` and `KvWrite<K>`, or over a driver's own forms of them (the model
/// checker keeps its sends and writes pre-routed, and applies cached effects by
/// reference, [`Effect::as_ref`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Effect<M, T = TraceEvent, W = M> {
    /// Send `msg` to `to` (a node or the client endpoint).
    Send { to: NodeId, msg: M },
    /// Post the KV write `write` into `to`'s pool: the world carries and lands it
    /// ([`crate::world::receive`]).
    Write { to: NodeId, write: W },
    /// Set or cancel one of the node's timers.
    Timer(TimerOp),
    /// An engine event for oracles and traces.
    Trace(T),
    /// Token `index` of request `req`'s reply, streamed to its client `to` as decode
    /// makes it: the router emits it once per index it takes for a request it has not
    /// answered. Not a message and not traced: no node reads it back, and the client's
    /// one answer is still the router's `Response` (a front renders the stream; a
    /// simulated client reads only the answer).
    Stream {
        to: NodeId,
        req: RequestId,
        index: u32,
        token: Token,
    },
    /// Device work for the node's device; its completion comes back as
    /// [`Input::Computed`]. [`crate::world::step`] carries it out before the driver
    /// applies the step's effects, so [`crate::world::apply`] never sees one.
    Compute(Job),
}

impl<M, T, W> Effect<M, T, W> {
    /// The same effect, borrowed.
    pub fn as_ref(&self) -> Effect<&M, &T, &W> {
        match self {
            Effect::Send { to, msg } => Effect::Send { to: *to, msg },
            Effect::Write { to, write } => Effect::Write { to: *to, write },
            Effect::Timer(op) => Effect::Timer(*op),
            Effect::Trace(t) => Effect::Trace(t),
            Effect::Stream {
                to,
                req,
                index,
                token,
            } => Effect::Stream {
                to: *to,
                req: *req,
                index: *index,
                token: *token,
            },
            Effect::Compute(job) => Effect::Compute(job.clone()),
        }
    }
}

/// What a node handler asks of its driver, and all it can ask: the effects of one
/// handler call, drained by the driver afterwards (quinn-proto's `poll_*` shape). Every driver uses it, so no
/// driver needs its own trait implementation to get the same effects.
///
/// Drain order: `effects` in the order the handler issued them, sends, timer
/// operations and events interleaved. Drivers apply them in that order
/// ([`crate::world::apply`]), so a trace shows an event before the message it
/// caused, exactly as the handler did it.
#[derive(Clone, Debug, Default)]
pub struct Outbox<K> {
    pub now_ns: u64,
    pub effects: Vec<OutEffect<K>>,
}

/// An effect as an [`Outbox`] records it.
pub type OutEffect<K> = Effect<Msg, TraceEvent, KvWrite<K>>;

impl<K> Outbox<K> {
    pub fn new(now_ns: u64) -> Self {
        Outbox {
            now_ns,
            effects: Vec::new(),
        }
    }

    /// Reuse the buffer for the next call.
    pub fn reset(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.effects.clear();
    }

    /// The messages sent, in order.
    pub fn sends(&self) -> impl Iterator<Item = (NodeId, &Msg)> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Send { to, msg } => Some((*to, msg)),
            _ => None,
        })
    }

    /// The KV writes posted, in order.
    pub fn writes(&self) -> impl Iterator<Item = (NodeId, &KvWrite<K>)> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Write { to, write } => Some((*to, write)),
            _ => None,
        })
    }

    /// The events emitted, in order.
    pub fn traces(&self) -> impl Iterator<Item = &TraceEvent> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Trace(ev) => Some(ev),
            _ => None,
        })
    }
}

/// What a node handler asks of its driver, recorded as effects in the order issued.
impl<K> Outbox<K> {
    /// Nanoseconds since the driver started. Only for metrics: nothing that reaches
    /// hashed node state may depend on it.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Ask for `timer` to fire after `after_ns` (replacing a pending one of that value).
    pub fn set_timer(&mut self, timer: Timer, after_ns: u64) {
        self.effects
            .push(Effect::Timer(TimerOp::Set { timer, after_ns }));
    }

    /// Cancel a pending timer (no effect if none is pending).
    pub fn cancel_timer(&mut self, timer: Timer) {
        self.effects.push(Effect::Timer(TimerOp::Cancel { timer }));
    }

    /// Send `msg` to `to`. Delivery is the driver's business: it may be late,
    /// duplicated, reordered or never.
    pub fn send(&mut self, to: NodeId, msg: Msg) {
        self.effects.push(Effect::Send { to, msg });
    }

    /// Post the KV write `write` into `to`'s pool (an RDMA WRITE, or a send on a
    /// two-sided transport). The world carries it: it lands once or fails with one
    /// failed completion, and what the receiver sees of it is the transport's
    /// (`world::receive`).
    pub fn post_write(&mut self, to: NodeId, write: KvWrite<K>) {
        self.effects.push(Effect::Write { to, write });
    }

    /// Ask for device work: the driver carries `job` out and hands its [`Done`] back as
    /// [`Input::Computed`] (through [`crate::world::step`]).
    pub fn compute(&mut self, job: Job) {
        self.effects.push(Effect::Compute(job));
    }

    /// Stream token `index` of `req`'s reply to its client `to` ([`Effect::Stream`]).
    pub fn stream(&mut self, to: NodeId, req: RequestId, index: u32, token: Token) {
        self.effects.push(Effect::Stream {
            to,
            req,
            index,
            token,
        });
    }

    /// Emit an event for oracles and traces (never read back by the engine).
    pub fn trace(&mut self, event: TraceEvent) {
        self.effects.push(Effect::Trace(event));
    }
}

/// What a node that posts no KV write and asks for no device work (the router, a
/// worker front) can ask of its driver: the part of an [`Outbox`] it uses, whatever
/// the KV type of the node it shares a driver with. Its handlers take `&mut dyn
/// Control`, so no KV type parameter runs through them as plumbing. Its events go
/// through [`Trace`].
pub trait Control: Trace {
    /// [`Outbox::set_timer`].
    fn set_timer(&mut self, timer: Timer, after_ns: u64);
    /// [`Outbox::cancel_timer`].
    fn cancel_timer(&mut self, timer: Timer);
    /// [`Outbox::send`].
    fn send(&mut self, to: NodeId, msg: Msg);
    /// [`Outbox::stream`].
    fn stream(&mut self, to: NodeId, req: RequestId, index: u32, token: Token);
}

impl<K> Control for Outbox<K> {
    fn set_timer(&mut self, timer: Timer, after_ns: u64) {
        Outbox::set_timer(self, timer, after_ns);
    }
    fn cancel_timer(&mut self, timer: Timer) {
        Outbox::cancel_timer(self, timer);
    }
    fn send(&mut self, to: NodeId, msg: Msg) {
        Outbox::send(self, to, msg);
    }
    fn stream(&mut self, to: NodeId, req: RequestId, index: u32, token: Token) {
        Outbox::stream(self, to, req, index, token);
    }
}

impl<K> Trace for Outbox<K> {
    fn trace(&mut self, event: TraceEvent) {
        Outbox::trace(self, event);
    }
}
