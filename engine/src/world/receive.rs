//! A KV write arriving at its receiver, once [`arrival`](crate::world::arrival) delivered
//! it: what the receiver's NIC and software do with it, stated once for every driver
//! and read from the transport's [`Semantics`](crate::transport::Semantics) row. No
//! node handler takes a write or asks which transport carried it.

use super::read::is_read_response;
use crate::decode::DecodeNode;
use crate::env::{Input, Outbox};
use crate::gpu::Gpu;
use crate::ids::{NodeId, WriteId};
use crate::kv::landing::{writer_rule, Refusal};
use crate::kv::{PagePool, PageRecords};
use crate::msg::{KvWrite, Msg};
use crate::node::Node;
use crate::prefill::PrefillNode;
use crate::router::Router;
use crate::step::{step, Stepper};
use crate::trace::TraceEvent;
use crate::transport::CompletedBy;

/// A node as [`receive`] lands a KV write at it: the decode node whose memory is
/// registered for writes, if it is one.
pub trait Receiver<G: Gpu, P>: Stepper<G::Kv> {
    fn write_target(&mut self) -> Option<&mut DecodeNode<G, P>>;
}

impl<G: Gpu, P: PageRecords> Receiver<G, P> for Node<G, P> {
    fn write_target(&mut self) -> Option<&mut DecodeNode<G, P>> {
        match self {
            Node::Decode(d) => Some(d),
            Node::Router(_) | Node::Prefill(_) | Node::VllmPrefill(_) => None,
        }
    }
}

impl<G: Gpu, P: PageRecords> Receiver<G, P> for DecodeNode<G, P> {
    fn write_target(&mut self) -> Option<&mut DecodeNode<G, P>> {
        Some(self)
    }
}

impl<G: Gpu> Receiver<G, PagePool> for PrefillNode<G> {
    fn write_target(&mut self) -> Option<&mut DecodeNode<G, PagePool>> {
        None
    }
}

impl<G: Gpu> Receiver<G, PagePool> for Router {
    fn write_target(&mut self) -> Option<&mut DecodeNode<G, PagePool>> {
        None
    }
}

/// The KV write `write` of `from` arrives at `node`, which takes what it does in
/// `out` (the receiver's effects, applied by the driver as the receiver's):
///
/// - On a transport whose writer's NIC completes writes (one-sided RDMA): the
///   receiver's NIC places the bytes where the write points inside the registered
///   pool ([`crate::kv::land`], no gate: no receiver software runs first), the world
///   states the landing (`KvLanded`, or `KvRefused` for an address outside the pool)
///   and the completion travels back to the writer. The node runs nothing and notes
///   nothing; it learns of the transfer from the writer's `KvDone` and reads what its
///   pages store.
/// - On a transport whose receiver software completes writes (two-sided): the
///   receiver's copy checks the writer (the node's peer rule) and the pages (the
///   landing gate, defense 4b, when on), copies the bytes in, and hands the landing to
///   the node as [`Input::Landed`] through `handle`, which traces and completes it.
///
/// A node with no pool registered for writes (the router, a prefill node) takes none:
/// the write fails back to its writer, as a remote access error does.
pub fn receive<G: Gpu, P: PageRecords, N: Receiver<G, P>>(
    node: &mut N,
    from: NodeId,
    write: KvWrite<G::Kv>,
    out: &mut Outbox<G::Kv>,
) {
    let Some(d) = node.write_target() else {
        out.send(from, write.failed());
        return;
    };
    let (at, id) = (d.id(), write.id);
    // The gate exists only where receiver software sees the write (the row's
    // `receiver_sees`), and only with defense 4b on.
    let gate = d.config().landing_gated();
    // A READ's response is one-sided whatever the row: the reader's NIC places it.
    let nic = is_read_response(at, write.id);
    match d.config().transport.semantics().completed_by {
        _ if nic => {
            let landing = d.take_write(&write, false);
            nic_landed(at, from, write, landing, out);
        }
        CompletedBy::WriterNic => {
            let landing = d.take_write(&write, gate);
            nic_landed(at, from, write, landing, out);
        }
        CompletedBy::ReceiverSoftware => {
            let prefill = d.room_prefill(id.room);
            let landing = copy_in(from, id, prefill, || d.take_write(&write, gate)).and_then(|l| l);
            let dst = write.dst;
            step(
                node,
                Input::Landed {
                    from,
                    id,
                    dst,
                    landing,
                },
                out,
            );
        }
    }
}

/// The receiver's copy of a two-sided transport, stated once for every driver (this
/// module's [`receive`], the hardware runtime's transfer thread and its connection
/// readers): the writer's peer rule ([`writer_rule`], against the room's prefill
/// where the copier knows it) before any byte lands, then `land` (the landing gate
/// and the memory write, [`crate::kv::land`] or a byte transport's `land_with`). A
/// write the rule refuses runs nothing of `land`; the node hears the refusal as
/// [`Input::Landed`], refuses it again by the same rule, and completes it once.
pub fn copy_in<T>(
    from: NodeId,
    id: WriteId,
    room_prefill: Option<NodeId>,
    land: impl FnOnce() -> T,
) -> Result<T, Refusal> {
    writer_rule(from, id, room_prefill).map_err(|reason| Refusal { tag: None, reason })?;
    Ok(land())
}

/// A write the receiver's NIC placed (or refused): the world's record of it and the
/// completion the poster's NIC reports, exactly one: the writer's for a write, the
/// reader's own for a READ's response ([`is_read_response`]), which also carries
/// NIXL's notification to the source once it landed.
fn nic_landed<K>(
    at: NodeId,
    from: NodeId,
    write: KvWrite<K>,
    landing: Result<(), Refusal>,
    out: &mut Outbox<K>,
) {
    let id = write.id;
    let ok = landing.is_ok();
    match landing {
        Ok(()) => out.trace(TraceEvent::KvLanded {
            node: at,
            write: id,
            dst: write.dst,
        }),
        Err(Refusal { tag, reason }) => out.trace(TraceEvent::KvRefused {
            node: at,
            write: id,
            tag,
            reason,
        }),
    }
    if is_read_response(at, id) {
        out.send(at, Msg::WriteDone { id, ok });
        if ok {
            out.send(
                from,
                Msg::ReadNotify {
                    room: id.room,
                    rank: id.chunk,
                },
            );
        }
    } else {
        out.send(from, Msg::WriteDone { id, ok });
    }
}
