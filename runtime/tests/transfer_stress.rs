//! Landings on the real transfer thread raced against the decode node's releases,
//! quarantines and restarts (and prefill restarts), in the default `cargo test`.
//!
//! The router's, a prefill node's and a decode node's loops run in process over the
//! in-memory runtime, as in `in_process.rs`, but every KV write to decode goes through
//! `kvsim_runtime::node::transfer_thread` on its own thread, landing on the shared
//! record while the decode loop (on the test's thread) allocates, quarantines and
//! releases pages on it and restarts. Clients cancel at random points (decode
//! quarantines a room whose writes may still land; prefill's drain ack releases it).
//!
//! What must hold, whatever the interleaving: no node's own invariants break at any
//! input (checked after every input); every client that stayed is answered once; at the end no
//! write is in flight at its writer, every write of the writer's live incarnation
//! completed exactly once, and every page of decode's record is free. Bounded (a fixed
//! number of requests, turns and restarts); nothing is timed.

use kvsim_engine::config::EngineConfig;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::SymbolicGpu;
use kvsim_engine::ids::{NodeId, RequestId, TenantId, WriteId};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::SharedRecord;
use kvsim_engine::msg::Carried;
use kvsim_engine::node::Node;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::shared_cfg::Cfg;
use kvsim_engine::trace::TraceEvent;
use kvsim_oracle::schema::{FaultEvent, Record};
use kvsim_runtime::gpu::SharedGpu;
use kvsim_runtime::net::Incoming;
use kvsim_runtime::node::{transfer_thread, Io, LandingRecord, NodeEvent, NodeLoop};
use kvsim_runtime::node::{ReplyEv, ReplySink};
use kvsim_runtime::seam::InMemory;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

type Kv = <SymbolicGpu as kvsim_engine::gpu::Gpu>::Kv;
type Loop = NodeLoop<SymbolicGpu, InMemory<Kv>>;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);
const CLIENT: NodeId = NodeId(3);
const PAGES: u32 = 24;
const PAGE: u32 = 2;
const REQUESTS: u64 = 400;
/// Most turns of the whole bed (it needs far fewer).
const TURNS: usize = 2_000_000;

/// A small deterministic generator for the test's choices (the interleaving with the
/// transfer thread is the operating system's).
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

struct Bed {
    loops: Vec<Loop>,
    to_transfer: Sender<Incoming<Kv>>,
    from_transfer: Receiver<NodeEvent<Kv>>,
    /// Writes handed to the transfer thread and not reported back yet.
    in_transfer: usize,
    conn_alive: Arc<AtomicBool>,
    answers: BTreeMap<u64, Receiver<ReplyEv>>,
}

impl Bed {
    fn new() -> Self {
        let cfg = Cfg::new(EngineConfig {
            page_size: PAGE,
            chunk_pages: 1,
            max_inflight_chunks: 2,
            ..EngineConfig::default()
        });
        let gpu = SharedGpu::new(SymbolicGpu::new(PAGES, PAGE));
        let router = Node::Router(Router::new(
            ROUTER,
            cfg.clone(),
            vec![PREFILL],
            vec![DECODE],
        ));
        let prefill_gpu = SharedGpu::new(SymbolicGpu::new(PAGES, PAGE));
        let prefill = Node::Prefill(PrefillNode::new(PREFILL, cfg.clone(), ROUTER, prefill_gpu));
        let pool = Arc::new(SharedPool::new(PAGES, PAGE));
        let record = SharedRecord::new(pool.clone());
        let decode = DecodeNode::with_records(
            DECODE,
            cfg.clone(),
            ROUTER,
            vec![PREFILL],
            gpu.clone(),
            record,
        );
        let landing = LandingRecord::new(pool);
        let (to_transfer, trx) = channel();
        let (to_loop, from_transfer) = channel();
        let (l, g) = (landing.clone(), gpu);
        let tags = cfg.defenses.landing_gate;
        std::thread::spawn(move || transfer_thread(trx, l, g, tags, to_loop));
        let mut loops: Vec<Loop> = [
            (ROUTER, router),
            (PREFILL, prefill),
            (DECODE, Node::Decode(decode)),
        ]
        .into_iter()
        .map(|(id, node)| NodeLoop::new(node, Io::new(id, 0, CLIENT, InMemory::new())))
        .collect();
        loops[DECODE.0 as usize].landing = Some(landing);
        Bed {
            loops,
            to_transfer,
            from_transfer,
            in_transfer: 0,
            conn_alive: Arc::new(AtomicBool::new(true)),
            answers: BTreeMap::new(),
        }
    }

