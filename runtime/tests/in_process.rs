//! A whole deployment in process: the router's, a prefill node's and a decode node's
//! loops, each over the in-memory runtime (`kvsim_runtime::seam::InMemory`), with the
//! messages each sends moved into its peer's queue. The loops and nodes are the ones
//! `kvsim serve` runs; only the threads, sockets, clock and files are replaced.
//!
//! What it checks: a request is answered end to end; each node's own invariants are
//! checked after every input (and not with the check off); a node that asks to be
//! restarted is restarted in its loop.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::EngineConfig;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::SymbolicGpu;
use kvsim_engine::ids::{NodeId, PageTag, RequestId, RoomKey, TenantId, WriteId};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::{PageRecords, SharedRecord};
use kvsim_engine::msg::{Carried, Msg, Status, TransferOutcome};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::shared_cfg::Cfg;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::worker::WorkerFront;
use kvsim_engine::world::WriteFailure;
use kvsim_oracle::schema::{FaultEvent, Record};
use kvsim_runtime::gpu::SharedGpu;
use kvsim_runtime::node::{Io, LandingRecord, NodeEvent, NodeLoop, ReplyEv, ReplySink};
use kvsim_runtime::seam::InMemory;
use kvsim_runtime::Reply;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;

type Kv = <SymbolicGpu as kvsim_engine::gpu::Gpu>::Kv;
type Loop = NodeLoop<SymbolicGpu, InMemory<Kv>>;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);
const CLIENT: NodeId = NodeId(3);
const PAGES: u32 = 16;
const PAGE: u32 = 4;
/// Most turns a deployment takes to settle (it settles in far fewer).
const TURNS: usize = 100_000;

/// The three loops, indexed by node id.
struct Deployment {
    loops: Vec<Loop>,
}

fn cfg(bugs: BugSet) -> Cfg {
    Cfg::new(EngineConfig {
        page_size: PAGE,
        chunk_pages: 1,
        bugs,
        ..EngineConfig::default()
    })
}

impl Deployment {
    fn new(bugs: BugSet) -> Self {
        let cfg = cfg(bugs);
        let gpu = || SharedGpu::new(SymbolicGpu::new(PAGES, PAGE));
        let router = Node::Router(Router::new(
            ROUTER,
            cfg.clone(),
            vec![PREFILL],
            vec![DECODE],
        ));
        let prefill = Node::Prefill(PrefillNode::new(PREFILL, cfg.clone(), ROUTER, gpu()));
        let pool = Arc::new(SharedPool::new(PAGES, PAGE));
        let decode = Node::Decode(DecodeNode::with_records(
            DECODE,
            cfg,
            ROUTER,
            vec![PREFILL],
            gpu(),
            SharedRecord::new(pool),
        ));
        let loops = [(ROUTER, router), (PREFILL, prefill), (DECODE, decode)]
            .into_iter()
            .map(|(id, node)| {
                // Compute on device threads, as under `kvsim serve`.
                NodeLoop::new(node, Io::new(id, 0, CLIENT, InMemory::new()))
                    .on_device_thread()
                    .expect("a device thread starts")
            })
            .collect();
        Deployment { loops }
    }

    fn node(&mut self, id: NodeId) -> &mut Loop {
        &mut self.loops[id.0 as usize]
    }

    /// Every message sent and KV write posted goes into its receiver's queue, as from
    /// its sender (a write lands there as the world says: no transfer thread here).
    fn carry(&mut self) {
        for from in 0..self.loops.len() {
            for (to, msg) in self.loops[from].io.rt.take_sent() {
                let from = NodeId(from as u16);
                let ev = match msg {
                    Carried::Msg(msg) => NodeEvent::Msg { from, msg },
                    Carried::Write(write) => NodeEvent::Write { from, write },
                };
                self.loops[to.0 as usize].io.rt.events.push_back(ev);
            }
        }
    }

    /// How long until `lp`'s next timer (`None`: none pending).
    fn next_timer(lp: &mut Loop) -> Option<std::time::Duration> {
        let (id, now) = (lp.io.id, lp.io.rt.now_ns);
        lp.io.timers.wait(id, now)
    }

