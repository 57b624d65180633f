//! The topology: which nodes exist, their ids and roles, their pools, and building
//! them for a driver.

use crate::config::EngineConfig;
use crate::config::Protocol;
use crate::decode::DecodeNode;
use crate::gpu::Gpu;
use crate::ids::NodeId;
use crate::node::Node;
use crate::nodes::role::Role;
use crate::prefill::PrefillNode;
use crate::prefill_vllm::VllmPrefill;
use crate::router::Router;
use crate::shared_cfg::Cfg;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// The router, in every topology.
pub const ROUTER: NodeId = NodeId(0);

/// Which nodes exist and how big their pools are. Ids: the router is `n0`, then the
/// prefill nodes `n1..=nP`, then the decode nodes, then the client endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Pool size in pages of each prefill node.
    pub prefill_pools: Vec<u32>,
    /// Pool size in pages of each decode node.
    pub decode_pools: Vec<u32>,
}

impl Topology {
    pub fn prefill_ids(&self) -> Vec<NodeId> {
        (1..=self.prefill_pools.len())
            .map(|i| NodeId(i as u16))
            .collect()
    }

    pub fn decode_ids(&self) -> Vec<NodeId> {
        let p = self.prefill_pools.len();
        (p + 1..=p + self.decode_pools.len())
            .map(|i| NodeId(i as u16))
            .collect()
    }

    /// The client endpoint every client shares (requests tell them apart).
    pub fn client(&self) -> NodeId {
        NodeId((1 + self.prefill_pools.len() + self.decode_pools.len()) as u16)
    }

    /// The role of a node id, `None` for the client or an unknown id.
    pub fn role(&self, node: NodeId) -> Option<Role> {
        let (i, p, d) = (
            node.0 as usize,
            self.prefill_pools.len(),
            self.decode_pools.len(),
        );
        match i {
            0 => Some(Role::Router),
            i if i <= p => Some(Role::Prefill),
            i if i <= p + d => Some(Role::Decode),
            _ => None,
        }
    }

    /// The pool size of a prefill or decode node.
    pub fn pool(&self, node: NodeId) -> Option<u32> {
        let (i, p) = (node.0 as usize, self.prefill_pools.len());
        match self.role(node)? {
            Role::Router => None,
            Role::Prefill => self.prefill_pools.get(i - 1).copied(),
            Role::Decode => self.decode_pools.get(i - 1 - p).copied(),
        }
    }

    /// Every node with its role and pool (the router has none), in id order.
    pub fn nodes(&self) -> Vec<(NodeId, Role, Option<u32>)> {
        (0..self.client().0)
            .map(NodeId)
            .filter_map(|n| Some((n, self.role(n)?, self.pool(n))))
            .collect()
    }

    /// Build the nodes, in id order. `make_gpu(pages, page_size)` makes each node's KV
    /// memory. Run [`Topology::preflight`] first.
    pub fn build<G: Gpu>(&self, cfg: &Cfg, make_gpu: impl Fn(u32, u32) -> G) -> Vec<Node<G>> {
        let (prefills, decodes) = (self.prefill_ids(), self.decode_ids());
        let mut nodes = vec![Node::Router(Router::new(
            ROUTER,
            cfg.clone(),
            prefills.clone(),
            decodes.clone(),
        ))];
        for (id, &pages) in prefills.iter().zip(&self.prefill_pools) {
            let gpu = make_gpu(pages, cfg.page_size);
            // The prefill of the router's protocol family; decode serves both.
            nodes.push(match cfg.router.protocol() {
                Protocol::Sglang => Node::Prefill(PrefillNode::new(*id, cfg.clone(), ROUTER, gpu)),
                Protocol::Vllm => {
                    Node::VllmPrefill(VllmPrefill::new(*id, cfg.clone(), ROUTER, gpu))
                }
            });
        }
        for (id, &pages) in decodes.iter().zip(&self.decode_pools) {
            nodes.push(Node::Decode(DecodeNode::new(
                *id,
                cfg.clone(),
                ROUTER,
                prefills.clone(),
                make_gpu(pages, cfg.page_size),
            )));
        }
        nodes
    }

    /// [`Topology::build`] in worker mode: each prefill and decode node sits behind
    /// its SGLang worker front (`nodes/worker/behind.rs`), which the router reaches
    /// it through; the router is then the real router in front of worker fronts (its
    /// policy `sglang-router`: the scenario's `worker_mode` requires it).
    pub fn build_behind_fronts<G: Gpu>(
        &self,
        cfg: &Cfg,
        make_gpu: impl Fn(u32, u32) -> G,
    ) -> Vec<Node<G>> {
        let mut nodes = self.build(cfg, make_gpu);
        let cancels_both = cfg.defenses.router_cancels_both;
        for n in nodes.iter_mut().skip(1) {
            n.put_behind(ROUTER, cancels_both);
        }
        nodes
    }

    /// The pre-flight rule on every node (a pool must hold the advertised context).
    pub fn preflight(&self, cfg: &EngineConfig) -> Result<(), crate::config::ConfigError> {
        for (node, role, pool) in self.nodes() {
            if let Some(pages) = pool {
                let name = match role {
                    Role::Prefill => format!("prefill node {node}"),
                    _ => format!("decode node {node}"),
                };
                cfg.preflight(&name, pages)?;
            }
        }
        Ok(())
    }
}
