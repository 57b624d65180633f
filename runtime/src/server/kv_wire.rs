//! What a node needs of its KV wire besides its links ([`WireParts`]): nothing over
//! TCP; over NIXL, a decode node's registered memory and the frame its links send
//! first, or a prefill node's writer (the path its writes take and the book its
//! readers feed).

use crate::kvpath::{KvPath, RemoteBook};
use crate::net::Hello;
use crate::node::event::NodeEvent;
use crate::node::step::RuntimeNode;
use crate::server::options::{KvWire, ServeError};
use crate::sync::atomic::AtomicBool;
use crate::sync::mpsc::Sender;
use crate::sync::Arc;
use kvsim_engine::gpu::{Gpu, WireWords};
use kvsim_engine::ids::NodeId;

/// A node's parts of its KV wire.
pub(super) struct WireParts<K> {
    /// The frame each of its links writes first.
    pub hello: Hello,
    /// Its readers feed this book (a writer's).
    pub book: Option<Arc<dyn RemoteBook>>,
    /// Its outgoing messages are offered to this path first.
    pub path: Option<Arc<dyn KvPath<K>>>,
    /// What must live as long as the node (a receiver's registrations).
    pub keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl<K> Default for WireParts<K> {
    fn default() -> Self {
        WireParts {
            hello: None,
            book: None,
            path: None,
            keep: None,
        }
    }
}

/// The parts of `wire` for node `id`, whose loop takes events on `tx`, until `stop`.
pub(super) fn wire_parts<K, G>(
    wire: KvWire,
    id: NodeId,
    node: &RuntimeNode<G>,
    tx: &Sender<NodeEvent<K>>,
    stop: &Arc<AtomicBool>,
) -> Result<WireParts<K>, ServeError>
where
    K: WireWords + Send + 'static,
    G: Gpu<Kv = K> + Send + 'static,
{
    match wire {
        KvWire::Tcp => Ok(WireParts::default()),
        KvWire::Nixl => nixl_parts(id, node, tx, stop),
    }
}

#[cfg(feature = "nixl")]
fn nixl_parts<K, G>(
    id: NodeId,
    node: &RuntimeNode<G>,
    tx: &Sender<NodeEvent<K>>,
    stop: &Arc<AtomicBool>,
) -> Result<WireParts<K>, ServeError>
where
    K: WireWords + Send + 'static,
    G: Gpu<Kv = K> + Send + 'static,
{
    use crate::nixl::{NixlReceiver, NixlWriter};
    use kvsim_engine::node::Node;
    let fail = |reason: String| ServeError::Nixl { node: id, reason };
    match node {
        Node::Decode(d) => {
            let mut gpu = d.gpu().clone();
            let why = "the KV backend's pages are not host memory NIXL can register (--gpu host)";
            let memory = gpu.host_memory().ok_or_else(|| fail(why.into()))?;
            let owned = (
                Box::new(gpu) as Box<dyn std::any::Any + Send + Sync>,
                memory,
            );
            let r = NixlReceiver::start(id, owned, tx.clone(), stop.clone()).map_err(fail)?;
            Ok(WireParts {
                hello: Some(Arc::new(r.hello().map_err(fail)?)),
                keep: Some(r),
                ..WireParts::default()
            })
        }
        Node::Prefill(_) => {
            let w = NixlWriter::start(id, tx.clone(), stop.clone()).map_err(fail)?;
            Ok(WireParts {
                book: Some(w.clone()),
                path: Some(w),
                ..WireParts::default()
            })
        }
        Node::VllmPrefill(_) => Err(fail(
            "vLLM's pull protocol is not served over NIXL (its READ path in the runtime is issue 36's)".into(),
        )),
        Node::Router(_) => Ok(WireParts::default()),
    }
}

#[cfg(not(feature = "nixl"))]
fn nixl_parts<K, G>(
    id: NodeId,
    _node: &RuntimeNode<G>,
    _tx: &Sender<NodeEvent<K>>,
    _stop: &Arc<AtomicBool>,
) -> Result<WireParts<K>, ServeError>
where
    G: Gpu<Kv = K>,
{
    Err(ServeError::Nixl {
        node: id,
        reason: "this build has no NIXL (build with `--features nixl`; its build needs \
                 libclang)"
            .into(),
    })
}
