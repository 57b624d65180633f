//! A process's nodes: start them (all of a topology on loopback, or one node of a
//! deployment), serve clients, report status, and end gracefully.

use crate::client::{spawn_client_endpoint, StatusFn};
use crate::gpu::SharedGpu;
use crate::net::{spawn_listener, spawn_peer, Inbound, Lander};
use crate::node::{Io, LandingRecord, NodeEvent, NodeLoop, NodeStatus, RuntimeNode, WireLanding};
use crate::seam::Threads;
use crate::trace::Tracer;
use kvsim_engine::config::EngineConfig;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::{Gpu, WireWords};
use kvsim_engine::ids::{NodeId, RoomKey, WriteId};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::SharedRecord;
use kvsim_engine::msg::Msg;
use kvsim_engine::node::{Node, Role};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{self, Topology, WritesInFlight, ROUTER};
use kvsim_engine::Cfg;
use kvsim_oracle::schema::{ClockKind, EndOutcome, FaultEvent, Record, RunHeader};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

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
    fn header(&self) -> RunHeader {
        let mut h = RunHeader::new("kvsim-serve", ClockKind::Wall, &self.cfg, &self.topology);
        h.scenario = Some(self.scenario.clone());
        h.seed = Some(self.seed);
        h.canary_tokens = self.prompts == PromptMode::Canary;
        h
    }
}

struct Handle<K> {
    id: NodeId,
    /// The incarnation the node started as in this process.
    epoch: u32,
    tx: Sender<NodeEvent<K>>,
    thread: Option<JoinHandle<()>>,
}

/// The nodes this process runs.
pub struct Server<K> {
    nodes: Vec<Handle<K>>,
    client_addr: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    connected: Vec<(NodeId, NodeId, Arc<AtomicBool>)>,
    /// The router's loop, its status and the request ids (the HTTP front shares them).
    front: Option<(Sender<NodeEvent<K>>, StatusFn, crate::http::NodesFn)>,
    next: Arc<std::sync::atomic::AtomicU64>,
    opts: ServeOptions,
}

/// Node `id`'s trace files under `dir`, by the epoch each process started with
/// (`n<ID>-e<EPOCH>.jsonl`).
fn trace_files(dir: &std::path::Path, id: NodeId) -> BTreeMap<u32, PathBuf> {
    let prefix = format!("n{}-e", id.0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    let files: BTreeMap<u32, PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let epoch = name
                .strip_prefix(&prefix)?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()?;
            Some((epoch, e.path()))
        })
        .collect();
    debug_assert!(files.values().all(|p| p.starts_with(dir)));
    files
}

/// How a process of a node ended, as its trace file tells.
struct Ended {
    /// The last incarnation it ran (a restart in process moves it on).
    last: u32,
    /// The KV writes that incarnation posted and never saw complete.
    flushed: Vec<WriteId>,
    /// Worker mode, decode: the rooms its stand-in for the router (`routed` by another
    /// node id, this node the decode) opened and never cleared.
    open_rooms: Vec<(NodeId, RoomKey)>,
}

