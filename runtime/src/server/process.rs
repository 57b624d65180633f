//! The nodes a process runs ([`Server`]): each node's loop on a thread of its own,
//! its links and listener, the client endpoint and the fronts, the wait for links,
//! and the graceful end. Not how a node is built (`roles`) nor its trace files
//! across incarnations (`incarnations`).

use crate::client::{spawn_client_endpoint, StatusFn};
use crate::http::front::{spawn_http_front, FrontParts};
use crate::http::info::front_info;
use crate::http::limits::FrontLimits;
use crate::http::state::NodesFn;
use crate::net::{spawn_listener, spawn_peer, Hello, Inbound};
use crate::node::event::NodeEvent;
use crate::node::io::Io;
use crate::node::node_loop::NodeLoop;
use crate::node::status::NodeStatus;
use crate::seam::Threads;
use crate::server::incarnations::open_tracer;
use crate::server::kv_wire::{wire_parts, WireParts};
use crate::server::options::{NodePlan, ServeError, ServeOptions};
use crate::server::report::{statuses, ExitReport};
use crate::server::roles::build_node;
use crate::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use crate::sync::mpsc::{channel, Sender};
use crate::sync::thread::{self, JoinHandle};
use crate::sync::Arc;
use crate::worker::routes::spawn_worker;
use crate::worker::state::WorkerParts;
use kvsim_engine::gpu::{Gpu, WireWords};
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::Carried;
use kvsim_engine::node::Role;
use kvsim_engine::worker::WorkerFront;
use kvsim_engine::world::ROUTER;
use kvsim_engine::Cfg;
use kvsim_oracle::schema::EndOutcome;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

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
    front: Option<(Sender<NodeEvent<K>>, StatusFn, NodesFn)>,
    next: Arc<crate::sync::atomic::AtomicU64>,
    opts: ServeOptions,
    /// What the nodes' KV wires need alive while the server runs (a NIXL receiver's
    /// registrations).
    keep: Vec<Arc<dyn std::any::Any + Send + Sync>>,
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
            next: Arc::new(crate::sync::atomic::AtomicU64::new(0)),
            opts: opts.clone(),
            keep: Vec::new(),
        };
        let mut client_endpoint = None;
        for plan in plans {
            let id = plan.id;
            let role = topo
                .role(id)
                .ok_or(ServeError::NoSuchNode(id, topo.client().0 - 1))?;
            let (tx, rx) = channel::<NodeEvent<K>>();
            let (node, transfer) = build_node(role, id, plan.epoch, topo, &cfg, &make_gpu, &tx)?;
            let wire = wire_parts(opts.kv_wire, id, &node, &tx, &stop)?;
            let rt = server.runtime(&plan, (tx.clone(), rx), &wire)?;
            let mut io = Io::new(id, plan.epoch, topo.client(), rt);
            let cancels_both = opts.cfg.defenses.router_cancels_both;
            let wait_ns = kvsim_engine::worker::pairing_wait_ns(&opts.cfg.timeouts);
            io.front = (opts.worker && role != Role::Router).then(|| {
                WorkerFront::new(id, role, ROUTER, cancels_both)
                    .pairing(plan.epoch, wait_ns)
                    .protocol(opts.cfg.router.protocol())
            });
            spawn_listener(
                id,
                plan.listener,
                Inbound {
                    to_loop: tx.clone(),
                    landing: transfer.as_ref().map(|(l, _)| l.clone()),
                    book: wire.book.clone(),
                },
                stop.clone(),
            )?;
            server.keep.extend(wire.keep);
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

    /// Node `plan.id`'s runtime: its loop's channel, its links (each writing `wire`'s
    /// first frame on every connection), its trace, and `wire`'s KV path.
    fn runtime(
        &mut self,
        plan: &NodePlan,
        (tx, rx): (
            Sender<NodeEvent<K>>,
            crate::sync::mpsc::Receiver<NodeEvent<K>>,
        ),
        wire: &WireParts<K>,
    ) -> Result<Threads<K>, ServeError> {
        let incarnation = Arc::new(AtomicU32::new(plan.epoch));
        let peers = self.link_peers(plan, &tx, (&incarnation, &wire.hello))?;
        let tracer = open_tracer(&self.opts, plan.id, plan.epoch)?;
        Ok(Threads::new(tracer, peers, tx, rx)
            .with_incarnation(incarnation)
            .with_kv_path(wire.path.clone()))
    }

    /// A link from node `plan.id` to every other node of the topology (in worker mode,
    /// none to the engine router), each on its own thread delivering to `to_loop`.
    fn link_peers(
        &mut self,
        plan: &NodePlan,
        to_loop: &Sender<NodeEvent<K>>,
        (incarnation, hello): (&Arc<AtomicU32>, &Hello),
    ) -> Result<BTreeMap<NodeId, Sender<Carried<K>>>, ServeError> {
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
                (flag.clone(), incarnation.clone(), hello.clone()),
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
        let nodes_fn: NodesFn = Arc::new(move || statuses(&txs));
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
        limits: FrontLimits,
    ) -> Result<SocketAddr, ServeError> {
        let Some((router, status, nodes)) = &self.front else {
            return Err(ServeError::Io(std::io::Error::other(
                "the HTTP front runs in the router's process",
            )));
        };
        let addr = listener.local_addr()?;
        spawn_http_front(
            listener,
            FrontParts {
                router: router.clone(),
                status: status.clone(),
                nodes: nodes.clone(),
                next: self.next.clone(),
                info: front_info(&self.opts),
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
        limits: FrontLimits,
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
        let nodes: NodesFn = Arc::new(move || statuses(std::slice::from_ref(&tx)));
        spawn_worker(
            listener,
            bootstrap,
            WorkerParts {
                id,
                url: format!("http://{addr}"),
                role,
                node: node.tx.clone(),
                nodes,
                info: front_info(&self.opts),
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
