//! What the network and the NICs do to what travels between nodes (a message or a
//! KV write, a [`Carried`]) as it travels and arrives: its path class, why it is
//! dropped, why a KV write fails, the one arrival rule of every driver and the one
//! failed completion of a failed write.

use crate::ids::NodeId;
use crate::msg::{Carried, KvWrite, Msg};
use crate::transport::{KvTransport, StaleWrite};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::hash::Hash;

/// How a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// To or from the client endpoint: the test harness's own link, never faulted.
    Client,
    /// Control traffic between nodes: may be lost, duplicated, delayed, reordered.
    Control,
    /// A KV write: lands once or fails with one failed completion; may be slow or late.
    Write,
    /// A KV write's completion, the writer NIC's report: never lost to a partition.
    Completion,
}

/// How `c` from `from` to `to` travels, given the client endpoint's id.
pub fn transport<K>(from: NodeId, to: NodeId, client: NodeId, c: &Carried<K>) -> Transport {
    match c {
        _ if from == client || to == client => Transport::Client,
        Carried::Write(_) | Carried::Msg(Msg::KvRead { .. }) => Transport::Write,
        Carried::Msg(Msg::WriteDone { .. }) => Transport::Completion,
        Carried::Msg(_) => Transport::Control,
    }
}

/// Why a message was not delivered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The network lost it.
    Lost,
    /// The two nodes were partitioned when it arrived.
    Partitioned,
    /// The receiver was down, or restarted since the message was sent (the
    /// connection it was sent on died with the old incarnation).
    ReceiverGone,
    /// A KV write of a sender that crashed: flushed from its NIC, never applied.
    SenderCrashed,
}

/// Why a KV write failed (not applied; its writer gets one failed completion).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteFailure {
    /// The injected write failure.
    Injected,
    /// Across a partition.
    Partitioned,
    /// The receiver was down or restarted since.
    ReceiverGone,
    /// The destination tags belong to an earlier incarnation of the receiver (the
    /// memory registration they name no longer exists), on a transport whose stale
    /// writes fail back ([`StaleWrite::FailsBack`]).
    StaleRegistration,
    /// The response of a READ whose source crashed while serving it: the connection
    /// is gone and the reader's NIC completes the READ with an error.
    SourceGone,
}

/// What the driver knows about a message as it arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arriving {
    /// The sender's incarnation that sent it is still the current one.
    pub sender_alive: bool,
    /// The receiver is up and is the incarnation the message was sent to.
    pub receiver_alive: bool,
    /// The receiver is up in a later incarnation than the one the message was sent to
    /// (it crashed and restarted while the message was on its way).
    pub receiver_restarted: bool,
    /// The receiver's current incarnation (its pool's epoch).
    pub receiver_epoch: u32,
    /// The sender and the receiver are partitioned right now.
    pub partitioned: bool,
    /// The driver decided to fail this write (a fault it injects).
    pub injected_failure: bool,
    /// The transport that carries KV writes (its row says what a stale write does).
    pub transport: KvTransport,
}

/// The world's verdict on one arriving message or write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The receiver handles it.
    Deliver,
    /// It is not delivered.
    Drop(DropReason),
    /// A KV write fails: nothing of it is applied, and `completion` (a failed
    /// `WriteDone`) travels back to its writer.
    Fail {
        reason: WriteFailure,
        completion: Msg,
    },
}

/// What happens to `c` as it arrives. One rule for every driver. A write it delivers
/// may then suffer a data fault the driver decided (`alter`), and lands through
/// [`receive`](crate::world::receive).
pub fn arrival<K>(c: &Carried<K>, at: &Arriving) -> Arrival {
    let msg = match c {
        Carried::Write(w) => return write_arrival(w, at),
        Carried::Msg(Msg::KvRead { id, src, .. }) => return read_arrival(*id, src, at),
        Carried::Msg(msg) => msg,
    };
    match msg {
        // A completion is the sender NIC's own report: a partition cannot lose it. The
        // incarnation that posted the write may be gone: a restarted one still gets
        // it (and must know it is not its own, by the write id's epoch).
        Msg::WriteDone { .. } if at.receiver_restarted => Arrival::Deliver,
        Msg::WriteDone { .. } if !at.receiver_alive => Arrival::Drop(DropReason::ReceiverGone),
        Msg::WriteDone { .. } => Arrival::Deliver,
        // A control message sent to an earlier incarnation reaches the restarted one
        // (a message queue that reconnects delivers what it held, as ZeroMQ, which
        // SGLang's disaggregation uses for its control messages, does): the receiver
        // must ignore what belongs to its earlier incarnation.
        _ if !at.receiver_alive && !at.receiver_restarted => {
            Arrival::Drop(DropReason::ReceiverGone)
        }
        _ if at.partitioned => Arrival::Drop(DropReason::Partitioned),
        _ => Arrival::Deliver,
    }
}

/// A KV write as it arrives: flushed with a crashed writer's NIC, failed back (the
/// receiver gone, a partition, a stale registration, an injected failure), or
/// delivered to land. A stale write to a live receiver is delivered on a transport
/// whose stale writes land (NIXL: [`StaleWrite::Lands`]); it lands where its
/// descriptors point, with the earlier epoch's tags.
pub fn write_arrival<K>(w: &KvWrite<K>, at: &Arriving) -> Arrival {
    if !at.sender_alive {
        return Arrival::Drop(DropReason::SenderCrashed);
    }
    let reason = if at.injected_failure {
        WriteFailure::Injected
    } else if !at.receiver_alive {
        WriteFailure::ReceiverGone
    } else if at.partitioned {
        WriteFailure::Partitioned
    } else if w.dst.iter().any(|t| t.gen.epoch() != at.receiver_epoch)
        && at.transport.semantics().stale_write == StaleWrite::FailsBack
    {
        WriteFailure::StaleRegistration
    } else {
        return Arrival::Deliver;
    };
    Arrival::Fail {
        reason,
        completion: w.failed(),
    }
}

/// Where the failed completion of `c` goes: the node that posted the write or the
/// READ (`id.writer`) and the incarnation that posted it (`id.epoch`). For a KV
/// write it is the node that sent it; for a READ's response, carried from the
/// source, it is the reader.
pub fn poster<K>(c: &Carried<K>) -> Option<(NodeId, u32)> {
    c.write_id().map(|id| (id.writer, id.epoch))
}

/// An RDMA READ request (`Msg::KvRead` `id` of `src`) as it arrives at its source:
/// the rule of a KV write ([`write_arrival`]), with the source pages naming the
/// registration (a read of an earlier incarnation's pages fails back).
fn read_arrival(id: crate::ids::WriteId, src: &[crate::ids::PageTag], at: &Arriving) -> Arrival {
    let probe: KvWrite<()> = KvWrite {
        id,
        src: Vec::new(),
        dst: src.to_vec(),
        kv: Vec::new(),
    };
    write_arrival(&probe, at)
}

/// `WriteDone { ok: false }` for a KV write or an RDMA READ request, `None` for any
/// other message: the one completion a failed write or read produces, which travels
/// back to the node that posted it (`id.writer`).
pub fn failed_completion<K>(c: &Carried<K>) -> Option<Msg> {
    match c {
        Carried::Write(w) => Some(w.failed()),
        Carried::Msg(Msg::KvRead { id, .. }) => Some(Msg::WriteDone { id: *id, ok: false }),
        Carried::Msg(_) => None,
    }
}
