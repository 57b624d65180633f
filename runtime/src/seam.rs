//! The seam of a node's loop: everything it reads and writes besides its node.
//!
//! A [`crate::node::NodeLoop`] holds the loop's own rules (one completion per write,
//! the writes in flight and their fail-back when a peer is lost, intake closing, the
//! worker front's halves). What it takes in and gives out goes through
//! [`NodeRuntime`]: the next event, a message to a peer, the clock, the trace sink.
//! A client's answers go through the [`crate::node::ReplySink`] its request came with.
//!
//! [`Threads`] is the production runtime (std channels, the process's monotonic clock,
//! the connection queues of [`crate::net`], a trace file or log); [`InMemory`] runs the same
//! loop in process, with a virtual clock, for tests of the loop's rules.

use crate::clock::Clock;
use crate::kvpath::{Carry, KvPath};
use crate::node::event::NodeEvent;
use crate::sync::atomic::{AtomicU32, Ordering};
use crate::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use crate::sync::Arc;
use crate::trace::Tracer;
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::Carried;
use kvsim_oracle::schema::Record;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// What [`NodeRuntime::next_event`] found.
#[derive(Debug)]
pub enum Next<K> {
    Event(NodeEvent<K>),
    /// Nothing came within the wait (a timer may be due).
    Idle,
    /// Nothing can come any more: the loop ends.
    Closed,
}

/// A node loop's inputs and outputs.
pub trait NodeRuntime {
    /// The KV payload of the messages it carries.
    type Kv;
    /// Monotonic nanoseconds (the node's timers run on this clock).
    fn now_ns(&self) -> u64;
    /// The next event, waiting at most `wait` (`None`: no timer is pending).
    fn next_event(&mut self, wait: Option<Duration>) -> Next<Self::Kv>;
    /// An event already queued, without waiting (`None`: nothing is queued now).
    fn ready_event(&mut self) -> Option<NodeEvent<Self::Kv>>;
    /// Put `msg` (a message or a KV write) on the link to `to`; it comes back when
    /// there is no such link.
    fn send(&mut self, to: NodeId, msg: Carried<Self::Kv>) -> Result<(), Carried<Self::Kv>>;
    /// An event for this loop itself, after the ones already queued (a write's failed
    /// completion, delivered back to its writer).
    fn to_self(&mut self, ev: NodeEvent<Self::Kv>);
    /// Whether records are kept (a record is built only when they are).
    fn tracing(&self) -> bool;
    fn trace(&mut self, rec: Record);
    /// What was traced reaches storage a killed process does not lose.
    fn flush_trace(&mut self);
    /// The node restarted in process as incarnation `epoch`: the links its dead
    /// incarnation opened close, as a killed process's connections do (a receiver then
    /// applies none of the dead one's KV writes still queued behind the connection), and
    /// the dead incarnation's KV writes still queued on them are flushed with its NIC's
    /// queue, never sent (`world::crash_fate`); its control messages travel on.
    fn close_links(&mut self, epoch: u32);
}

/// The production runtime: the loop's channel, the connection queue of each peer, the
/// process's monotonic clock and an optional trace file.
pub struct Threads<K> {
    clock: Clock,
    tracer: Option<Tracer>,
    peers: BTreeMap<NodeId, Sender<Carried<K>>>,
    me: Sender<NodeEvent<K>>,
    rx: Receiver<NodeEvent<K>>,
    /// The node's incarnation, shared with its links ([`crate::net::spawn_peer`]).
    incarnation: Arc<AtomicU32>,
    /// A KV path beside the links (`--transport nixl`): offered every outgoing
    /// message first.
    kv_path: Option<Arc<dyn KvPath<K>>>,
}

impl<K> Threads<K> {
    /// `me` and `rx` are the two ends of the loop's channel.
    pub fn new(
        tracer: Option<Tracer>,
        peers: BTreeMap<NodeId, Sender<Carried<K>>>,
        me: Sender<NodeEvent<K>>,
        rx: Receiver<NodeEvent<K>>,
    ) -> Self {
        Threads {
            clock: Clock::default(),
            tracer,
            peers,
            me,
            rx,
            incarnation: Arc::new(AtomicU32::new(0)),
            kv_path: None,
        }
    }

    /// Offer every outgoing message to `path` first (`--transport nixl`).
    pub fn with_kv_path(mut self, path: Option<Arc<dyn KvPath<K>>>) -> Self {
        self.kv_path = path;
        self
    }

    /// The incarnation cell the links of `peers` were spawned with: what
    /// [`NodeRuntime::close_links`] sets, and they read before each write.
    pub fn with_incarnation(mut self, incarnation: Arc<AtomicU32>) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The clock the loop's timers run on (a test's loops share one timeline under
    /// `--cfg shuttle`).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

impl<K> NodeRuntime for Threads<K> {
    type Kv = K;

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn ready_event(&mut self) -> Option<NodeEvent<K>> {
        self.rx.try_recv().ok()
    }

