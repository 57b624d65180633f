//! One deployment on shuttle's scheduler: the router's, a prefill node's and a decode
//! node's real loops (`NodeLoop` over the production runtime `Threads`), each on a
//! thread of its own with its device thread, and a link thread per ordered pair of
//! nodes that follows its writer's incarnation (`net::Incarnation`, as the TCP link
//! does). Into the decode node a link writes the real wire frames on a connection
//! (`schedules/pipe.rs`: bytes in segments, arriving over time) whose reader is the
//! one `kvsim serve` runs (`net::read_frames` with the node's `WireLanding`): it lands
//! each KV write's payload into the node's memory as it arrives, gated by the node's
//! `LandingRecord`, while the loop allocates, quarantines, releases and restarts.
//! Every loop traces into one `TraceLog`; time is one shuttle timeline (`Clock`).
//!
//! Only the sockets are replaced: a connection carries the frames in order, and a
//! restarted writer's connection closes (its reader still reads what was sent on it;
//! what was not is the dead incarnation's, flushed). Links into the router and the
//! prefill node hand messages straight to the loop (they carry no KV).

use crate::pipe::{PipeReader, PipeWriter};
use crate::watch::{Live, Watched};
use kvsim_engine::config::EngineConfig;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::{Gpu, SymbolicGpu};
use kvsim_engine::ids::NodeId;
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::SharedRecord;
use kvsim_engine::msg::Carried;
use kvsim_engine::node::Node;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::shared_cfg::Cfg;
use kvsim_engine::world::Topology;
use kvsim_oracle::schema::{ClockKind, RunHeader};
use kvsim_runtime::clock::Clock;
use kvsim_runtime::gpu::SharedGpu;
use kvsim_runtime::net::{read_frames, Inbound, Incarnation, Lander};
use kvsim_runtime::node::{Io, LandingRecord, NodeEvent, NodeLoop, WireLanding};
use kvsim_runtime::seam::{NodeRuntime, Threads};
use kvsim_runtime::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kvsim_runtime::sync::mpsc::{channel, Receiver, Sender};
use kvsim_runtime::sync::thread::{self, JoinHandle};
use kvsim_runtime::sync::Arc;
use kvsim_runtime::trace::{TraceLog, Tracer};
use kvsim_runtime::wire::{write_frame_with, FrameReader};
use std::collections::BTreeMap;

pub type Kv = <SymbolicGpu as Gpu>::Kv;
type Memory = Watched<SymbolicGpu>;
pub type Loop = NodeLoop<Memory, Threads<Kv>>;

pub const ROUTER: NodeId = NodeId(0);
pub const PREFILL: NodeId = NodeId(1);
pub const DECODE: NodeId = NodeId(2);
pub const CLIENT: NodeId = NodeId(3);
pub const NODES: [NodeId; 3] = [ROUTER, PREFILL, DECODE];
pub const PAGES: u32 = 64;
const PAGE: u32 = 2;

/// The deployment while it runs.
pub struct Bed {
    pub loops: BTreeMap<NodeId, JoinHandle<Loop>>,
    pub txs: BTreeMap<NodeId, Sender<NodeEvent<Kv>>>,
    restart: BTreeMap<NodeId, Arc<AtomicBool>>,
    /// The link and transfer threads (they end once the loops are gone).
    helpers: Vec<JoinHandle<()>>,
    pub log: TraceLog,
    pub header: RunHeader,
}

/// What a node's links hand a message to: its loop, or (decode) a connection whose
/// reader hands its frames to the loop and its KV writes to the landing.
enum Reader {
    Loop(Sender<NodeEvent<Kv>>),
    Wire(Inbound<Kv>),
}

/// The decode node's parts the bed keeps: its record, memory and watch.
struct DecodeParts {
    pool: Arc<SharedPool>,
    record: Arc<LandingRecord>,
    gpu: SharedGpu<Memory>,
    live: Live,
}

fn cfg() -> Cfg {
    Cfg::new(EngineConfig {
        page_size: PAGE,
        chunk_pages: 1,
        max_inflight_chunks: 2,
        ..EngineConfig::default()
    })
}

impl Bed {
    /// Start every thread. `planted`: the decode node's landings drop their hold of
    /// the record at once (`LandingRecord::with_planted_race`).
    pub fn start(planted: bool) -> Bed {
        let cfg = cfg();
        let topo = Topology {
            prefill_pools: vec![PAGES],
            decode_pools: vec![PAGES],
        };
        let header = RunHeader::new("kvsim-runtime schedules", ClockKind::Simulated, &cfg, &topo);
        let pool = Arc::new(SharedPool::new(PAGES, PAGE));
        let record = match planted {
            true => LandingRecord::with_planted_race(pool.clone()),
            false => LandingRecord::new(pool.clone()),
        };
        let live = Live::new(pool.clone());
        let memory = Watched {
            inner: SymbolicGpu::new(PAGES, PAGE),
            live: Some(live.clone()),
        };
        let decode = DecodeParts {
            pool,
            record,
            gpu: SharedGpu::new(memory),
            live,
        };
        let mut bed = Bed {
            loops: BTreeMap::new(),
            txs: BTreeMap::new(),
            restart: BTreeMap::new(),
            helpers: Vec::new(),
            log: TraceLog::new(),
            header,
        };
        bed.spawn_all(&cfg, decode);
        bed
    }

