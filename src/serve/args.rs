//! `kvsim serve`'s command-line arguments: what to serve and how (`--gpu`,
//! `--compute`, `--prompts`, the fronts). Parsing only; starting the server is
//! [`super::start`]'s, reading the peers file [`super::peers`]'s.

use clap::Args;
use kvsim_engine::config::{EngineConfig, Latencies};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A scenario file (TOML): the topology, pools, engine limits and defenses to serve.
    pub scenario: PathBuf,
    /// Run only this node (`n3` or `3`); the others run in their own processes.
    #[arg(long, value_name = "N", requires = "peers")]
    pub node: Option<String>,
    /// Every node's address, one `nID ADDR` line each, plus `client ADDR` (the router's
    /// client endpoint). Needed with --node.
    #[arg(long, value_name = "FILE")]
    pub peers: Option<PathBuf>,
    /// The incarnation of this node (a restart after a kill takes a higher one).
    #[arg(long, default_value_t = 0)]
    pub epoch: u32,
    /// Bug switches to enable, comma-separated (replaces the file's list).
    #[arg(long, value_name = "LIST")]
    pub bugs: Option<String>,
    /// Seed: draws the scenario's ranges (pool sizes, limits), as `kvsim run` does.
    #[arg(long)]
    pub seed: Option<u64>,
    /// KV backend: symbolic, host (real f32 arithmetic) or cuda (host's arithmetic on
    /// CUDA device 0, kvsim-cuda; refused with the reason where there is no device).
    #[arg(long, default_value = "symbolic")]
    pub gpu: String,
    /// Write every node's trace (the documented schema) to DIR/n<ID>-e<EPOCH>.jsonl.
    #[arg(long, value_name = "DIR")]
    pub trace_json: Option<PathBuf>,
    /// The client endpoint's address when all nodes run here.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// How long to drain at SIGINT/SIGTERM before giving up, in seconds.
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,
    /// Serve the SGLang-compatible HTTP front (`/generate`, `/get_model_info`,
    /// `/get_server_info`, `/metrics`, `/health`) on ADDR (the router's process).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// Most HTTP connections open at once (beyond it 503).
    #[arg(long, value_name = "N", default_value_t = kvsim_runtime::http::MAX_CONNECTIONS)]
    pub http_max_connections: usize,
    /// What the fronts submit: `own` (the request's own token ids) or `canary` (the
    /// canary sequence of the request's id, which the trace's oracle checks each reply
    /// against; at most 65,535 requests over the server's life).
    #[arg(long, value_enum, default_value_t = Prompts::Own)]
    pub prompts: Prompts,
    /// Worker mode: serve SGLang's worker API (`/generate` with the router's bootstrap
    /// fields, `/get_server_info`, ...) for this prefill or decode node on ADDR, for
    /// SGLang's router in `--pd-disaggregation` mode. No engine router runs. A prefill
    /// node also serves its bootstrap endpoint at its `bootstrap nID ADDR` line of the
    /// peers file; decode finds prefill nodes by those lines. Without --node (every
    /// node in this process): `nID=ADDR,...`, one listener per prefill and decode node,
    /// with --bootstrap for the prefill nodes.
    #[arg(long, value_name = "ADDR")]
    pub worker_http: Option<String>,
    /// Without --node, worker mode: each prefill node's bootstrap address,
    /// `nID=ADDR,...`.
    #[arg(long, value_name = "LIST", requires = "worker_http")]
    pub bootstrap: Option<String>,
    /// Worker mode, prefill: answer the first N `/generate` requests 503 without running
    /// them (a half that fails: the router retries with a new room). For tests.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "worker_http")]
    pub worker_fail_first: u64,
    /// Do not check each node's own invariants (pool partition, ownership bookkeeping)
    /// after every input; checked by default, a violation is reported on stderr, in the
    /// trace and in the node's status.
    #[arg(long)]
    pub no_invariants: bool,
    /// What a compute pass costs: `device` (the backend's own time on the node's device
    /// thread; the scenario's `[engine.latencies]` are not slept) or `modelled` (each
    /// pass waits the scenario's modelled latency first, as in the simulator).
    #[arg(long, value_enum, default_value_t = Compute::Device)]
    pub compute: Compute,
    /// What carries KV between prefill and decode: `tcp` (kvsim's frames on the nodes'
    /// connections, copied into place by the receiver: two-sided) or `nixl` (NVIDIA's
    /// NIXL library, UCX over TCP: one-sided, a write lands with no decode code
    /// running; needs `--gpu host`, a build with `--features nixl`, and
    /// `LD_LIBRARY_PATH` at the nixl-cu12 wheel's libraries).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Tcp,
    Nixl,
}

/// `--compute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compute {
    Device,
    Modelled,
}

impl Compute {
    /// The engine configuration served: under `device` a compute pass is armed at once
    /// and its cost is the device thread's run (docs/DECISIONS.md, "Compute as an
    /// effect").
    pub(super) fn engine(self, modelled: &EngineConfig) -> EngineConfig {
        let mut cfg = modelled.clone();
        if self == Compute::Device {
            cfg.latencies = Latencies {
                prefill_forward_ns: 0,
                decode_step_ns: 0,
            };
        }
        cfg
    }
}

/// `--prompts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Prompts {
    Own,
    Canary,
}
