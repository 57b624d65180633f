//! The node loop's own rules, in process: a loop over the in-memory runtime
//! (`kvsim_runtime::seam::InMemory`: queued events, a virtual clock, every message and
//! record kept), fed the events `kvsim serve`'s threads would feed it.
//!
//! The rules: one completion per KV write (a write failed back is not completed again,
//! a completed one is not failed back); the writes in flight, failed back once each
//! when their peer is lost or has no link; a closed intake refuses new requests and
//! halves.

use kvsim_engine::config::EngineConfig;
use kvsim_engine::gpu::SymbolicGpu;
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RequestId, RoomKey, TenantId};
use kvsim_engine::ids::{Token, WriteId};
use kvsim_engine::msg::{Carried, Msg, Status};
use kvsim_engine::node::{Node, Role};
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::shared_cfg::Cfg;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::worker::WorkerFront;
use kvsim_engine::world::WriteFailure;
use kvsim_oracle::schema::Record;
use kvsim_runtime::gpu::SharedGpu;
use kvsim_runtime::node::{Io, NodeEvent, NodeLoop, ReplyEv, ReplySink};
use kvsim_runtime::seam::InMemory;
use std::sync::mpsc::{channel, Receiver};

type Kv = <SymbolicGpu as kvsim_engine::gpu::Gpu>::Kv;
type Loop = NodeLoop<SymbolicGpu, InMemory<Kv>>;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);
const CLIENT: NodeId = NodeId(3);
/// Tokens per page; one page per write, so a 12-token prompt is three writes.
const PAGE: u32 = 4;
const PROMPT: usize = 12;
/// Most turns a test's loop takes to get anywhere (it gets there in far fewer).
const TURNS: usize = 10_000;

fn cfg() -> Cfg {
    Cfg::new(EngineConfig {
        page_size: PAGE,
        chunk_pages: 1,
        ..EngineConfig::default()
    })
}

fn room() -> RoomKey {
    RoomKey::new(1, 1)
}

/// A prefill node's loop over the in-memory runtime.
fn prefill_loop() -> Loop {
    let gpu = SharedGpu::new(SymbolicGpu::new(16, PAGE));
    let node = Node::Prefill(PrefillNode::new(PREFILL, cfg(), ROUTER, gpu));
    NodeLoop::new(node, Io::new(PREFILL, 0, CLIENT, InMemory::new()))
}

/// Turn the loop while it has events queued or a timer due now.
fn settle(lp: &mut Loop) {
    for _ in 0..TURNS {
        let now = lp.io.rt.now_ns;
        let due = lp.io.timers.wait(PREFILL, now).is_some_and(|w| w.is_zero());
        if lp.io.rt.events.is_empty() && !due {
            return;
        }
        assert!(lp.turn(), "the loop ended while it had work");
    }
    panic!("the loop did not settle in {TURNS} turns");
}

/// Start a room on the prefill loop, give it decode's pages and turn it (its virtual
/// clock running to each compute timer) until every KV write of the prompt is posted.
/// The writes, in order.
fn post_writes(lp: &mut Loop) -> Vec<WriteId> {
    let prompt: Vec<Token> = (1..=PROMPT as u32).collect();
    let dst: Vec<PageTag> = (0..PROMPT as u32 / PAGE)
        .map(|p| PageTag {
            page: PageId(p),
            gen: Generation(1),
        })
        .collect();
    let start = Msg::PrefillStart {
        room: room(),
        req: RequestId(1),
        prompt,
        decode: DECODE,
    };
    let meta = Msg::KvMeta {
        room: room(),
        dst,
        prompt_len: PROMPT as u64,
    };
    let rt = &mut lp.io.rt;
    rt.events.push_back(NodeEvent::Msg {
        from: ROUTER,
        msg: start,
    });
    rt.events.push_back(NodeEvent::Msg {
        from: DECODE,
        msg: meta,
    });
    for _ in 0..TURNS {
        let n = lp.writes_in_flight().len() + failed_writes(&lp.io.rt).len();
        if n == PROMPT / PAGE as usize {
            return written(&lp.io.rt);
        }
        assert!(lp.turn(), "the loop ended before it posted its writes");
    }
    panic!("the prefill loop posted no writes in {TURNS} turns");
}