    fn spawn_all(&mut self, cfg: &Cfg, decode: DecodeParts) {
        let mut rxs = BTreeMap::new();
        for id in NODES {
            let (tx, rx) = channel();
            self.txs.insert(id, tx);
            rxs.insert(id, rx);
        }
        let incarnations: BTreeMap<NodeId, Arc<AtomicU32>> = NODES
            .iter()
            .map(|&id| (id, Arc::new(AtomicU32::new(0))))
            .collect();
        // One timeline: a clock for each loop, link and connection reader on it.
        let router_clock = Clock::default();
        let mut peers = self.spawn_links(cfg, &incarnations, &decode, &router_clock);
        let mut clocks = BTreeMap::from([
            (PREFILL, router_clock.another()),
            (DECODE, router_clock.another()),
        ]);
        clocks.insert(ROUTER, router_clock);
        for id in NODES {
            let mine = clocks.remove(&id).expect("a clock per loop");
            let rt = Threads::new(
                Some(Tracer::log(self.log.clone())),
                peers.remove(&id).unwrap_or_default(),
                self.txs[&id].clone(),
                rxs.remove(&id).expect("one channel per node"),
            )
            .with_incarnation(incarnations[&id].clone())
            .with_clock(mine);
            let node = node(id, cfg, &decode);
            let mut lp = NodeLoop::new(node, Io::new(id, 0, CLIENT, rt))
                .on_device_thread()
                .expect("a device thread starts");
            let live = (id == DECODE).then(|| decode.live.clone());
            if id == DECODE {
                lp.landing = Some(decode.record.clone());
            }
            let restart = Arc::new(AtomicBool::new(false));
            self.restart.insert(id, restart.clone());
            let handle = thread::spawn(move || run_loop(lp, restart, live));
            self.loops.insert(id, handle);
        }
    }

    /// A link per ordered pair of nodes; what each node's runtime sends its peers on.
    fn spawn_links(
        &mut self,
        cfg: &Cfg,
        incarnations: &BTreeMap<NodeId, Arc<AtomicU32>>,
        decode: &DecodeParts,
        clock: &Clock,
    ) -> BTreeMap<NodeId, BTreeMap<NodeId, Sender<Carried<Kv>>>> {
        let mut peers: BTreeMap<NodeId, BTreeMap<NodeId, Sender<Carried<Kv>>>> = BTreeMap::new();
        for from in NODES {
            for to in NODES.into_iter().filter(|&to| to != from) {
                let reader = match to {
                    DECODE => {
                        let landing: Arc<dyn Lander<Kv>> = Arc::new(WireLanding {
                            node: DECODE,
                            record: decode.record.clone(),
                            gpu: decode.gpu.clone(),
                            page_tags: cfg.defenses.landing_gate,
                            to_loop: self.txs[&to].clone(),
                        });
                        Reader::Wire(Inbound {
                            to_loop: self.txs[&to].clone(),
                            landing: Some(landing),
                            book: None,
                        })
                    }
                    _ => Reader::Loop(self.txs[&to].clone()),
                };
                let (ptx, prx) = channel();
                let writer = Incarnation::new(incarnations[&from].clone());
                let clock = clock.another();
                self.helpers.push(thread::spawn(move || {
                    link(from, prx, writer, reader, clock)
                }));
                peers.entry(from).or_default().insert(to, ptx);
            }
        }
        peers
    }

    /// What asks the nodes to restart, for a thread of its own.
    pub fn restarter(&self) -> Restarter {
        Restarter {
            flags: self.restart.clone(),
            txs: self.txs.clone(),
        }
    }

    /// Every loop ended (each was sent `Stop`): the loops, joined.
    pub fn join(self) -> Stopped {
        let Bed {
            loops,
            helpers,
            log,
            header,
            ..
        } = self;
        let loops = loops
            .into_values()
            .map(|h| h.join().expect("a node's loop panicked"))
            .collect();
        Stopped {
            loops,
            log,
            header,
            helpers,
        }
    }
}

/// Asks a node to restart in process.
pub struct Restarter {
    flags: BTreeMap<NodeId, Arc<AtomicBool>>,
    txs: BTreeMap<NodeId, Sender<NodeEvent<Kv>>>,
}

impl Restarter {
    /// Node `id` restarts at its next turn (woken by a status query nobody waits for).
    pub fn restart(&self, id: NodeId) {
        self.flags[&id].store(true, Ordering::SeqCst);
        let (tx, _) = channel();
        let _ = self.txs[&id].send(NodeEvent::Status(tx));
    }
}

