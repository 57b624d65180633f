//! The engine node each role runs in a server's process ([`build_node`]): the
//! router, or a prefill or decode node over its own KV memory, and for a decode node
//! the landing of the KV writes that arrive on its listener. Not the node's loop
//! ([`crate::node`]) nor its links.

use crate::gpu::SharedGpu;
use crate::landing::{LandingRecord, WireLanding};
use crate::net::Lander;
use crate::node::event::NodeEvent;
use crate::node::step::RuntimeNode;
use crate::server::options::ServeError;
use crate::sync::mpsc::Sender;
use crate::sync::Arc;
use kvsim_engine::config::Protocol;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::{Gpu, WireWords};
use kvsim_engine::ids::NodeId;
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::SharedRecord;
use kvsim_engine::node::{Node, Role};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::prefill_vllm::VllmPrefill;
use kvsim_engine::router::Router;
use kvsim_engine::world::{self, Topology, ROUTER};
use kvsim_engine::Cfg;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// How a decode node's connections land the KV writes that arrive on them, and the
/// record they land them on (replaced at an in-process restart).
pub(super) type Transfer<K> = (Arc<dyn Lander<K>>, Arc<LandingRecord>);

/// A prefill node of the protocol its router drives, as incarnation `epoch`: SGLang's,
/// or vLLM's (a scenario under `vllm-router`), whose prefill keeps a finished room's
/// pages under a lease for decode's READ.
fn prefill_node<G: Gpu>(id: NodeId, epoch: u32, cfg: &Cfg, gpu: SharedGpu<G>) -> RuntimeNode<G> {
    let mut p = match cfg.router.protocol() {
        Protocol::Vllm => Node::VllmPrefill(VllmPrefill::new(id, cfg.clone(), ROUTER, gpu)),
        Protocol::Sglang => Node::Prefill(PrefillNode::new(id, cfg.clone(), ROUTER, gpu)),
    };
    if epoch > 0 {
        world::restart(&mut p, epoch);
    }
    p
}

/// The engine node of `role`, and for a decode node the landing of the KV writes that
/// arrive on its listener.
pub(super) fn build_node<K, G>(
    role: Role,
    id: NodeId,
    epoch: u32,
    topo: &Topology,
    cfg: &Cfg,
    make_gpu: &impl Fn(u32, u32) -> Result<G, String>,
    to_loop: &Sender<NodeEvent<K>>,
) -> Result<(RuntimeNode<G>, Option<Transfer<K>>), ServeError>
where
    K: Clone + Serialize + DeserializeOwned + WireWords + Send + Sync + std::fmt::Debug + 'static,
    G: Gpu<Kv = K> + Send + 'static,
{
    let pages = topo.pool(id).unwrap_or(0);
    let node_gpu = || {
        make_gpu(pages, cfg.page_size).map_err(|reason| ServeError::Gpu {
            node: id,
            pages,
            page_size: cfg.page_size,
            reason,
        })
    };
    Ok(match role {
        Role::Router => (
            Node::Router(Router::new(
                ROUTER,
                cfg.clone(),
                topo.prefill_ids(),
                topo.decode_ids(),
            )),
            None,
        ),
        Role::Prefill => (
            prefill_node(id, epoch, cfg, SharedGpu::new(node_gpu()?)),
            None,
        ),
        Role::Decode => {
            let pool = Arc::new(SharedPool::with_epoch(pages, cfg.page_size, epoch));
            let gpu = SharedGpu::new(node_gpu()?);
            let record = LandingRecord::new(pool.clone());
            // The runtime's KV writes ride TCP, a two-sided transport: the
            // connection's reader judges each one before its bytes land, so the
            // landing gate exists here whatever the scenario's `transport` says.
            let landing: Arc<dyn Lander<K>> = Arc::new(WireLanding {
                node: id,
                record: record.clone(),
                gpu: gpu.clone(),
                page_tags: cfg.defenses.landing_gate,
                to_loop: to_loop.clone(),
            });
            let node = DecodeNode::with_records(
                id,
                cfg.clone(),
                ROUTER,
                topo.prefill_ids(),
                gpu,
                SharedRecord::new(pool),
            );
            (Node::Decode(node), Some((landing, record)))
        }
    })
}