    /// Turn the loops until no message is on its way and no timer is pending, moving
    /// messages first and a node's clock (to its next timer) only when every loop is
    /// idle, the node with the nearest timer first.
    fn settle(&mut self) {
        for _ in 0..TURNS {
            self.carry();
            if !self.step() {
                return;
            }
        }
        panic!("the deployment did not settle in {TURNS} turns");
    }

    /// Turn one loop: the first with work, else the one with the nearest timer. `false`
    /// when no loop has anything to do.
    fn step(&mut self) -> bool {
        let busy = self.loops.iter_mut().position(|lp| {
            !lp.io.rt.events.is_empty() || Self::next_timer(lp).is_some_and(|w| w.is_zero())
        });
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

    /// Turn the loops until prefill has a KV write on its way (sent, not carried yet).
    fn until_prefill_writes(&mut self) {
        for _ in 0..TURNS {
            let sent = &self.node(PREFILL).io.rt.sent;
            if sent.iter().any(|(_, m)| matches!(m, Carried::Write(_))) {
                return;
            }
            self.carry();
            assert!(self.step(), "the deployment settled before prefill wrote");
        }
        panic!("prefill wrote nothing in {TURNS} turns");
    }

    /// Submit a request to the router's loop; its answers arrive on the receiver.
    fn submit(&mut self, req: u64, max_new_tokens: u32) -> Receiver<ReplyEv> {
        let (tx, rx) = channel();
        let ev = NodeEvent::Submit {
            req: RequestId(req),
            tenant: TenantId(0),
            prompt: (1..=10).collect(),
            max_new_tokens,
            reply: ReplySink::channel(tx),
        };
        self.node(ROUTER).io.rt.events.push_back(ev);
        rx
    }

    /// The room the router started for request `req`.
    fn room_of(&self, req: u64) -> RoomKey {
        let recs = &self.loops[DECODE.0 as usize].io.rt.records;
        recs.iter()
            .find_map(|r| match r {
                Record::Engine(TraceEvent::Admitted { room, req: q, .. }) if q.0 == req => {
                    Some(*room)
                }
                _ => None,
            })
            .expect("decode admitted the request's room")
    }

    /// The violations a node's loop traced.
    fn violations(&self, id: NodeId) -> Vec<String> {
        let recs = &self.loops[id.0 as usize].io.rt.records;
        recs.iter()
            .filter_map(|r| match r {
                Record::Violation { violation, .. } => Some(violation.invariant.to_string()),
                _ => None,
            })
            .collect()
    }
}

fn answer(rx: &Receiver<ReplyEv>) -> Reply {
    let done = rx.try_iter().find_map(|ev| match ev {
        ReplyEv::Done(reply) => Some(reply),
        ReplyEv::Token { .. } | ReplyEv::Params { .. } => None,
    });
    done.expect("the request was answered")
}

/// A request through the three loops: answered 200 with its tokens, every page free
/// again, nothing broken.
#[test]
fn a_request_is_answered_through_the_three_loops() {
    let mut dep = Deployment::new(BugSet::default());
    let rx = dep.submit(1, 3);
    dep.settle();
    let reply = answer(&rx);
    assert_eq!(reply.status, Status::OK.0, "{reply:?}");
    assert_eq!(reply.tokens.len(), 3);
    for id in [ROUTER, PREFILL, DECODE] {
        assert_eq!(dep.violations(id), Vec::<String>::new(), "{id}");
    }
    let decode = dep.node(DECODE).node.as_decode().map(|d| d.requests());
    assert_eq!(decode, Some(0), "decode holds no request after the answer");
}

/// Under `double-free-on-finish` a finished room's pages are freed again by a late
/// abort: the decode node's own invariants break at that input, and its loop says so
/// (a violation record, the node's fault) at once, once.
#[test]
fn a_broken_node_invariant_is_reported_at_the_input_that_broke_it() {
    let mut dep = deployment_with_a_double_free();
    let broke = dep.violations(DECODE);
    assert_eq!(
        broke,
        vec!["S8".to_string()],
        "one violation: a page freed twice"
    );
    let abort = NodeEvent::Msg {
        from: ROUTER,
        msg: Msg::Abort {
            room: dep.room_of(1),
        },
    };
    dep.node(DECODE).io.rt.events.push_back(abort);
    dep.settle();
    assert_eq!(dep.violations(DECODE).len(), 1, "reported once");
    assert!(!dep.node(DECODE).check_invariants, "checking stopped");
}

/// The same double free with the check off (`kvsim serve --no-invariants`): nothing is
/// reported.
#[test]
fn with_the_check_off_nothing_is_reported() {
    let mut dep = Deployment::new(BugSet::parse("double-free-on-finish").expect("a bug"));
    for lp in &mut dep.loops {
        lp.check_invariants = false;
    }
    double_free(&mut dep);
    assert_eq!(dep.violations(DECODE), Vec::<String>::new());
}

fn deployment_with_a_double_free() -> Deployment {
    let mut bugs = BugSet::default();
    bugs.insert(Bug::DoubleFreeOnFinish);
    let mut dep = Deployment::new(bugs);
    double_free(&mut dep);
    dep
}

/// A request runs to its answer, then the router's abort of its room reaches decode
/// late (the bug's second release path).
fn double_free(dep: &mut Deployment) {
    let rx = dep.submit(1, 2);
    dep.settle();
    assert_eq!(answer(&rx).status, Status::OK.0);
    let abort = NodeEvent::Msg {
        from: ROUTER,
        msg: Msg::Abort {
            room: dep.room_of(1),
        },
    };
    dep.node(DECODE).io.rt.events.push_back(abort);
    dep.settle();
}

/// A decode node's loop alone, deciding with `pool` (its transfer thread's record is
/// `landing`, on the same pool).
fn decode_loop(bugs: BugSet, pool: Arc<SharedPool>) -> (Loop, Arc<LandingRecord>) {
    let gpu = SharedGpu::new(SymbolicGpu::new(PAGES, PAGE));
    let record = SharedRecord::new(pool.clone());
    let node = DecodeNode::with_records(DECODE, cfg(bugs), ROUTER, vec![PREFILL], gpu, record);
    let mut lp = NodeLoop::new(
        Node::Decode(node),
        Io::new(DECODE, 0, CLIENT, InMemory::new()),
    );
    let landing = LandingRecord::new(pool);
    lp.landing = Some(landing.clone());
    (lp, landing)
}

/// Start decode's half of `room` and turn its loop until it sent prefill the room's
/// page list: the pages.
fn start_decode(lp: &mut Loop, room: RoomKey) -> Vec<PageTag> {
    let start = Msg::DecodeStart {
        room,
        req: RequestId(room.gen.0),
        prompt: (1..=8).collect(),
        max_new_tokens: 2,
        prefill: PREFILL,
    };
    lp.io.rt.events.push_back(NodeEvent::Msg {
        from: ROUTER,
        msg: start,
    });
    for _ in 0..TURNS {
        let meta = lp.io.rt.sent.iter().find_map(|(_, m)| match m {
            Carried::Msg(Msg::KvMeta { room: r, dst, .. }) if *r == room => Some(dst.clone()),
            _ => None,
        });
        if let Some(dst) = meta {
            return dst;
        }
        assert!(lp.turn(), "the decode loop ended");
    }
    panic!("decode sent no page list in {TURNS} turns");
}

fn faults(lp: &Loop) -> Vec<String> {
    let recs = lp.io.rt.records.iter();
    recs.filter_map(|r| match r {
        Record::Fault(FaultEvent::Crash { node, epoch, .. }) => {
            Some(format!("crash {node} e{epoch}"))
        }
        Record::Fault(FaultEvent::Restart { node, epoch }) => {
            Some(format!("restart {node} e{epoch}"))
        }
        _ => None,
    })
    .collect()
}

/// A node whose own page record refuses what its logic asks (`PageRecordRefused`, a
/// fault whose action is a restart) is restarted in its loop as the next epoch, as the
/// simulator's crash and restart have it: the engine's restart re-creates its state,
/// the transfer thread's record follows, a landing the dead incarnation finished fails
/// back, and the new incarnation serves with tags of its own epoch.
#[test]
fn a_node_that_asks_to_be_restarted_restarts_in_process() {
    let mut bugs = BugSet::default();
    bugs.insert(Bug::FailOpenOnRecvError);
    let pool = Arc::new(SharedPool::new(PAGES, PAGE));
    let (mut lp, landing) = decode_loop(bugs, pool.clone());
    let room = RoomKey::new(1, 1);
    let dst = start_decode(&mut lp, room);
    // The record is corrupted behind the node's back: its pages are free again, so
    // marking them ready (fail-open takes a failed transfer as done) is refused.
    pool.free_unchecked(&dst);
    let done = Msg::KvDone {
        room,
        outcome: TransferOutcome::Failed,
        epoch: 0,
    };
    assert!(lp.handle(NodeEvent::Msg {
        from: PREFILL,
        msg: done,
    }));
    assert_eq!(faults(&lp), vec!["crash n2 e0", "restart n2 e1"]);
    assert_eq!(lp.io.epoch, 1);
    let d = lp.node.as_decode().expect("a decode node");
    assert_eq!(d.requests(), 0, "the dead incarnation's requests are gone");
    assert_eq!(d.records().epoch(), 1);
    assert!(
        Arc::ptr_eq(&landing.current(), d.records().shared()),
        "the transfer thread lands with the new incarnation's record"
    );
    assert_eq!(
        lp.io.timers.pending(),
        0,
        "the dead incarnation's timers died"
    );
    assert!(lp.node.invariants().is_ok());

    // A landing the dead incarnation's record admitted fails back to its writer.
    let id = WriteId {
        writer: PREFILL,
        epoch: 0,
        room,
        chunk: 0,
    };
    lp.io.rt.take_sent();
    assert!(lp.handle(NodeEvent::Landed {
        from: PREFILL,
        id,
        dst: dst.clone(),
        landing: Ok(()),
    }));
    let failed = lp.io.rt.records.iter().any(|r| {
        matches!(r, Record::WriteFailed { write, reason: WriteFailure::ReceiverGone, .. } if *write == id)
    });
    assert!(failed, "the dead incarnation's landing fails back");
    let back = lp.io.rt.take_sent();
    assert_eq!(
        back,
        vec![(PREFILL, Carried::Msg(Msg::WriteDone { id, ok: false }))]
    );

    // The new incarnation serves, with tags of its own epoch.
    let fresh = start_decode(&mut lp, RoomKey::new(2, 2));
    assert!(!fresh.is_empty() && fresh.iter().all(|t| t.gen.epoch() == 1));
    assert_eq!(faults(&lp).len(), 2, "one restart");
}

/// The writes a node's `crash` records listed as flushed.
fn flushed(lp: &Loop) -> Vec<WriteId> {
    let recs = lp.io.rt.records.iter();
    recs.flat_map(|r| match r {
        Record::Fault(FaultEvent::Crash { flushed, .. }) => flushed.clone(),
        _ => Vec::new(),
    })
    .collect()
}

/// A prefill node restarted in process while a KV write of its dead incarnation is
/// still on its way to decode: the restart closes the dead incarnation's links, so the
/// write its `crash` record lists as flushed never lands (as the simulator never
/// applies a flushed write), and the request is still answered.
#[test]
fn a_write_flushed_by_an_in_process_restart_never_lands() {
    let mut dep = Deployment::new(BugSet::default());
    let rx = dep.submit(1, 2);
    dep.until_prefill_writes();
    dep.node(PREFILL).restart();
    let gone = flushed(&dep.loops[PREFILL.0 as usize]);
    assert!(!gone.is_empty(), "the write on its way is listed flushed");
    assert_eq!(dep.node(PREFILL).io.rt.links_closed, vec![1]);
    dep.settle();
    let landed: Vec<WriteId> = dep.loops[DECODE.0 as usize]
        .io
        .rt
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Engine(TraceEvent::KvLanded { write, .. }) => Some(*write),
            _ => None,
        })
        .collect();
    let late: Vec<&WriteId> = gone.iter().filter(|w| landed.contains(w)).collect();
    assert!(late.is_empty(), "flushed writes landed at decode: {late:?}");
    assert_ne!(answer(&rx).status, 0, "the request is answered");
}

