//! What a server is asked to run: its options ([`ServeOptions`], with the prompts
//! its fronts submit, [`PromptMode`]), where each of its nodes listens ([`NodePlan`]),
//! and why it could not start ([`ServeError`]). Not the starting itself
//! ([`Server`](crate::server::Server)).

use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::NodeId;
use kvsim_engine::world::Topology;
use kvsim_oracle::schema::{ClockKind, RunHeader};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(#[from] kvsim_engine::ConfigError),
    #[error("node {0} is not in the topology (nodes: n0..n{1})")]
    NoSuchNode(NodeId, u16),
    #[error("no address for peer {0} in the peers file")]
    NoPeer(NodeId),
    #[error("cannot create trace file {path}: {source}")]
    Trace {
        path: String,
        source: std::io::Error,
    },
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "--epoch {epoch}: node {node} already ran as incarnation {used} (trace {trace}); an \
         epoch names one incarnation, so start it with --epoch {} or higher",
        used + 1
    )]
    EpochUsed {
        node: NodeId,
        epoch: u32,
        used: u32,
        trace: String,
    },
    #[error("{node}: --transport nixl: {reason}")]
    Nixl { node: NodeId, reason: String },
    #[error("{node}: cannot make its KV memory ({pages} pages of {page_size} slots): {reason}")]
    Gpu {
        node: NodeId,
        pages: u32,
        page_size: u32,
        reason: String,
    },
}

/// What a server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub cfg: EngineConfig,
    pub topology: Topology,
    /// Write each node's trace to `DIR/n<ID>-e<EPOCH>.jsonl`.
    pub trace_dir: Option<PathBuf>,
    /// Named in the trace header.
    pub scenario: String,
    pub seed: u64,
    /// What prompts the fronts submit.
    pub prompts: PromptMode,
    /// Worker mode: no engine router runs; each prefill and decode node serves SGLang's
    /// worker API ([`crate::worker`]) and the worker front starts and aborts its halves.
    pub worker: bool,
    /// Check each node's own invariants after every input (`--no-invariants`: off).
    pub node_invariants: bool,
    /// What carries KV between prefill and decode nodes.
    pub kv_wire: KvWire,
}

/// What carries KV between prefill and decode nodes (`kvsim serve --transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvWire {
    /// kvsim's own frames on the nodes' TCP connections, copied into place by the
    /// receiver's reader (two-sided, with the landing gate).
    #[default]
    Tcp,
    /// NVIDIA's NIXL library, UCX over TCP (one-sided: a write lands with no code of
    /// the receiver running; the `nixl` feature, `crate::nixl`).
    Nixl,
}

/// What prompts the fronts submit to the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptMode {
    /// The request's own token ids (the client's `input_ids`, or the tokenizer's ids
    /// for its text); replies are read back through the tokenizer. No request limit.
    #[default]
    Own,
    /// The canary sequence of the request's id (`kvsim_oracle::canary`), whatever the
    /// client sent: every reply token names the request and position it came from, so
    /// the trace's oracle checks each reply exactly (the header's `canary_tokens`). The
    /// scheme names at most 65,535 requests over a server's life.
    Canary,
}

impl ServeOptions {
    pub(super) fn header(&self) -> RunHeader {
        let mut h = RunHeader::new("kvsim-serve", ClockKind::Wall, &self.cfg, &self.topology);
        h.scenario = Some(self.scenario.clone());
        h.seed = Some(self.seed);
        h.canary_tokens = self.prompts == PromptMode::Canary;
        h
    }
}

/// Where one node listens and where its peers are.
pub struct NodePlan {
    pub id: NodeId,
    pub epoch: u32,
    pub listener: TcpListener,
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// The client endpoint (the router's process).
    pub client: Option<TcpListener>,
}