/// The deployment once its loops ended.
pub struct Stopped {
    /// In node order.
    pub loops: Vec<Loop>,
    pub log: TraceLog,
    pub header: RunHeader,
    helpers: Vec<JoinHandle<()>>,
}

impl Stopped {
    /// The link and transfer threads end once the loops (their links' writers) are
    /// gone.
    pub fn finish(self) {
        let Stopped { loops, helpers, .. } = self;
        drop(loops);
        for h in helpers {
            h.join().expect("a link or transfer thread panicked");
        }
    }
}

/// The engine node `id` runs (decode over the bed's record and memory).
fn node(id: NodeId, cfg: &Cfg, decode: &DecodeParts) -> Node<SharedGpu<Memory>, SharedRecord> {
    match id {
        ROUTER => Node::Router(Router::new(
            ROUTER,
            cfg.clone(),
            vec![PREFILL],
            vec![DECODE],
        )),
        PREFILL => {
            let memory = Watched {
                inner: SymbolicGpu::new(PAGES, PAGE),
                live: None,
            };
            Node::Prefill(PrefillNode::new(
                id,
                cfg.clone(),
                ROUTER,
                SharedGpu::new(memory),
            ))
        }
        _ => Node::Decode(DecodeNode::with_records(
            id,
            cfg.clone(),
            ROUTER,
            vec![PREFILL],
            decode.gpu.clone(),
            SharedRecord::new(decode.pool.clone()),
        )),
    }
}

/// A node's loop, as `NodeLoop::run` runs it, restarting the node in process when the
/// bed asks between two turns; a decode node's restart publishes its new record to
/// the memory's watch.
fn run_loop(mut lp: Loop, restart: Arc<AtomicBool>, live: Option<Live>) -> Loop {
    while lp.turn() {
        if restart.swap(false, Ordering::SeqCst) {
            lp.restart();
            if let (Some(live), Some(d)) = (&live, lp.node.as_decode()) {
                live.set(d.records().shared().clone());
            }
        }
    }
    lp.io.rt.flush_trace();
    lp
}

/// The link from `from`: its messages in order to the reader, the writer's dead
/// incarnation's KV writes flushed.
fn link(
    from: NodeId,
    rx: Receiver<Carried<Kv>>,
    writer: Incarnation,
    reader: Reader,
    clock: Clock,
) {
    let mut link = Link {
        from,
        rx,
        writer,
        clock,
    };
    let tx = match reader {
        Reader::Wire(inbound) => return link.wire(inbound),
        Reader::Loop(tx) => tx,
    };
    while let Some(carried) = link.next() {
        let _ = tx.send(match carried {
            Carried::Msg(msg) => NodeEvent::Msg { from, msg },
            Carried::Write(write) => NodeEvent::Write { from, write },
        });
    }
}

struct Link {
    from: NodeId,
    rx: Receiver<Carried<Kv>>,
    writer: Incarnation,
    clock: Clock,
}

impl Link {
    /// The next message to carry (the dead incarnation's KV writes flushed), and
    /// whether the writer restarted since the last; `None` once the writer is gone.
    fn next_after(&mut self) -> Option<(Carried<Kv>, bool)> {
        let mut moved = false;
        while let Ok(msg) = self.clock.recv(&self.rx, None) {
            moved |= self.writer.moved_on(self.from);
            if !self.writer.flushed(&msg) {
                return Some((msg, moved));
            }
        }
        None
    }

    fn next(&mut self) -> Option<Carried<Kv>> {
        self.next_after().map(|(msg, _)| msg)
    }

    /// The messages as frames on a connection, opened at the first message and again
    /// after the writer restarted (the dead incarnation's connection closes; its
    /// reader reads what was sent on it, then ends).
    fn wire(mut self, inbound: Inbound<Kv>) {
        let mut conn: Option<PipeWriter> = None;
        let mut readers = Vec::new();
        let mut buf = Vec::new();
        while let Some((msg, moved)) = self.next_after() {
            if moved {
                conn = None;
            }
            let w = conn.get_or_insert_with(|| {
                let (tx, rx) = channel();
                let (inbound, clock) = (inbound.clone(), self.clock.another());
                readers.push(thread::spawn(move || read_conn(rx, inbound, clock)));
                PipeWriter(tx)
            });
            // The reader ends only once the decode node's loop is gone (the run's end).
            if write_frame_with(w, self.from, &msg, &mut buf).is_err() {
                conn = None;
            }
        }
        drop(conn);
        drop(self);
        for r in readers {
            r.join().expect("a connection's reader panicked");
        }
    }
}

/// A connection's reader, as `kvsim serve`'s (`net::read_frames`).
fn read_conn(rx: Receiver<Vec<u8>>, inbound: Inbound<Kv>, clock: Clock) {
    let mut r = FrameReader::with_capacity(64, PipeReader::new(rx, clock));
    let stop = AtomicBool::new(false);
    if let Err(e) = read_frames(&mut r, &inbound, &stop) {
        panic!("a connection's reader failed: {e}");
    }
}
