//! `kvsim serve`: the engine on threads, sockets and clocks (kvsim-runtime), and
//! `kvsim bench-client`, a load generator for its client endpoint.

use anyhow::{bail, Context, Result};
use clap::Args;
use kvsim_cuda::cuda::{CudaDevice, CudaGpu};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::{EngineConfig, Latencies};
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu, WireWords};
use kvsim_engine::ids::NodeId;
use kvsim_engine::world::{Topology, ROUTER};
use kvsim_runtime::{Answer, Client, NodePlan, ServeOptions, Server};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
}

/// `--compute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compute {
    Device,
    Modelled,
}

impl Compute {
    /// The engine configuration served: under `device` a compute pass is armed at once
    /// and its cost is the device thread's run (docs/ARCHITECTURE.md, "Compute as an
    /// effect").
    fn engine(self, modelled: &EngineConfig) -> EngineConfig {
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

fn node_id(s: &str) -> Result<NodeId> {
    let n = s.strip_prefix('n').unwrap_or(s);
    n.parse::<u16>()
        .map(NodeId)
        .with_context(|| format!("--node: `{s}` is not a node id (like n1)"))
}

/// The peers file: `nID ADDR` per node, `client ADDR`; `#` starts a comment.
pub fn parse_peers(text: &str) -> Result<(BTreeMap<NodeId, SocketAddr>, Option<SocketAddr>)> {
    let mut peers = BTreeMap::new();
    let mut client = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with("bootstrap ") {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!("peers line {}: expected `NAME ADDR`, got `{line}`", i + 1);
        };
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("peers line {}: `{addr}` is not an address", i + 1))?;
        if name == "client" {
            client = Some(addr);
        } else if name == "bootstrap" {
            continue;
        } else {
            let id = node_id(name).with_context(|| format!("peers line {}", i + 1))?;
            if peers.insert(id, addr).is_some() {
                bail!("peers line {}: {name} is listed twice", i + 1);
            }
        }
    }
    Ok((peers, client))
}

/// `nID=ADDR,...` (--worker-http and --bootstrap without --node).
pub fn node_list(text: &str) -> Result<BTreeMap<NodeId, SocketAddr>> {
    let mut out = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (n, addr) = item
            .split_once('=')
            .with_context(|| format!("`{item}`: expected nID=ADDR"))?;
        let id = node_id(n)?;
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("`{addr}` is not an address"))?;
        if out.insert(id, addr).is_some() {
            bail!("{id} is listed twice");
        }
    }
    Ok(out)
}

/// The peers file's `bootstrap nID ADDR` lines: each prefill node's bootstrap address.
pub fn parse_bootstraps(text: &str) -> Result<BTreeMap<NodeId, SocketAddr>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("bootstrap ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(n), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!(
                "peers line {}: expected `bootstrap nID ADDR`, got `{line}`",
                i + 1
            );
        };
        let id = node_id(n).with_context(|| format!("peers line {}", i + 1))?;
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("peers line {}: `{addr}` is not an address", i + 1))?;
        out.insert(id, addr);
    }
    Ok(out)
}

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
    let plan = kvsim_sim::plan::Plan::build(
        &sc,
        a.seed.unwrap_or(sc.seed),
        bugs,
        &kvsim_sim::plan::Reduction::default(),
    )?;
    let opts = ServeOptions {
        topology: Topology {
            prefill_pools: plan.prefill_pools.clone(),
            decode_pools: plan.decode_pools.clone(),
        },
        cfg: a.compute.engine(&plan.engine),
        trace_dir: a.trace_json.clone(),
        scenario: plan.scenario.clone(),
        seed: plan.seed,
        prompts: match a.prompts {
            Prompts::Own => kvsim_runtime::PromptMode::Own,
            Prompts::Canary => kvsim_runtime::PromptMode::Canary,
        },
        worker: a.worker_http.is_some(),
        node_invariants: !a.no_invariants,
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
        "kvsim serve: running {} (epoch {})",
        nodes.join(", "),
        a.epoch
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

/// Read the worker API's address from a server's stdout line.
pub fn worker_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: worker http on ")?
        .split(' ')
        .next()?
        .trim()
        .parse()
        .ok()
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The client endpoint of a running `kvsim serve`.
    pub addr: SocketAddr,
    /// Requests per connection.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent connections (one request at a time each).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 16)]
    pub prompt_len: u64,
    #[arg(long, default_value_t = 4)]
    pub max_new_tokens: u32,
}

