//! The first line of a trace: [`RunHeader`] (the facts about the run that no event
//! states), its nodes and clock, the schema versions written and read, and the checks
//! that refuse a hostile header field by field. It does not hold the entries
//! ([`crate::schema::record`]) nor read lines ([`crate::schema::line`]).

use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::{Defenses, EngineConfig};
use kvsim_engine::ids::NodeId;
use kvsim_engine::node::Role;
use kvsim_engine::world::Topology;
use serde::{Deserialize, Serialize};

/// The version of the schema this crate writes.
pub const SCHEMA_VERSION: u32 = 2;

/// The versions this crate reads: version 1 (whose `KvSent` does not name its
/// receiver) is judged as version 2 (`docs/TRACE.md`, "Versions").
pub const READS_VERSIONS: [u32; 2] = [1, 2];

/// Where a trace's timestamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// Simulated nanoseconds since the start of the run (the simulator, the model).
    Simulated,
    /// Wall-clock nanoseconds (a real server).
    Wall,
}

/// One node as the header declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub role: Role,
    /// Pool size in pages (prefill and decode nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_pages: Option<u32>,
}

/// The first line of every trace: the facts about the run that no event states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunHeader {
    pub schema_version: u32,
    /// Who wrote the trace (`kvsim-sim`, `kvsim-serve`, another engine's name).
    pub source: String,
    pub clock: ClockKind,
    /// The scenario and seed, when a simulator run wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Tokens per KV page.
    pub page_size: u32,
    /// The advertised context length, in tokens.
    pub context_len: u64,
    /// Prompts over a node's limit are cut to it instead of rejected.
    #[serde(default)]
    pub allow_auto_truncate: bool,
    /// Most pages in one KV write, and most writes in flight per room.
    pub chunk_pages: u32,
    pub max_inflight_chunks: u32,
    /// The defenses on (reported with the findings they catch).
    pub defenses: Defenses,
    /// The bug switches on (names).
    pub bugs: BugSet,
    /// Every node; a trace of one node of a larger deployment lists them all.
    pub nodes: Vec<NodeInfo>,
    /// The client endpoint's id, when clients are part of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<NodeId>,
    /// Prompt token `t` belongs to request `(t >> 16) - 1` (kvsim's canary prompts), so
    /// a reply can be checked for tokens of another request.
    #[serde(default)]
    pub canary_tokens: bool,
    /// Every 200 reply is echo attention over the request's own prompt (kvsim's model):
    /// step `s` of `n` echoes the prompt token at `query_position(s, n, prompt_len)`.
    /// With `canary_tokens` the oracle then knows each reply exactly and checks it
    /// (S10, reply correctness).
    #[serde(default)]
    pub echo_replies: bool,
    /// Bounded cleanup (L6): after a request's terminal answer (`RouterResponse`),
    /// every node must have answered its half and let go of the room's pages (freed,
    /// or quarantined) within this many nanoseconds of the trace's clock. Absent: not
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_bound_ns: Option<u64>,
}

impl RunHeader {
    /// The header of a run of `cfg` on `topology`.
    pub fn new(source: &str, clock: ClockKind, cfg: &EngineConfig, topology: &Topology) -> Self {
        RunHeader {
            schema_version: SCHEMA_VERSION,
            source: source.to_string(),
            clock,
            scenario: None,
            seed: None,
            page_size: cfg.page_size,
            context_len: cfg.context_len,
            allow_auto_truncate: cfg.allow_auto_truncate,
            chunk_pages: cfg.chunk_pages,
            max_inflight_chunks: cfg.max_inflight_chunks,
            defenses: cfg.defenses,
            bugs: cfg.bugs,
            nodes: topology
                .nodes()
                .into_iter()
                .map(|(id, role, pool_pages)| NodeInfo {
                    id,
                    role,
                    pool_pages,
                })
                .collect(),
            client: Some(topology.client()),
            canary_tokens: true,
            echo_replies: true,
            cleanup_bound_ns: None,
        }
    }

    /// The most pages a header may declare for one node: the oracle keeps a record per
    /// page, so a trace from anywhere must not make it allocate without bound.
    pub const MAX_POOL_PAGES: u32 = 1 << 24;
    /// The most nodes a header may declare.
    pub const MAX_NODES: usize = 4096;

    /// The relations a header must satisfy before anything is built from it, naming the
    /// field that breaks one.
    pub fn check(&self) -> Result<(), String> {
        if self.page_size == 0 {
            return Err("header: `page_size` must be at least 1".into());
        }
        if self.nodes.len() > Self::MAX_NODES {
            return Err(format!(
                "header: `nodes` lists {} nodes; at most {}",
                self.nodes.len(),
                Self::MAX_NODES
            ));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            match (n.role, n.pool_pages) {
                (Role::Router, _) => {}
                (_, None) => {
                    return Err(format!(
                        "header: `nodes[{i}].pool_pages` is missing for a {:?} node",
                        n.role
                    ))
                }
                (_, Some(p)) if p == 0 || p > Self::MAX_POOL_PAGES => {
                    return Err(format!(
                        "header: `nodes[{i}].pool_pages` is {p}; a pool has 1 to {} pages",
                        Self::MAX_POOL_PAGES
                    ))
                }
                _ => {}
            }
            if self.nodes[..i].iter().any(|m| m.id == n.id) {
                return Err(format!("header: `nodes[{i}].id` {} appears twice", n.id));
            }
        }
        Ok(())
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The tokens a node's pool holds.
    pub fn pool_tokens(&self, id: NodeId) -> Option<u64> {
        self.node(id)
            .and_then(|n| n.pool_pages)
            .map(|p| u64::from(p) * u64::from(self.page_size))
    }

    /// The longest request (tokens) a node may admit: `min(context, pool)`.
    pub fn limit(&self, id: NodeId) -> u64 {
        self.pool_tokens(id)
            .map_or(self.context_len, |p| p.min(self.context_len))
    }
}