    /// Messages to their receivers: KV writes to decode through the transfer thread,
    /// everything else into the receiver's queue; what the transfer thread reported,
    /// into decode's queue.
    fn carry(&mut self) {
        for from in 0..self.loops.len() {
            for (to, msg) in self.loops[from].io.rt.take_sent() {
                let from = NodeId(from as u16);
                let msg = match msg {
                    Carried::Write(w) => {
                        assert_eq!(to, DECODE, "writes go to decode");
                        let sent = self.to_transfer.send((from, w, self.conn_alive.clone()));
                        assert!(sent.is_ok(), "the transfer thread is running");
                        self.in_transfer += 1;
                        continue;
                    }
                    Carried::Msg(msg) => msg,
                };
                let ev = NodeEvent::Msg { from, msg };
                self.loops[to.0 as usize].io.rt.events.push_back(ev);
            }
        }
        while let Ok(ev) = self.from_transfer.try_recv() {
            self.reported(ev);
        }
    }

    fn reported(&mut self, ev: NodeEvent<Kv>) {
        self.in_transfer -= 1;
        self.loops[DECODE.0 as usize].io.rt.events.push_back(ev);
    }

    fn next_timer(lp: &mut Loop) -> Option<std::time::Duration> {
        let (id, now) = (lp.io.id, lp.io.rt.now_ns);
        lp.io.timers.wait(id, now)
    }

    /// One step: a loop with work turns; else the transfer thread is waited for; else
    /// the loop with the nearest timer runs its clock to it. `false`: nothing left.
    fn step(&mut self) -> bool {
        self.carry();
        let busy = self.loops.iter_mut().position(|lp| {
            !lp.io.rt.events.is_empty() || Self::next_timer(lp).is_some_and(|w| w.is_zero())
        });
        if busy.is_none() && self.in_transfer > 0 {
            let ev = self
                .from_transfer
                .recv()
                .expect("the transfer thread is running");
            self.reported(ev);
            return true;
        }
        let next = busy.or_else(|| {
            let waits = self.loops.iter_mut().map(Self::next_timer).enumerate();
            let pending = waits.filter_map(|(i, w)| w.map(|w| (w, i)));
            pending.min().map(|(_, i)| i)
        });
        let Some(i) = next else {
            return false;
        };
        assert!(self.loops[i].turn(), "a loop ended while it had work");
        true
    }

    fn settle(&mut self) {
        for _ in 0..TURNS {
            if !self.step() {
                return;
            }
        }
        panic!("the bed did not settle in {TURNS} steps");
    }

    fn submit(&mut self, req: u64, prompt_len: u32, max_new_tokens: u32) {
        let (tx, rx) = channel();
        let ev = NodeEvent::Submit {
            req: RequestId(req),
            tenant: TenantId(0),
            prompt: (1..=prompt_len).collect(),
            max_new_tokens,
            reply: ReplySink::channel(tx),
        };
        self.loops[ROUTER.0 as usize].io.rt.events.push_back(ev);
        self.answers.insert(req, rx);
    }

    fn records(&self, id: NodeId) -> &[Record] {
        &self.loops[id.0 as usize].io.rt.records
    }
}

/// Rounds of the bed, each with its own draws (and a transfer thread of its own).
const ROUNDS: u64 = 12;

#[test]
fn landings_race_releases_quarantines_and_restarts() {
    for round in 0..ROUNDS {
        one_round(0x9e37_79b9_7f4a_7c15 ^ (round << 32 | round));
    }
}