/// The ids of the KV writes the node traced as sent.
fn written(rt: &InMemory<Kv>) -> Vec<WriteId> {
    rt.records
        .iter()
        .filter_map(|r| match r {
            Record::Engine(TraceEvent::KvSent { write, .. }) => Some(*write),
            _ => None,
        })
        .collect()
}

/// Each completion the node took for `id` (its `ok`), in order.
fn completions(rt: &InMemory<Kv>, id: WriteId) -> Vec<bool> {
    rt.records
        .iter()
        .filter_map(|r| match r {
            Record::Engine(TraceEvent::WriteCompleted { write, ok, .. }) if *write == id => {
                Some(*ok)
            }
            _ => None,
        })
        .collect()
}

/// Each write the loop failed back, with the reason, in order.
fn failed_writes(rt: &InMemory<Kv>) -> Vec<(WriteId, WriteFailure)> {
    rt.records
        .iter()
        .filter_map(|r| match r {
            Record::WriteFailed { write, reason, .. } => Some((*write, *reason)),
            _ => None,
        })
        .collect()
}

fn done(id: WriteId, ok: bool) -> NodeEvent<Kv> {
    NodeEvent::Msg {
        from: DECODE,
        msg: Msg::WriteDone { id, ok },
    }
}

/// A write's completion that was already read off the connection when the connection
/// broke is not the write's completion: the loop failed the write back first (its
/// failed completion queued behind), so the node completes the write once, failed, as
/// the loop's `WriteFailed` says.
#[test]
fn a_write_failed_back_is_not_completed_again() {
    let mut lp = prefill_loop();
    let ids = post_writes(&mut lp);
    assert_eq!(ids.len(), 3, "a 12-token prompt is three one-page writes");
    lp.io
        .rt
        .events
        .push_back(NodeEvent::PeerLost { peer: DECODE });
    lp.io.rt.events.push_back(done(ids[0], true));
    settle(&mut lp);
    for &id in &ids {
        assert_eq!(
            completions(&lp.io.rt, id),
            vec![false],
            "{id}: one completion, the failed one the loop sent back"
        );
    }
    assert_eq!(failed_writes(&lp.io.rt).len(), 3);
    assert!(lp.writes_in_flight().is_empty());
}

/// A write that completed is out of flight: losing its peer afterwards fails back only
/// the writes still in flight, each once; a second loss fails nothing.
#[test]
fn a_completed_write_is_not_failed_back() {
    let mut lp = prefill_loop();
    let ids = post_writes(&mut lp);
    lp.io.rt.events.push_back(done(ids[0], true));
    settle(&mut lp);
    assert_eq!(lp.writes_in_flight().len(), 2, "two writes still in flight");
    lp.io
        .rt
        .events
        .push_back(NodeEvent::PeerLost { peer: DECODE });
    lp.io
        .rt
        .events
        .push_back(NodeEvent::PeerLost { peer: DECODE });
    settle(&mut lp);
    assert_eq!(completions(&lp.io.rt, ids[0]), vec![true]);
    let failed: Vec<WriteId> = failed_writes(&lp.io.rt).iter().map(|f| f.0).collect();
    assert_eq!(
        failed,
        ids[1..].to_vec(),
        "only the writes in flight fail back"
    );
    for &id in &ids[1..] {
        assert_eq!(completions(&lp.io.rt, id), vec![false]);
    }
    assert!(lp.writes_in_flight().is_empty());
}

/// Every write in flight to a lost peer fails back once, as `receiver_gone`, and the
/// node hears one failed completion for each.
#[test]
fn every_write_in_flight_fails_back_when_its_peer_is_lost() {
    let mut lp = prefill_loop();
    let ids = post_writes(&mut lp);
    let posted: Vec<WriteId> = lp.writes_in_flight().iter().map(|w| w.1).collect();
    assert_eq!(posted, ids, "every posted write is in flight, to decode");
    lp.io
        .rt
        .events
        .push_back(NodeEvent::PeerLost { peer: DECODE });
    settle(&mut lp);
    let failed = failed_writes(&lp.io.rt);
    let expect: Vec<(WriteId, WriteFailure)> = ids
        .iter()
        .map(|id| (*id, WriteFailure::ReceiverGone))
        .collect();
    assert_eq!(failed, expect);
    for &id in &ids {
        assert_eq!(completions(&lp.io.rt, id), vec![false]);
    }
    assert!(lp.writes_in_flight().is_empty());
}

