//! Starting `kvsim serve`: the backend chosen, the scenario planned, the nodes, the
//! client endpoint and the HTTP fronts started, then the wait for a signal and the
//! drain. Its arguments are [`super::args`]'s; the address lists [`super::peers`]'s.

use crate::serve::args::{Prompts, ServeArgs, Transport};
use crate::serve::peers::{node_id, node_list, parse_bootstraps, parse_peers};
use anyhow::{bail, Context, Result};
use kvsim_cuda::cuda::{CudaDevice, CudaGpu};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::EngineConfig;
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu, WireWords};
use kvsim_engine::ids::NodeId;
use kvsim_engine::transport::KvTransport;
use kvsim_engine::world::{Topology, ROUTER};
use kvsim_runtime::server::KvWire;
use kvsim_runtime::{NodePlan, ServeOptions, Server};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Duration;

/// `--gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Symbolic,
    Host,
    Cuda,
}

impl Backend {
    fn parse(name: &str) -> Result<Backend> {
        match name {
            "symbolic" => Ok(Backend::Symbolic),
            "host" => Ok(Backend::Host),
            "cuda" => Ok(Backend::Cuda),
            other => bail!("unknown --gpu `{other}` (known: symbolic, host, cuda)"),
        }
    }

    /// Real f32 pages (the memory check counts their bytes).
    fn real(self) -> bool {
        self != Backend::Symbolic
    }
}

/// CUDA device 0 with the kernels loaded, or why not: the probe's reason (no driver
/// library, no device) or the kernel module's (every PTX it tried).
/// `--transport`: NIXL needs host memory it can register, and the library at hand
/// (checked here, before any thread starts: its stub aborts on a first call that
/// cannot load it).
fn kv_wire(a: &ServeArgs, backend: Backend) -> Result<KvWire> {
    if a.transport == Transport::Tcp {
        return Ok(KvWire::Tcp);
    }
    if backend != Backend::Host {
        bail!("--transport nixl registers the KV pool's host memory: it needs --gpu host");
    }
    #[cfg(feature = "nixl")]
    {
        kvsim_runtime::nixl::available().map_err(anyhow::Error::msg)?;
        kvsim_runtime::nixl::prepare_env();
        Ok(KvWire::Nixl)
    }
    #[cfg(not(feature = "nixl"))]
    bail!("--transport nixl: this build has no NIXL (build with `--features nixl`; it needs libclang)")
}

/// The engine as `wire` carries its KV: NIXL's row (its WRITE lands with no receiver
/// code running, so no landing gate can exist; `engine/src/transport.rs`).
fn wire_engine(mut cfg: EngineConfig, wire: KvWire) -> EngineConfig {
    if wire == KvWire::Nixl {
        cfg.transport = KvTransport::Nixl;
    }
    cfg
}

fn open_cuda() -> Result<CudaDevice> {
    let dev = CudaDevice::open(0)
        .map_err(|e| anyhow::anyhow!("--gpu cuda: cannot use the CUDA backend: {e}"))?;
    println!(
        "kvsim serve: CUDA device 0 ({}), kernels from {:?}",
        dev.name(),
        dev.ptx_origin()
    );
    Ok(dev)
}