/// How a process of node `id` ended, as its trace file tells ([`Ended`]); the writes
/// are replayed through the runtime's own in-flight record ([`WritesInFlight`]): its
/// NIC's queue, flushed with it (the receiver drops a write whose connection has
/// closed, `world::arrival`'s `SenderCrashed`).
fn replay_incarnations(path: &std::path::Path, id: NodeId, started: u32) -> Ended {
    use std::io::BufRead as _;
    let (mut last, mut writes) = (started, WritesInFlight::new());
    let mut open: BTreeMap<RoomKey, NodeId> = BTreeMap::new();
    let Ok(f) = std::fs::File::open(path) else {
        return Ended {
            last,
            flushed: Vec::new(),
            open_rooms: Vec::new(),
        };
    };
    for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
        let Ok(kvsim_oracle::schema::Line::Entry(e)) = kvsim_oracle::schema::parse_line(&line)
        else {
            continue;
        };
        match e.rec {
            // A write traced without its receiver (an older trace) cannot be followed.
            Record::Engine(TraceEvent::KvSent {
                write,
                to: Some(to),
                ..
            }) => writes.post_id(to, write),
            Record::Engine(TraceEvent::WriteCompleted { write, .. }) => {
                let to = writes.iter().find(|(_, w)| *w == write).map(|(to, _)| to);
                if let Some(to) = to {
                    writes.complete(to, write);
                }
            }
            Record::WriteFailed { to, write, .. } => {
                writes.fail(to, write);
            }
            // An in-process restart: that incarnation's crash record listed its writes.
            Record::Fault(FaultEvent::Crash { .. }) => {
                writes.crash();
            }
            Record::Fault(FaultEvent::Restart { epoch, .. }) => last = last.max(epoch),
            // The worker front's stand-in for the router lives in this process (a restart
            // in process keeps it), so only its rooms still open at the kill died with it.
            Record::Engine(TraceEvent::Routed {
                node, room, decode, ..
            }) if node != id && decode == id => {
                open.insert(room, node);
            }
            Record::Engine(TraceEvent::RoomCleared { room, .. }) => {
                open.remove(&room);
            }
            _ => {}
        }
    }
    Ended {
        last,
        flushed: writes.crash(),
        open_rooms: open.into_iter().map(|(room, node)| (node, room)).collect(),
    }
}

/// A killed process wrote no end to its trace: its successor appends one, so the audit
/// judges the run's end by the files of the incarnations still running (the node's pool
/// and rooms continue in the new epoch's file, after its `crash` and `restart` records).
/// A record the kill cut part way (the file does not end with a line's end) never
/// reached the file whole: it is cut off, and the end says so. By write-ahead nothing
/// it caused left the process (a message leaves only after its causes were written
/// out whole), so no other node's trace depends on it.
fn end_killed_process(path: &std::path::Path, id: NodeId, dead: u32) {
    use std::io::Write as _;
    // Appends go to the file's end, wherever the cut below left the cursor.
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    let torn = cut_torn_tail(&mut f).unwrap_or_else(|err| {
        eprintln!(
            "kvsim serve: cannot read the end of {}: {err}",
            path.display()
        );
        0
    });
    let e = kvsim_oracle::schema::Entry {
        at_ns: crate::clock::wall_ns(),
        seq: 0,
        rec: Record::End {
            outcome: EndOutcome::Drained,
            detail: format!(
                "incarnation {dead} was killed; node {id} continues as incarnation {}{}",
                dead + 1,
                if torn > 0 {
                    format!(
                        " (its last record, cut part way by the kill, was dropped: {torn} bytes)"
                    )
                } else {
                    String::new()
                }
            ),
        },
    };
    if let Err(err) = writeln!(f, "{}", kvsim_oracle::schema::entry_line(&e)) {
        eprintln!("kvsim serve: cannot end {}: {err}", path.display());
    }
}

/// Cut what follows the last line's end of `f` (a record a kill cut part way); the
/// bytes cut.
fn cut_torn_tail(f: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let len = f.metadata()?.len();
    let mut at = len;
    let mut buf = [0u8; 4096];
    while at > 0 {
        let n = buf.len().min(at as usize);
        f.seek(SeekFrom::Start(at - n as u64))?;
        f.read_exact(&mut buf[..n])?;
        match buf[..n].iter().rposition(|b| *b == b'\n') {
            Some(i) => {
                let keep = at - n as u64 + i as u64 + 1;
                if keep < len {
                    f.set_len(keep)?;
                }
                return Ok(len - keep);
            }
            None => at -= n as u64,
        }
    }
    // Not one whole line: not even the header; leave it for the audit to name.
    Ok(0)
}