/// A write to a peer with no link fails back at once (the world's rule for a receiver
/// that is gone), once, and never reaches the wire.
#[test]
fn a_write_with_no_link_fails_back_at_once() {
    let mut lp = prefill_loop();
    lp.io.rt.unreachable.insert(DECODE);
    let ids = post_writes(&mut lp);
    settle(&mut lp);
    assert_eq!(ids.len(), 3);
    assert_eq!(failed_writes(&lp.io.rt).len(), 3);
    for &id in &ids {
        assert_eq!(completions(&lp.io.rt, id), vec![false]);
    }
    let on_wire = lp.io.rt.sent.iter();
    assert!(
        !on_wire.clone().any(|(_, m)| matches!(m, Carried::Write(_))),
        "a write with no link is not sent"
    );
    assert!(lp.writes_in_flight().is_empty());
}

fn submit(req: u64) -> (NodeEvent<Kv>, Receiver<ReplyEv>) {
    let (tx, rx) = channel();
    let ev = NodeEvent::Submit {
        req: RequestId(req),
        tenant: TenantId(0),
        prompt: vec![1, 2, 3, 4],
        max_new_tokens: 2,
        reply: ReplySink::channel(tx),
    };
    (ev, rx)
}

/// Once its intake is closed, the router's loop answers a new request 503 itself: the
/// request is not traced, and the router starts no room for it.
#[test]
fn a_closed_intake_refuses_new_requests() {
    let node = Node::Router(Router::new(ROUTER, cfg(), vec![PREFILL], vec![DECODE]));
    let mut lp: Loop = NodeLoop::new(node, Io::new(ROUTER, 0, CLIENT, InMemory::new()));
    let (open, _open_rx) = submit(1);
    assert!(lp.handle(open));
    assert!(
        lp.io.rt.take_sent().iter().any(|(to, _)| *to == PREFILL),
        "an open intake starts the room"
    );
    assert!(lp.handle(NodeEvent::CloseIntake));
    let records = lp.io.rt.records.len();
    let (late, late_rx) = submit(2);
    assert!(lp.handle(late));
    match late_rx.try_recv() {
        Ok(ReplyEv::Done(reply)) => assert_eq!(reply.status, Status::UNAVAILABLE.0),
        other => panic!("a closed intake answers at once, 503: {other:?}"),
    }
    assert!(lp.io.rt.sent.is_empty(), "no room is started");
    assert_eq!(lp.io.rt.records.len(), records, "nothing is traced");
}

/// In worker mode a closed intake answers a new half 503 and the node never sees it.
#[test]
fn a_closed_intake_refuses_new_halves() {
    let mut lp = prefill_loop();
    lp.io.front = Some(WorkerFront::new(PREFILL, Role::Prefill, ROUTER, true));
    assert!(lp.handle(NodeEvent::CloseIntake));
    let (tx, rx) = channel();
    let start = Msg::PrefillStart {
        room: room(),
        req: RequestId(1),
        prompt: vec![1, 2, 3, 4],
        decode: DECODE,
    };
    assert!(lp.handle(NodeEvent::StartHalf {
        room: room(),
        msg: start,
        max_new_tokens: 2,
        reply: ReplySink::channel(tx),
        refused: false,
        prefill_epoch: None,
    }));
    match rx.try_recv() {
        Ok(ReplyEv::Done(reply)) => assert_eq!(reply.status, Status::UNAVAILABLE.0),
        other => panic!("a closed intake answers a half at once, 503: {other:?}"),
    }
    let admitted = lp
        .io
        .rt
        .records
        .iter()
        .any(|r| matches!(r, Record::Engine(TraceEvent::Admitted { .. })));
    assert!(!admitted, "the node never saw the half");
}
