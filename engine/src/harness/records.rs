//! What the hand-stepped driver records and reports: a message in flight, a send, a
//! client's answer, what a delivery did, the log's marks and entries, a crash's report
//! and the harness's errors.

use crate::config::ConfigError;
use crate::env::Timer;
use crate::ids::{NodeId, RequestId, Token, WriteId};
use crate::msg::{Carried, Status, Why};
use crate::trace::TraceEvent;
use crate::world::{DropReason, WriteFailure};

/// A message or a KV write on its way: who sent it, to whom, and the incarnations of
/// both at the time it was sent (what [`world::Arriving`] needs to know when it
/// arrives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flight<K> {
    /// A number unique within the harness, in sending order.
    pub seq: u64,
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Carried<K>,
    /// The sender's incarnation (its pool epoch) when it sent the message.
    pub from_epoch: u32,
    /// The receiver's incarnation when the message was sent to it.
    pub to_epoch: u32,
}

/// One message a node sent (or KV write it posted), as the send log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent<K> {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: Carried<K>,
}

/// One answer the client endpoint received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientResponse {
    pub req: RequestId,
    pub status: Status,
    pub tokens: Vec<Token>,
    /// The engine's reason for a status that is not 200, where it has one.
    pub why: Option<Why>,
}

/// What became of a message the test delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// The receiver handled it.
    Handled,
    /// The world dropped it ([`world::arrival`]'s verdict).
    Dropped(DropReason),
    /// A KV write failed: nothing applied, its failed completion is now in flight.
    Failed(WriteFailure),
}

/// A point in the harness's logs; see [`Harness::mark`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub(super) events: usize,
    pub(super) sends: usize,
    pub(super) responses: usize,
    pub(super) order: usize,
}

/// One effect of a node's input as the world carried it out, in order (see
/// [`Harness::happened_since`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Happened<'a, K> {
    /// A node emitted a trace event.
    Event(NodeId, &'a TraceEvent),
    /// A node sent a message (to a node or the client).
    Sent(&'a Sent<K>),
    /// The receiver's completion of a stale duplicate was dropped
    /// ([`Harness::land_duplicate`], [`world::duplicate_completion`]).
    DuplicateCompletionDropped(NodeId),
}

/// Who puts a message on its way: a node (its send is logged) or the test itself
/// (a forged or injected message, not a node's send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sender {
    Node,
    Test,
}

/// How a message in flight meets the world: as sent, or with the injected KV write
/// failure ([`Harness::fail_write`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Delivery {
    AsSent,
    InjectedFailure,
}

/// The kinds of entries of the ordered log, which indexes the event and send logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Logged {
    Event,
    Send,
    DroppedCompletion(NodeId),
}

/// What a crash did ([`Harness::crash_report`]): the incarnation that died, the one
/// that replaced it, the dead incarnation's flushed KV writes, and the KV writes to it
/// that failed back to their writers (writer, crashed node, write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashReport {
    pub dead: u32,
    pub epoch: u32,
    pub flushed: Vec<WriteId>,
    pub failed: Vec<(NodeId, NodeId, WriteId)>,
}

/// A request of the test the harness cannot carry out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("no message in flight at index {index} ({len} in flight)")]
    NoSuchFlight { index: usize, len: usize },
    #[error("no message in flight matches {0}")]
    NoMatch(String),
    #[error("{node} has no pending {timer:?} timer")]
    NoSuchTimer { node: NodeId, timer: Timer },
    #[error("{0} is not a node of this topology")]
    NoSuchNode(NodeId),
    #[error("{0} cannot crash (only prefill and decode nodes restart)")]
    CannotCrash(NodeId),
    #[error("not settled after {0} steps")]
    NotSettled(usize),
}