/// Ask every loop for its status (one that does not answer within a second is left
/// out).
fn statuses<K>(txs: &[Sender<NodeEvent<K>>]) -> Vec<NodeStatus> {
    txs.iter()
        .filter_map(|tx| {
            let (stx, srx) = channel();
            tx.send(NodeEvent::Status(stx)).ok()?;
            srx.recv_timeout(Duration::from_secs(1)).ok()
        })
        .collect()
}

/// What a server reports as it ends.
#[derive(Clone, Debug, Serialize)]
pub struct ExitReport {
    /// Every node quiesced (nothing in flight, every pool page free) before the end.
    pub drained: bool,
    pub nodes: Vec<NodeStatus>,
}

impl ExitReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "kvsim serve: {}\n",
            if self.drained {
                "drained; pages each pool holds at exit:"
            } else {
                "did NOT drain in time; pages each pool holds at exit:"
            }
        );
        for n in &self.nodes {
            let pool = match (n.free_pages, n.pool_pages) {
                (Some(f), Some(c)) => format!("{f} of {c} pages free, {} held", c - f),
                _ => "no pool".into(),
            };
            s.push_str(&format!(
                "  {} {:?} (epoch {}): {pool}; {} live, {} quarantined{}\n",
                n.node,
                n.role,
                n.epoch,
                n.live,
                n.quarantined,
                n.fault
                    .as_deref()
                    .map(|f| format!("; FAULT: {f}"))
                    .unwrap_or_default()
            ));
        }
        s
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

/// Node `id`'s trace file under `--trace-json` (none without it). A restarted
/// incarnation (`epoch > 0`) first records the previous one's end: it is gone
/// (killed), its open writes flushed, and every tag it handed out is stale. An epoch
/// names one incarnation: a restart at an epoch the node's trace files already name
/// (a process started at it or above, or a restart in process that reached it) is
/// refused ([`ServeError::EpochUsed`]).
fn open_tracer(opts: &ServeOptions, id: NodeId, epoch: u32) -> Result<Option<Tracer>, ServeError> {
    let Some(dir) = &opts.trace_dir else {
        return Ok(None);
    };
    let path = dir.join(format!("n{}-e{}.jsonl", id.0, epoch));
    let files = trace_files(dir, id);
    let mut ended = None;
    if epoch > 0 {
        if let Some((&used, file)) = files.range(epoch..).next_back() {
            return Err(epoch_used(id, epoch, used, file));
        }
        if let Some((&started, file)) = files.range(..epoch).next_back() {
            let end = replay_incarnations(file, id, started);
            if end.last >= epoch {
                return Err(epoch_used(id, epoch, end.last, file));
            }
            ended = Some((file.clone(), end));
        }
    }
    let mut t = Tracer::create(&path, &opts.header()).map_err(|source| ServeError::Trace {
        path: path.display().to_string(),
        source,
    })?;
    if epoch > 0 {
        let (dead, flushed, open_rooms) = match ended {
            Some((file, end)) => {
                end_killed_process(&file, id, end.last);
                (end.last, end.flushed, end.open_rooms)
            }
            None => (epoch - 1, Vec::new(), Vec::new()),
        };
        debug_assert!(dead < epoch, "the new incarnation is above the dead one");
        t.write(Record::Fault(FaultEvent::Crash {
            node: id,
            epoch: dead,
            flushed,
        }));
        t.write(Record::Fault(FaultEvent::Restart { node: id, epoch }));
        // Worker mode, decode: the router's rooms whose client was the killed process
        // (the router's connections to it broke, so it has its answer: an error, and
        // it moves on to a new room) are let go, as the engine router records an
        // abandoned attempt; each prefill half of them still ends on its own, which the
        // audit judges (L1).
        for (node, room) in open_rooms {
            t.write(Record::Engine(TraceEvent::RoomCleared { node, room }));
        }
    }
    Ok(Some(t))
}

fn epoch_used(node: NodeId, epoch: u32, used: u32, file: &std::path::Path) -> ServeError {
    ServeError::EpochUsed {
        node,
        epoch,
        used,
        trace: file.display().to_string(),
    }
}