/// Requests/s and latency percentiles of the endpoint at one concurrency.
pub fn bench(a: &BenchArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    let workers: Vec<_> = (0..a.concurrency)
        .map(|_| {
            let (addr, n, pl, mt) = (a.addr, a.requests, a.prompt_len, a.max_new_tokens);
            std::thread::spawn(move || -> Result<(Vec<Duration>, BTreeMap<u16, usize>)> {
                let mut c = Client::connect(addr, Duration::from_secs(30))?;
                let mut lat = Vec::with_capacity(n);
                let mut not_ok = BTreeMap::new();
                for _ in 0..n {
                    let t = Instant::now();
                    match c.request(pl, mt)? {
                        Answer::Reply(r) if r.status == 200 => {}
                        Answer::Reply(r) => *not_ok.entry(r.status).or_default() += 1,
                        Answer::Error(_) => *not_ok.entry(0).or_default() += 1,
                    }
                    lat.push(t.elapsed());
                }
                Ok((lat, not_ok))
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for w in workers {
        let (lat, bad) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        all.extend(lat);
        for (s, n) in bad {
            *counts.entry(s).or_default() += n;
        }
    }
    // Status 0 stands for a line the server refused.
    let not_ok: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    let wall = t0.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3;
    println!(
        "concurrency {}: {} requests in {:.2} s = {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, not 200: [{}]",
        a.concurrency,
        all.len(),
        wall,
        all.len() as f64 / wall,
        pct(0.5),
        pct(0.99),
        not_ok.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct BenchHttpArgs {
    /// The base URL (`http://HOST:PORT`).
    pub url: String,
    /// Requests per connection.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent connections (kept alive; one request at a time each).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 16)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 4)]
    pub max_new_tokens: u32,
    /// Stream (SSE) and measure the time to the first event.
    #[arg(long)]
    pub stream: bool,
    /// The load generator's client: `raw` (its own minimal HTTP/1.1, about as cheap as
    /// the line endpoint's client) or `ureq` (the operator tools' client, several times
    /// the CPU per request, which on shared cores is taken from the server).
    #[arg(long, value_enum, default_value_t = BenchClient::Raw)]
    pub client: BenchClient,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchClient {
    Raw,
    Ureq,
}

/// One HTTP request: (latency, time to first byte of the body, status).
fn http_once(a: &ureq::Agent, url: &str, body: &str) -> Result<(Duration, Duration, u16)> {
    use std::io::Read;
    let t = Instant::now();
    let mut resp = a
        .post(url)
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .with_context(|| url.to_string())?;
    let status = resp.status().as_u16();
    let mut r = resp.body_mut().as_reader();
    let mut buf = [0u8; 4096];
    let mut first = None;
    loop {
        let n = r.read(&mut buf).with_context(|| url.to_string())?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| t.elapsed());
    }
    let total = t.elapsed();
    Ok((total, first.unwrap_or(total), status))
}

/// One load connection of `bench-http`: `--requests` requests, one at a time, through
/// `--client`: (latency, time to first byte, status) each.
fn bench_connection(
    a: &BenchHttpArgs,
    url: &str,
    body: &str,
    host: &str,
    raw: &[u8],
) -> Result<Vec<(Duration, Duration, u16)>> {
    match a.client {
        BenchClient::Ureq => {
            let agent = kvsim_runtime::http_client::agent(Duration::from_secs(30));
            (0..a.requests)
                .map(|_| http_once(&agent, url, body))
                .collect()
        }
        // The load generator's own client, deliberately: about as cheap per request as
        // the line endpoint's client (`src/raw_http.rs`).
        BenchClient::Raw => {
            let mut c = crate::raw_http::RawClient::connect(host)?;
            (0..a.requests).map(|_| c.send(raw)).collect()
        }
    }
}

/// Requests/s, latency percentiles and time to first byte (the first token's event
/// when streaming) of an HTTP `/generate` at one concurrency.
pub fn bench_http(a: &BenchHttpArgs) -> Result<ExitCode> {
    let url = format!("{}/generate", a.url.trim_end_matches('/'));
    let prompt = vec!["x"; a.prompt_len.max(1)].join(" ");
    let body = serde_json::json!({"text": prompt, "stream": a.stream,
        "sampling_params": {"max_new_tokens": a.max_new_tokens}})
    .to_string();
    let host = a
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let raw = crate::raw_http::post_request(&host, "/generate", &body);
    let t0 = Instant::now();
    let results: Vec<Result<Vec<(Duration, Duration, u16)>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..a.concurrency.max(1))
            .map(|_| {
                let (url, body, host, raw) = (&url, &body, &host, &raw);
                s.spawn(move || bench_connection(a, url, body, host, raw))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for (_, _, s) in all.iter().filter(|(_, _, s)| *s != 200) {
        *counts.entry(*s).or_default() += 1;
    }
    let not_ok: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    let mut lat: Vec<Duration> = all.iter().map(|x| x.0).collect();
    let mut first: Vec<Duration> = all.iter().map(|x| x.1).collect();
    lat.sort();
    first.sort();
    let pct = |v: &[Duration], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "concurrency {}: {} requests in {wall:.2} s = {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, \
         first byte p50 {:.2} ms p99 {:.2} ms, not 200: [{}]",
        a.concurrency,
        all.len(),
        all.len() as f64 / wall,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&first, 0.5),
        pct(&first, 0.99),
        not_ok.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

/// Read the HTTP front's address from a server's stdout line.
pub fn http_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: http on ")?
        .trim()
        .parse()
        .ok()
}

/// Read the client endpoint's address from a server's stdout line.
pub fn endpoint_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: client endpoint on ")?
        .trim()
        .parse()
        .ok()
}

#[derive(Args, Debug)]
pub struct BenchTransferArgs {
    /// Tokens per page.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub page_size: u32,
    /// Pages per KV write.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub chunk: u32,
    /// Writes to land.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub writes: u32,
    /// Runs of each, alternating; the summary is the median ratio.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
}

/// The transfer path's GB/s against a plain TCP copy of the same bytes, run by run,
/// then the median ratio.
pub fn bench_transfer(a: &BenchTransferArgs) -> Result<ExitCode> {
    let runs = kvsim_runtime::bench::bench_transfer(a.page_size, a.chunk, a.writes, a.repeat)?;
    let mut ratios = Vec::with_capacity(runs.len());
    for (i, f) in runs.iter().enumerate() {
        let ratio = f.landed_bytes_per_s / f.tcp_bytes_per_s;
        println!(
            "run {}/{}: {:.1} MB of host KV: transfer path {:.3} GB/s landed, plain TCP copy {:.3} GB/s, ratio {:.3}",
            i + 1,
            runs.len(),
            f.kv_bytes as f64 / 1e6,
            f.landed_bytes_per_s / 1e9,
            f.tcp_bytes_per_s / 1e9,
            ratio
        );
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    let best = |f: fn(&kvsim_runtime::bench::TransferFigures) -> f64| {
        runs.iter().map(f).fold(0.0, f64::max)
    };
    println!(
        "page size {}, chunk {}: transfer path / plain TCP copy, run by run: median {:.3}, lowest {:.3}, highest {:.3}; best run / best run {:.3}",
        a.page_size,
        a.chunk,
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        best(|f| f.landed_bytes_per_s) / best(|f| f.tcp_bytes_per_s)
    );
    Ok(ExitCode::SUCCESS)
}