    fn next_event(&mut self, wait: Option<Duration>) -> Next<K> {
        if let Ok(ev) = self.rx.try_recv() {
            return Next::Event(ev);
        }
        // Idle: the trace reaches the file before the loop waits, so a node killed
        // while idle leaves a complete trace.
        self.flush_trace();
        match self.clock.recv(&self.rx, wait) {
            Ok(ev) => Next::Event(ev),
            Err(RecvTimeoutError::Timeout) => Next::Idle,
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
        }
    }

    fn send(&mut self, to: NodeId, msg: Carried<K>) -> Result<(), Carried<K>> {
        let msg = match &self.kv_path {
            Some(path) => match path.carry(to, msg) {
                Carry::Taken => return Ok(()),
                Carry::Undeliverable(msg) => return Err(msg),
                Carry::NotMine(msg) => msg,
            },
            None => msg,
        };
        match self.peers.get(&to) {
            Some(link) => link.send(msg).map_err(|e| e.0),
            None => Err(msg),
        }
    }

    fn to_self(&mut self, ev: NodeEvent<K>) {
        // The receiver is this loop's own: it is gone only once the loop ended.
        let _ = self.me.send(ev);
    }

    fn tracing(&self) -> bool {
        self.tracer.is_some()
    }

    fn trace(&mut self, rec: Record) {
        if let Some(t) = &mut self.tracer {
            t.write(rec);
        }
    }

    fn flush_trace(&mut self) {
        if let Some(t) = &mut self.tracer {
            t.flush();
        }
    }

    fn close_links(&mut self, epoch: u32) {
        let dead = self.incarnation.swap(epoch, Ordering::AcqRel);
        assert!(dead < epoch, "incarnation {epoch} follows {dead}");
    }
}

/// The loop in process: events queued by the test, a virtual clock that an idle wait
/// advances to the next timer, every message sent and every record kept in order.
/// Peers in `unreachable` have no link (a send to them comes back).
#[derive(Debug)]
pub struct InMemory<K> {
    pub now_ns: u64,
    pub events: VecDeque<NodeEvent<K>>,
    /// Sent and not taken yet: what is on its way on the node's links.
    pub sent: Vec<(NodeId, Carried<K>)>,
    pub records: Vec<Record>,
    pub unreachable: BTreeSet<NodeId>,
    /// How many times the trace was flushed.
    pub flushes: u64,
    /// The incarnations whose links were closed, in order ([`NodeRuntime::close_links`]).
    pub links_closed: Vec<u32>,
}

impl<K> Default for InMemory<K> {
    fn default() -> Self {
        InMemory {
            now_ns: 0,
            events: VecDeque::new(),
            sent: Vec::new(),
            records: Vec::new(),
            unreachable: BTreeSet::new(),
            flushes: 0,
            links_closed: Vec::new(),
        }
    }
}

impl<K> InMemory<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The messages sent since the last call, taken out.
    pub fn take_sent(&mut self) -> Vec<(NodeId, Carried<K>)> {
        std::mem::take(&mut self.sent)
    }
}

impl<K> NodeRuntime for InMemory<K> {
    type Kv = K;

    fn now_ns(&self) -> u64 {
        self.now_ns
    }

    fn ready_event(&mut self) -> Option<NodeEvent<K>> {
        self.events.pop_front()
    }

    fn next_event(&mut self, wait: Option<Duration>) -> Next<K> {
        if let Some(ev) = self.events.pop_front() {
            return Next::Event(ev);
        }
        match wait {
            // Nothing queued and no timer: nothing will ever come.
            None => Next::Closed,
            Some(d) => {
                let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                self.now_ns = self.now_ns.saturating_add(d);
                Next::Idle
            }
        }
    }

    fn send(&mut self, to: NodeId, msg: Carried<K>) -> Result<(), Carried<K>> {
        if self.unreachable.contains(&to) {
            return Err(msg);
        }
        self.sent.push((to, msg));
        Ok(())
    }

    fn to_self(&mut self, ev: NodeEvent<K>) {
        self.events.push_back(ev);
    }

    fn tracing(&self) -> bool {
        true
    }

    fn trace(&mut self, rec: Record) {
        self.records.push(rec);
    }

    fn close_links(&mut self, epoch: u32) {
        // `sent` is what is on its way: the dead incarnation's KV writes in it are
        // flushed (they never reach their receiver), the rest travel on.
        self.sent.retain(|(_, m)| match m {
            Carried::Write(w) => w.id.epoch >= epoch,
            Carried::Msg(_) => true,
        });
        assert!(
            self.links_closed.last().is_none_or(|&e| e < epoch),
            "epochs only grow"
        );
        self.links_closed.push(epoch);
    }

    fn flush_trace(&mut self) {
        self.flushes += 1;
    }
}