pub fn serve(a: &ServeArgs) -> Result<ExitCode> {
    let backend = Backend::parse(&a.gpu)?;
    // Probe before anything starts: no device is a clear refusal, not a late panic.
    let cuda = match backend {
        Backend::Cuda => Some(open_cuda()?),
        _ => None,
    };
    let sc = crate::cmd_sim::load_to_run(&a.scenario, backend.real(), true)?;
    let bugs = a
        .bugs
        .as_deref()
        .map(BugSet::parse)
        .transpose()
        .map_err(anyhow::Error::from)?;
    // The topology and engine only: the scenario's [faults] are the simulator's draws,
    // and a server meets real faults (the fault bed's), so none is drawn here.
    let plan = kvsim_sim::plan::Deployment::draw(&sc, a.seed.unwrap_or(sc.seed), bugs)?;
    plan.engine.validate()?;
    let kv_wire = kv_wire(a, backend)?;
    let opts = ServeOptions {
        topology: Topology {
            prefill_pools: plan.prefill_pools.clone(),
            decode_pools: plan.decode_pools.clone(),
        },
        cfg: wire_engine(a.compute.engine(&plan.engine), kv_wire),
        trace_dir: a.trace_json.clone(),
        scenario: plan.scenario.clone(),
        seed: plan.seed,
        prompts: match a.prompts {
            Prompts::Own => kvsim_runtime::PromptMode::Own,
            Prompts::Canary => kvsim_runtime::PromptMode::Canary,
        },
        worker: a.worker_http.is_some(),
        node_invariants: !a.no_invariants,
        kv_wire,
    };
    if let Some(dir) = &opts.trace_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create --trace-json {}", dir.display()))?;
    }
    if !opts.cfg.bugs.is_empty() {
        let names: Vec<&str> = opts.cfg.bugs.iter().map(|b| b.name()).collect();
        let line = format!(
            "kvsim serve: WARNING: BUG SWITCHES ON: {} (this server is deliberately unsafe)",
            names.join(",")
        );
        eprintln!("{line}");
        println!("{line}");
    }
    match (backend, cuda) {
        (Backend::Cuda, Some(dev)) => run::<CudaGpu>(a, &opts, move |pages, page_size| {
            dev.gpu(pages, page_size).map_err(|e| e.to_string())
        }),
        (Backend::Host, _) => run::<HostGpu>(a, &opts, |p, s| Ok(HostGpu::new(p, s))),
        _ => run::<SymbolicGpu>(a, &opts, |p, s| Ok(SymbolicGpu::new(p, s))),
    }
}