/// How a decode node's connections land the KV writes that arrive on them, and the
/// record they land them on (replaced at an in-process restart).
type Transfer<K> = (Arc<dyn Lander<K>>, Arc<LandingRecord>);

/// The engine node of `role`, and for a decode node the landing of the KV writes that
/// arrive on its listener.
fn build_node<K, G>(
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
        Role::Prefill => {
            let gpu = SharedGpu::new(node_gpu()?);
            let mut p = PrefillNode::new(id, cfg.clone(), ROUTER, gpu);
            if epoch > 0 {
                world::restart(&mut p, epoch);
            }
            (Node::Prefill(p), None)
        }
        Role::Decode => {
            let pool = Arc::new(SharedPool::with_epoch(pages, cfg.page_size, epoch));
            let gpu = SharedGpu::new(node_gpu()?);
            let record = LandingRecord::new(pool.clone());
            // The runtime's KV writes ride TCP, a two-sided transport: the
            // connection's reader judges each one before its bytes land, so the
            // landing gate exists here whatever the scenario's `transport` says.
            let landing: Arc<dyn Lander<K>> = Arc::new(WireLanding {
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

impl<K> Server<K>
where
    K: Clone + Serialize + DeserializeOwned + WireWords + Send + Sync + std::fmt::Debug + 'static,
{
    /// Every node of the topology in this process, on loopback (ephemeral ports), and
    /// the client endpoint on `client`. `make_gpu(pages, page_size)` makes each
    /// prefill and decode node's KV memory; a backend that cannot (a device allocation
    /// that fails) fails the start with [`ServeError::Gpu`] and its reason.
    pub fn start_all<G>(
        opts: &ServeOptions,
        client: TcpListener,
        make_gpu: impl Fn(u32, u32) -> Result<G, String>,
    ) -> Result<Self, ServeError>
    where
        G: Gpu<Kv = K> + Send + 'static,
    {
        opts.topology.preflight(&opts.cfg)?;
        let ids: Vec<NodeId> = opts.topology.nodes().iter().map(|n| n.0).collect();
        let mut listeners = Vec::new();
        let mut addrs = BTreeMap::new();
        for &id in &ids {
            let l = TcpListener::bind("127.0.0.1:0")?;
            addrs.insert(id, l.local_addr()?);
            listeners.push(l);
        }
        let mut plans = Vec::new();
        let mut client = Some(client);
        for (&id, listener) in ids.iter().zip(listeners) {
            if opts.worker && id == ROUTER {
                continue;
            }
            plans.push(NodePlan {
                id,
                epoch: 0,
                listener,
                peers: addrs.clone(),
                client: if id == ROUTER { client.take() } else { None },
            });
        }
        Self::start(opts, plans, make_gpu)
    }

    /// The given nodes of the topology in this process.
    pub fn start<G>(
        opts: &ServeOptions,
        plans: Vec<NodePlan>,
        make_gpu: impl Fn(u32, u32) -> Result<G, String>,
    ) -> Result<Self, ServeError>
    where
        G: Gpu<Kv = K> + Send + 'static,
    {
        opts.topology.preflight(&opts.cfg)?;
        let cfg = Cfg::new(opts.cfg.clone());
        let topo = &opts.topology;
        let stop = Arc::new(AtomicBool::new(false));
        let mut server = Server {
            nodes: Vec::new(),
            client_addr: None,
            stop: stop.clone(),
            connected: Vec::new(),
            front: None,
            next: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            opts: opts.clone(),
        };
        let mut client_endpoint = None;
        for plan in plans {
            let id = plan.id;
            let role = topo
                .role(id)
                .ok_or(ServeError::NoSuchNode(id, topo.client().0 - 1))?;
            let (tx, rx) = channel::<NodeEvent<K>>();
            let incarnation = Arc::new(AtomicU32::new(plan.epoch));
            let peers = server.link_peers(&plan, &tx, &incarnation)?;
            let tracer = open_tracer(opts, id, plan.epoch)?;
            let rt = Threads::new(tracer, peers, tx.clone(), rx).with_incarnation(incarnation);
            let mut io = Io::new(id, plan.epoch, topo.client(), rt);
            io.worker_router = opts.worker.then_some(ROUTER);
            io.worker_cancels_both = opts.cfg.defenses.router_cancels_both;
            let (node, transfer) = build_node(role, id, plan.epoch, topo, &cfg, &make_gpu, &tx)?;
            spawn_listener(
                id,
                plan.listener,
                Inbound {
                    to_loop: tx.clone(),
                    landing: transfer.as_ref().map(|(l, _)| l.clone()),
                },
                stop.clone(),
            )?;
            if let Some(cl) = plan.client {
                server.client_addr = Some(cl.local_addr()?);
                client_endpoint = Some((cl, tx.clone()));
            }
            let mut lp = NodeLoop::new(node, io).on_device_thread()?;
            lp.check_invariants = opts.node_invariants;
            lp.landing = transfer.map(|(_, record)| record);
            let thread = thread::Builder::new()
                .name(format!("{id}-loop"))
                .spawn(move || lp.run())?;
            server.nodes.push(Handle {
                id,
                epoch: plan.epoch,
                tx,
                thread: Some(thread),
            });
        }
        if let Some((cl, router)) = client_endpoint {
            server.start_client_endpoint(cl, router)?;
        }
        Ok(server)
    }

    /// A link from node `plan.id` to every other node of the topology (in worker mode,
    /// none to the engine router), each on its own thread delivering to `to_loop`.
    fn link_peers(
        &mut self,
        plan: &NodePlan,
        to_loop: &Sender<NodeEvent<K>>,
        incarnation: &Arc<AtomicU32>,
    ) -> Result<BTreeMap<NodeId, Sender<Msg<K>>>, ServeError> {
        let id = plan.id;
        let mut peers = BTreeMap::new();
        for (peer, _, _) in self.opts.topology.nodes() {
            if peer == id || (self.opts.worker && peer == ROUTER) {
                continue;
            }
            let addr = *plan.peers.get(&peer).ok_or(ServeError::NoPeer(peer))?;
            let (ptx, prx) = channel();
            let flag = Arc::new(AtomicBool::new(false));
            spawn_peer(
                id,
                peer,
                addr,
                prx,
                to_loop.clone(),
                (flag.clone(), incarnation.clone()),
                self.stop.clone(),
            )?;
            self.connected.push((id, peer, flag));
            peers.insert(peer, ptx);
        }
        Ok(peers)
    }

    /// The client endpoint on `cl` (the router's process), its status and node
    /// listings, kept for the HTTP front.
    fn start_client_endpoint(
        &mut self,
        cl: TcpListener,
        router: Sender<NodeEvent<K>>,
    ) -> Result<(), ServeError> {
        let txs: Vec<Sender<NodeEvent<K>>> = self.nodes.iter().map(|h| h.tx.clone()).collect();
        let bugs: Vec<&'static str> = self.opts.cfg.bugs.iter().map(|b| b.name()).collect();
        let nodes_fn: crate::http::NodesFn = Arc::new(move || statuses(&txs));
        let of_nodes = nodes_fn.clone();
        let status: StatusFn = Arc::new(move || {
            let nodes = of_nodes();
            serde_json::json!({
                "bugs": bugs,
                "warning": if bugs.is_empty() { None } else {
                    Some(format!("BUG SWITCHES ON: {}", bugs.join(",")))
                },
                "nodes": nodes,
            })
        });
        self.front = Some((router.clone(), status.clone(), nodes_fn));
        spawn_client_endpoint(
            cl,
            router,
            status,
            self.next.clone(),
            self.opts.prompts,
            self.stop.clone(),
        )?;
        Ok(())
    }

    /// Serve the SGLang-compatible HTTP front on `listener` (the router's process only).
    pub fn start_http(
        &self,
        listener: TcpListener,
        limits: crate::http::FrontLimits,
    ) -> Result<SocketAddr, ServeError> {
        let Some((router, status, nodes)) = &self.front else {
            return Err(ServeError::Io(std::io::Error::other(
                "the HTTP front runs in the router's process",
            )));
        };
        let addr = listener.local_addr()?;
        crate::http::spawn_http_front(
            listener,
            crate::http::FrontParts {
                router: router.clone(),
                status: status.clone(),
                nodes: nodes.clone(),
                next: self.next.clone(),
                info: crate::http::front_info(&self.opts),
                limits,
                prompts: self.opts.prompts,
            },
        )?;
        Ok(addr)
    }

    /// Serve SGLang's worker API for node `id` on `listener` (worker mode), and, for a
    /// prefill node, its bootstrap endpoint on `bootstrap`. `prefills` maps each prefill
    /// node's bootstrap address to the node (how decode finds its prefill).
    pub fn start_worker(
        &self,
        id: NodeId,
        listener: TcpListener,
        bootstrap: Option<TcpListener>,
        prefills: BTreeMap<SocketAddr, NodeId>,
        limits: crate::http::FrontLimits,
        fail_first: u64,
    ) -> Result<SocketAddr, ServeError> {
        let node = self.nodes.iter().find(|h| h.id == id);
        let (Some(node), true) = (node, self.opts.worker) else {
            return Err(ServeError::Io(std::io::Error::other(format!(
                "{id} does not run here in worker mode"
            ))));
        };
        let role = self.opts.topology.role(id).ok_or(ServeError::NoSuchNode(
            id,
            self.opts.topology.client().0 - 1,
        ))?;
        let addr = listener.local_addr()?;
        let tx = node.tx.clone();
        let nodes: crate::http::NodesFn = Arc::new(move || statuses(std::slice::from_ref(&tx)));
        crate::worker::spawn_worker(
            listener,
            bootstrap,
            crate::worker::WorkerParts {
                id,
                url: format!("http://{addr}"),
                role,
                node: node.tx.clone(),
                nodes,
                info: crate::http::front_info(&self.opts),
                cfg: self.opts.cfg.clone(),
                decodes: self.opts.topology.decode_ids(),
                prefills,
                limits,
                fail_first,
                epoch: node.epoch,
            },
        )?;
        Ok(addr)
    }

    pub fn client_addr(&self) -> Option<SocketAddr> {
        self.client_addr
    }

    /// Wait until every link of this process's nodes is connected (or `timeout`).
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self
                .connected
                .iter()
                .all(|(_, _, f)| f.load(Ordering::Relaxed))
            {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Every node's status (a node that does not answer within a second is left out).
    pub fn status(&self) -> Vec<NodeStatus> {
        let txs: Vec<Sender<NodeEvent<K>>> = self.nodes.iter().map(|h| h.tx.clone()).collect();
        statuses(&txs)
    }

    /// Stop intake, drain (until every node is quiescent or `drain` passes), end every
    /// node's trace and report the pages each pool holds.
    pub fn shutdown(mut self, drain: Duration) -> ExitReport {
        for h in &self.nodes {
            let _ = h.tx.send(NodeEvent::CloseIntake);
        }
        let end = Instant::now() + drain;
        let mut status = self.status();
        let mut drained = status.iter().all(NodeStatus::quiescent);
        while !drained && Instant::now() < end {
            thread::sleep(Duration::from_millis(20));
            status = self.status();
            drained = status.iter().all(NodeStatus::quiescent);
        }
        let (outcome, detail) = if drained {
            (EndOutcome::Drained, "drained at shutdown".to_string())
        } else {
            (
                EndOutcome::LivenessBound,
                format!("did not drain within {} ms of shutdown", drain.as_millis()),
            )
        };
        for h in &self.nodes {
            let _ = h.tx.send(NodeEvent::Stop {
                outcome,
                detail: detail.clone(),
            });
        }
        for h in &mut self.nodes {
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        ExitReport {
            drained,
            nodes: status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::{RequestId, TenantId};
    use kvsim_oracle::schema::{entry_line, header_line, parse_line, Entry, Line};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvsim-server-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("a temporary folder");
        d
    }

    fn opts(trace_dir: &std::path::Path) -> ServeOptions {
        ServeOptions {
            cfg: EngineConfig::default(),
            topology: Topology {
                prefill_pools: vec![32],
                decode_pools: vec![128],
            },
            trace_dir: Some(trace_dir.to_path_buf()),
            scenario: "t".into(),
            seed: 0,
            prompts: PromptMode::Own,
            worker: true,
            node_invariants: true,
        }
    }

    fn line(seq: u64, ev: TraceEvent) -> String {
        entry_line(&Entry {
            at_ns: seq,
            seq,
            rec: Record::Engine(ev),
        }) + "\n"
    }

    fn routed(room: RoomKey) -> TraceEvent {
        TraceEvent::Routed {
            node: ROUTER,
            req: RequestId(room.gen.0),
            tenant: TenantId(0),
            room,
            prefill: NodeId(1),
            decode: NodeId(2),
            prompt_len: 4,
            max_new_tokens: 2,
        }
    }

    #[test]
    fn a_torn_last_record_is_cut() {
        let d = dir("torn");
        let p = d.join("f");
        std::fs::write(&p, "a\nb\n{\"at_ns\":1,\"se").expect("written");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .expect("opened");
        assert_eq!(cut_torn_tail(&mut f).expect("cut"), 14);
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "a\nb\n");
        assert_eq!(cut_torn_tail(&mut f).expect("cut"), 0, "a whole file stays");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "a\nb\n");
    }

    /// A decode process killed in worker mode: its successor ends the dead one's file
    /// (its torn last record cut, so the file still reads), and begins its own with the
    /// crash, the restart, and the clearing of the rooms the dead process's stand-in
    /// for the router had open (and only those).
    #[test]
    fn a_killed_decode_process_is_ended_by_its_successor() {
        let d = dir("killed");
        let o = opts(&d);
        let (open, closed) = (RoomKey::new(5, 55), RoomKey::new(6, 66));
        let dead = header_line(&o.header())
            + "\n"
            + &line(1, routed(open))
            + &line(2, routed(closed))
            + &line(
                3,
                TraceEvent::RoomCleared {
                    node: ROUTER,
                    room: closed,
                },
            )
            + "{\"at_ns\":4,\"seq\":4,\"ty";
        std::fs::write(d.join("n2-e0.jsonl"), dead).expect("written");
        let t = open_tracer(&o, NodeId(2), 1).expect("a tracer");
        drop(t);
        let old = std::fs::read_to_string(d.join("n2-e0.jsonl")).expect("read");
        let last = old.lines().last().expect("a line");
        assert!(
            last.contains("incarnation 0 was killed") && last.contains("cut part way"),
            "{last}"
        );
        for l in old.lines() {
            parse_line(l).unwrap_or_else(|e| panic!("{l}: {e:?}"));
        }
        let new = std::fs::read_to_string(d.join("n2-e1.jsonl")).expect("read");
        let recs: Vec<Record> = new
            .lines()
            .filter_map(|l| match parse_line(l) {
                Ok(Line::Entry(e)) => Some(e.rec),
                _ => None,
            })
            .collect();
        assert!(matches!(
            recs.first(),
            Some(Record::Fault(FaultEvent::Crash { epoch: 0, .. }))
        ));
        assert!(matches!(
            recs.get(1),
            Some(Record::Fault(FaultEvent::Restart { epoch: 1, .. }))
        ));
        let cleared: Vec<RoomKey> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Engine(TraceEvent::RoomCleared { room, .. }) => Some(*room),
                _ => None,
            })
            .collect();
        assert_eq!(cleared, vec![open]);
    }
}