/// Worker mode, decode: start a half of `room` at the worker front, and prefill's
/// bootstrap's answer that incarnation `prefill_epoch` took its registration.
fn start_worker_half(lp: &mut Loop, room: RoomKey, prefill_epoch: u32) {
    let (tx, _rx) = channel();
    let msg = Msg::DecodeStart {
        room,
        req: RequestId(room.gen.0),
        prompt: (1..=8).collect(),
        max_new_tokens: 2,
        prefill: PREFILL,
    };
    assert!(lp.handle(NodeEvent::StartHalf {
        room,
        msg,
        max_new_tokens: 2,
        reply: ReplySink::channel(tx),
        refused: false,
        prefill_epoch: None,
    }));
    let msg = Msg::Registered {
        room,
        epoch: prefill_epoch,
    };
    assert!(lp.handle(NodeEvent::FrontPeer { from: PREFILL, msg }));
}

fn cleared(lp: &Loop) -> Vec<RoomKey> {
    let recs = lp.io.rt.records.iter();
    recs.filter_map(|r| match r {
        Record::Engine(TraceEvent::RoomCleared { room, .. }) => Some(*room),
        _ => None,
    })
    .collect()
}

/// Worker mode: decode's stand-in for the router clears a room once both halves are
/// terminal; prefill's word of its half's end is lost when the prefill process is
/// killed, so a registration answered by a later incarnation of that prefill node ends
/// the prefill half of every room registered at an earlier one (the restarted node's
/// trace begins with the `crash` that forgets them), and a room registered at an
/// incarnation already known dead is born with its prefill half over. Without the
/// restart the rooms stay open (their prefill halves may still be running).
#[test]
fn a_restarted_prefill_ends_the_halves_of_its_dead_incarnation() {
    let (mut lp, _landing) = decode_loop(BugSet::default(), Arc::new(SharedPool::new(PAGES, PAGE)));
    lp.io.front = Some(WorkerFront::new(DECODE, Role::Decode, ROUTER, true));
    let (a, b, c) = (
        RoomKey::new(1, 11),
        RoomKey::new(2, 12),
        RoomKey::new(3, 13),
    );
    start_worker_half(&mut lp, a, 0);
    // Decode's half of `a` ends (the router went away): prefill's is still open.
    assert!(lp.handle(NodeEvent::AbortHalf { room: a }));
    for _ in 0..100 {
        if lp.io.rt.events.is_empty() {
            break;
        }
        assert!(lp.turn());
    }
    start_worker_half(&mut lp, b, 0);
    assert!(cleared(&lp).is_empty(), "no prefill word, same incarnation");
    // A registration answered by prefill's incarnation 1: incarnation 0 was killed.
    start_worker_half(&mut lp, c, 1);
    assert_eq!(
        cleared(&lp),
        vec![a],
        "a's prefill half died with incarnation 0"
    );
    // b's decode half ends: its prefill half (incarnation 0) is over too.
    assert!(lp.handle(NodeEvent::AbortHalf { room: b }));
    assert_eq!(cleared(&lp), vec![a, b]);
    // A late registration answered by the dead incarnation: born with prefill's half
    // over.
    let d = RoomKey::new(4, 14);
    start_worker_half(&mut lp, d, 0);
    assert!(lp.handle(NodeEvent::AbortHalf { room: d }));
    assert_eq!(cleared(&lp), vec![a, b, d]);
    // c's prefill half (incarnation 1) is alive: c stays open after decode's half.
    assert!(lp.handle(NodeEvent::AbortHalf { room: c }));
    assert_eq!(cleared(&lp), vec![a, b, d]);
}
