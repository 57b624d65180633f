//! One-sided RDMA READ, stated once for every driver: the reader posts a read request
//! (`Msg::KvRead`, which rides the reliable connection as a KV write does:
//! [`transport`](crate::world::transport)); the source's NIC serves it here, reading
//! the source pages as they are at that moment, whoever owns them then (a NIC reads
//! no ownership record and no tag); the bytes travel back as a [`KvWrite`] posted by
//! the reader (its `id.writer`), which the reader's NIC places
//! ([`receive`](crate::world::receive)) and completes to the reader, and with which
//! NIXL's notification goes to the source (`Msg::ReadNotify`). The source's software
//! runs nothing for a read.

use crate::env::Outbox;
use crate::gpu::{ids, Gpu};
use crate::ids::{NodeId, PageTag, WriteId};
use crate::msg::{KvWrite, Msg};
use crate::trace::TraceEvent;

/// The read request `(id, src, dst)` of `reader` reaches a node, whose NIC serves it
/// into `out` (the source's effects): `source` is the node's id and memory when its
/// memory is registered for remote reads, its id otherwise (a remote access error:
/// the read fails back to its reader with one failed completion, as does a read of a
/// page outside the registration or one whose page lists disagree).
pub fn serve_read<G: Gpu>(
    source: Result<(NodeId, &G), NodeId>,
    reader: NodeId,
    (id, src, dst): (WriteId, Vec<PageTag>, Vec<PageTag>),
    out: &mut Outbox<G::Kv>,
) {
    let kv = match source {
        Ok((_, gpu)) if src.len() == dst.len() => gpu.read_pages(&ids(&src)).ok(),
        _ => None,
    };
    let (Ok((node, _)), Some(kv)) = (source, kv) else {
        out.send(reader, Msg::WriteDone { id, ok: false });
        return;
    };
    out.trace(TraceEvent::KvReadServed {
        node,
        read: id,
        src: src.clone(),
        dst: dst.clone(),
        to: reader,
    });
    out.post_write(reader, KvWrite { id, src, dst, kv });
}

/// Is the KV write `id`, arriving at `at`, the response of `at`'s own READ (posted by
/// the reader, carried from the source)? Its completion is the reader's, and it
/// carries NIXL's notification to the source.
pub fn is_read_response(at: NodeId, id: WriteId) -> bool {
    id.writer == at
}