fn one_round(seed: u64) {
    let mut bed = Bed::new();
    let mut draw = Draw(seed);
    let mut restarts = [0u32; 3];
    let mut cancelled = std::collections::BTreeSet::new();
    let mut losses = 0;
    for req in 1..=REQUESTS {
        let prompt_len = 1 + draw.below(12) as u32;
        bed.submit(req, prompt_len, 1 + draw.below(3) as u32);
        for _ in 0..draw.below(25) {
            if !bed.step() {
                break;
            }
        }
        match draw.below(20) {
            0..=5 => {
                // Mostly a request still running (its transfer, its quarantine).
                let victim = req.saturating_sub(draw.below(4)).max(1);
                cancelled.insert(victim);
                let cancel = NodeEvent::Cancel {
                    req: RequestId(victim),
                };
                bed.loops[ROUTER.0 as usize].io.rt.events.push_back(cancel);
            }
            6 => {
                bed.loops[DECODE.0 as usize].restart();
                restarts[DECODE.0 as usize] += 1;
            }
            7 if draw.below(3) == 0 => {
                bed.loops[PREFILL.0 as usize].restart();
                restarts[PREFILL.0 as usize] += 1;
            }
            8 => {
                // Prefill's connection to decode broke (as its writer saw it): the
                // writes on it fail back, while those decode took still land there.
                let lost = NodeEvent::PeerLost { peer: DECODE };
                bed.loops[PREFILL.0 as usize].io.rt.events.push_back(lost);
                losses += 1;
            }
            _ => {}
        }
    }
    bed.settle();
    assert!(restarts[DECODE.0 as usize] > 0 && restarts[PREFILL.0 as usize] > 0);
    assert!(losses > 0);

    for id in [ROUTER, PREFILL, DECODE] {
        let broken: Vec<&Record> = bed
            .records(id)
            .iter()
            .filter(|r| matches!(r, Record::Violation { .. }))
            .collect();
        assert!(broken.is_empty(), "{id} broke an invariant: {broken:?}");
    }
    for (req, rx) in &bed.answers {
        let done = rx
            .try_iter()
            .filter(|ev| matches!(ev, ReplyEv::Done(_)))
            .count();
        // A client that went away hears nothing after it left.
        let expect = if cancelled.contains(req) {
            0..=1
        } else {
            1..=1
        };
        assert!(expect.contains(&done), "request {req}: {done} answers");
    }

    let prefill = &bed.loops[PREFILL.0 as usize];
    assert_eq!(
        prefill.writes_in_flight(),
        Vec::new(),
        "no write is left in flight"
    );
    check_completions(bed.records(PREFILL), prefill.io.epoch);
    check_landings(bed.records(DECODE));

    let decode = bed.loops[DECODE.0 as usize]
        .node
        .as_decode()
        .expect("decode");
    assert_eq!(decode.requests(), 0);
    assert_eq!(decode.quarantined_rooms(), 0, "every quarantine ended");
    let pool = decode.records().shared();
    assert_eq!(pool.free_count(), PAGES as usize, "every page is free");
    assert!(pool.invariants().is_ok());
    assert!(bed.loops[DECODE.0 as usize].node.invariants().is_ok());
}

/// The writer's side: every write of its live incarnation completed exactly once, one
/// of an earlier incarnation at most once; a write its loop failed back completed as
/// failed.
fn check_completions(records: &[Record], epoch: u32) {
    let mut completions: BTreeMap<WriteId, Vec<bool>> = BTreeMap::new();
    let mut failed_back = Vec::new();
    for r in records {
        match r {
            Record::Engine(TraceEvent::KvSent { write, .. }) => {
                completions.entry(*write).or_default();
            }
            Record::Engine(TraceEvent::WriteCompleted { write, ok, .. }) => {
                completions.entry(*write).or_default().push(*ok);
            }
            Record::WriteFailed { write, .. } => failed_back.push(*write),
            _ => {}
        }
    }
    assert!(
        completions.len() > 200,
        "the bed wrote: {}",
        completions.len()
    );
    assert!(!failed_back.is_empty(), "some writes failed back");
    for (id, oks) in &completions {
        let expect = if id.epoch == epoch { 1..=1 } else { 0..=1 };
        assert!(expect.contains(&oks.len()), "{id}: completions {oks:?}");
    }
    for id in &failed_back {
        let oks = completions.get(id).map(Vec::as_slice).unwrap_or_default();
        assert!(
            oks.iter().all(|ok| !ok),
            "{id} failed back, yet completed {oks:?}"
        );
    }
}

/// The receiver's side: a write lands only in its incarnation's pages (a landing the
/// dead incarnation finished failed back instead of reaching the new one).
fn check_landings(records: &[Record]) {
    let mut epoch = 0;
    let mut landed = 0;
    for r in records {
        match r {
            Record::Fault(FaultEvent::Restart { epoch: e, .. }) => epoch = *e,
            Record::Engine(TraceEvent::KvLanded { write, dst, .. }) => {
                landed += 1;
                assert!(
                    dst.iter().all(|t| t.gen.epoch() == epoch),
                    "{write} landed in incarnation {epoch} with tags {dst:?}"
                );
            }
            _ => {}
        }
    }
    assert!(landed > 100, "the bed landed {landed} writes");
}