fn run<G>(
    a: &ServeArgs,
    opts: &ServeOptions,
    make_gpu: impl Fn(u32, u32) -> Result<G, String>,
) -> Result<ExitCode>
where
    G: Gpu + Send + 'static,
    G::Kv: Serialize + DeserializeOwned + WireWords + Send + Sync,
{
    let server: Server<G::Kv> = match &a.node {
        None => {
            let client = TcpListener::bind(&a.listen)
                .with_context(|| format!("--listen {}: cannot bind", a.listen))?;
            Server::start_all(opts, client, make_gpu)?
        }
        Some(n) => Server::start(opts, vec![this_node(a, n)?], make_gpu)?,
    };
    if server.wait_connected(Duration::from_secs(10)) {
        println!("kvsim serve: connected to every peer");
    } else {
        println!("kvsim serve: not connected to every peer yet (links keep retrying)");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("cannot install the SIGINT/SIGTERM handler")?;
    if let Some(addr) = server.client_addr() {
        println!("kvsim serve: client endpoint on {addr}");
    }
    start_fronts(&server, a, opts)?;
    let nodes: Vec<String> = server
        .status()
        .iter()
        .map(|s| format!("{} {:?}", s.node, s.role))
        .collect();
    println!(
        "kvsim serve: running {} (epoch {}; {:?}'s protocol, under {:?})",
        nodes.join(", "),
        a.epoch,
        opts.cfg.router.protocol(),
        opts.cfg.router
    );
    std::io::stdout().flush().ok();
    // Wait for SIGINT or SIGTERM.
    let _ = rx.recv();
    println!("kvsim serve: signal received: intake stopped, draining");
    std::io::stdout().flush().ok();
    let report = server.shutdown(Duration::from_secs(a.drain_secs));
    print!("{}", report.render());
    std::io::stdout().flush().ok();
    Ok(if report.drained {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--node N --peers FILE`: this process's one node, on its line's address, with the
/// client endpoint when it is the router.
fn this_node(a: &ServeArgs, n: &str) -> Result<NodePlan> {
    let id = node_id(n)?;
    let path = a.peers.as_deref().context("--node needs --peers FILE")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --peers {}", path.display()))?;
    let (peers, client) =
        parse_peers(&text).with_context(|| format!("--peers {}", path.display()))?;
    let addr = *peers
        .get(&id)
        .with_context(|| format!("--peers {}: no line for {id}", path.display()))?;
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    let client = match (id == ROUTER, client) {
        (true, Some(c)) => Some(TcpListener::bind(c).with_context(|| format!("cannot bind {c}"))?),
        (true, None) => bail!(
            "--peers {}: the router needs a `client ADDR` line",
            path.display()
        ),
        (false, _) => None,
    };
    Ok(NodePlan {
        id,
        epoch: a.epoch,
        listener,
        peers,
        client,
    })
}

/// The HTTP fronts asked for: SGLang's worker API per node (`--worker-http`) and the
/// router's SGLang-compatible front (`--http`).
fn start_fronts<K>(server: &Server<K>, a: &ServeArgs, opts: &ServeOptions) -> Result<()>
where
    K: Clone + Serialize + DeserializeOwned + WireWords + Send + Sync + std::fmt::Debug + 'static,
{
    if let (Some(h), Some(n), Some(path)) = (&a.worker_http, &a.node, &a.peers) {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --peers {}", path.display()))?;
        let boots =
            parse_bootstraps(&text).with_context(|| format!("--peers {}", path.display()))?;
        start_worker(server, h, node_id(n)?, &boots, opts, a.worker_fail_first)?;
    }
    if let (Some(list), None) = (&a.worker_http, &a.node) {
        let boots = match &a.bootstrap {
            Some(b) => node_list(b).context("--bootstrap")?,
            None => BTreeMap::new(),
        };
        for (id, addr) in node_list(list).context("--worker-http")? {
            let addr = addr.to_string();
            start_worker(server, &addr, id, &boots, opts, a.worker_fail_first)?;
        }
    }
    if let Some(h) = &a.http {
        let l = TcpListener::bind(h).with_context(|| format!("--http {h}: cannot bind"))?;
        let limits = kvsim_runtime::http::FrontLimits {
            max_connections: a.http_max_connections.max(1),
            ..Default::default()
        };
        let addr = server
            .start_http(l, limits)
            .with_context(|| format!("--http {h}"))?;
        println!("kvsim serve: http on {addr}");
    }
    Ok(())
}

/// Serve the worker API of node `id` (and a prefill node's bootstrap endpoint).
fn start_worker<K>(
    server: &Server<K>,
    addr: &str,
    id: NodeId,
    bootstraps: &BTreeMap<NodeId, SocketAddr>,
    opts: &ServeOptions,
    fail_first: u64,
) -> Result<()>
where
    K: Clone + Serialize + DeserializeOwned + WireWords + Send + Sync + std::fmt::Debug + 'static,
{
    let is_prefill = opts.topology.role(id) == Some(kvsim_engine::node::Role::Prefill);
    let bootstrap = match (is_prefill, bootstraps.get(&id)) {
        (true, Some(b)) => {
            Some(TcpListener::bind(b).with_context(|| format!("bootstrap {b}: cannot bind"))?)
        }
        (true, None) => bail!(
            "prefill node {id} needs a bootstrap address (a `bootstrap {id} ADDR` line of \
             --peers, or --bootstrap {id}=ADDR)"
        ),
        (false, _) => None,
    };
    let l =
        TcpListener::bind(addr).with_context(|| format!("--worker-http {addr}: cannot bind"))?;
    let prefills = bootstraps.iter().map(|(n, a)| (*a, *n)).collect();
    let limits = kvsim_runtime::http::FrontLimits::default();
    let bound = bootstrap.as_ref().and_then(|b| b.local_addr().ok());
    let at = server
        .start_worker(id, l, bootstrap, prefills, limits, fail_first)
        .with_context(|| format!("--worker-http {addr}"))?;
    println!("kvsim serve: worker http on {at} ({id})");
    if let Some(b) = bound {
        println!("kvsim serve: bootstrap on {b}");
    }
    Ok(())
}
