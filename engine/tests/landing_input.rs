//! A KV write arriving at a decode node, by the transport's row
//! ([`world::receive`]). No node handler takes a write's bytes: on a two-sided
//! transport the receiver's copy lands it (the gate, the peer rule) and the node gets
//! [`Input::Landed`] through `handle`, the one door the hardware runtime's transfer
//! thread uses too; on one-sided RDMA the receiver's NIC places it and the node runs
//! nothing.
//!
//! Checked here, on one decode node cloned out of a hand-stepped run: on two-sided,
//! `world::receive` has exactly the effects (trace events, completion, order), phase
//! and memory of the same write landed outside the node (as the transfer thread lands
//! it) and fed as a landing, refused or not; a write from a node that is not the
//! room's writer is refused by the peer rule before a byte lands. On one-sided the
//! node's state and counters are untouched, the world states the landing and the
//! completion, and a write lands whoever posted it (a NIC checks no peer). Not a test
//! of the transfer thread itself (the runtime's tests cover it).

mod common;
use common::{cfg, handled, prompt, LEN, NEW};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::{Gpu, SymbolicGpu, SymbolicPage};
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::land;
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use kvsim_engine::node::Node as AnyNode;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{self, KvTransport, Topology};
use kvsim_engine::{Effect, EngineConfig, Input, Outbox, Timer};

type H = common::H;
type Node = DecodeNode<SymbolicGpu>;
type Write = KvWrite<SymbolicPage>;
type Effects = Vec<kvsim_engine::env::OutEffect<SymbolicPage>>;

const P1: NodeId = NodeId(1);
const P2: NodeId = NodeId(2);
const D1: NodeId = NodeId(3);
/// An endpoint that is not a node.
const STRANGER: NodeId = NodeId(9);

/// Two prefill and two decode nodes, so that a wrong but real writer exists; request
/// 1 runs on (P1, D1) and has both chunk writes in flight to D1.
fn sending(cfg: EngineConfig) -> (H, RoomKey) {
    let topo = Topology {
        prefill_pools: vec![8, 8],
        decode_pools: vec![8, 8],
    };
    let mut h = Harness::with_topology(cfg, topo).unwrap();
    handled(h.submit(1, prompt(LEN), NEW).unwrap());
    let room = h.room_of(1).unwrap();
    let s = h.router_room(room).unwrap();
    assert_eq!((s.prefill, s.decode), (P1, D1));
    handled(h.deliver_kind("PrefillStart", P1).unwrap());
    handled(h.deliver_kind("DecodeStart", D1).unwrap());
    handled(h.deliver_kind("KvMeta", P1).unwrap());
    h.fire(P1, Timer::Compute).unwrap();
    h.fire(P1, Timer::Compute).unwrap();
    assert_eq!(h.count_kind("KvWrite"), 2, "both chunk writes in flight");
    (h, room)
}

/// The first chunk write in flight to D1.
fn first_write(h: &H) -> Write {
    let i = h.find_kind("KvWrite", D1).unwrap();
    match h.in_flight()[i].msg.clone() {
        Carried::Write(w) => w,
        other => panic!("not a write: {other:?}"),
    }
}

/// What one input did to a copy of `node`: its effects, and the node after it.
fn feed(node: &Node, input: Input) -> (Effects, Node) {
    let mut n = node.clone();
    let mut out = Outbox::new(0);
    n.handle(input, &mut out);
    n.invariants().unwrap();
    (out.effects, n)
}

/// `write` of `from` arriving at a copy of `node`, through the world's one rule.
fn receive(node: &Node, from: NodeId, write: Write) -> (Effects, Node) {
    let mut n = AnyNode::Decode(node.clone());
    let mut out = Outbox::new(0);
    world::receive(&mut n, from, write, &mut out);
    n.invariants().unwrap();
    let AnyNode::Decode(n) = n else {
        unreachable!("still the decode node")
    };
    (out.effects, n)
}

/// `write` received through the world on a two-sided transport, and the same write
/// landed outside the node (on a copy of its memory, as the transfer thread lands it
/// on the shared memory) then fed as a landing: the same effects, phase and memory.
fn same_both_ways(cfg: &EngineConfig, node: &Node, room: RoomKey, from: NodeId, write: Write) {
    assert_eq!(cfg.transport, KvTransport::TwoSided);
    let (received, a) = receive(node, from, write.clone());
    let KvWrite { id, dst, kv, .. } = write;
    let mut memory = node.gpu().clone();
    let landing = land(
        node.records(),
        &mut memory,
        cfg.landing_gated(),
        id.room,
        &dst,
        &kv,
    );
    let (landed, b) = feed(
        node,
        Input::Landed {
            from,
            id,
            dst,
            landing,
        },
    );
    assert!(!received.is_empty());
    assert_eq!(received, landed, "the same effects, in the same order");
    // The phase is the same (no landing notes anything in it: which pages were
    // written is what their tags say, and the memory is the same).
    assert_eq!(
        a.room_phase(room).map(|_| ()),
        b.room_phase(room).map(|_| ())
    );
    assert_eq!(a.gpu(), &memory, "the same memory written");
    assert_eq!(a.counters().writes_refused, b.counters().writes_refused);
    assert_eq!(a.counters().peer_refused, b.counters().peer_refused);
}

/// The completion each effect list sends, as `(to, ok)`.
fn completions(effects: &Effects) -> Vec<(NodeId, bool)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                to,
                msg: Msg::WriteDone { ok, .. },
            } => Some((*to, *ok)),
            _ => None,
        })
        .collect()
}

fn two_sided() -> EngineConfig {
    let mut cfg = cfg();
    cfg.transport = KvTransport::TwoSided;
    cfg
}

#[test]
fn a_two_sided_write_is_the_landing_through_handle() {
    for gate in [false, true] {
        let mut cfg = two_sided();
        cfg.defenses.landing_gate = gate;
        assert_eq!(cfg.landing_gated(), gate);
        let (h, room) = sending(cfg.clone());
        let node = h.decode(D1).unwrap().clone();
        same_both_ways(&cfg, &node, room, P1, first_write(&h));
    }
}

#[test]
fn a_refused_two_sided_write_is_the_refused_landing_through_handle() {
    let cfg = two_sided();
    let (h, room) = sending(cfg.clone());
    let node = h.decode(D1).unwrap().clone();
    let KvWrite { id, src, kv, .. } = first_write(&h);
    // Outside the registered memory: the NIC refuses it, gate or not.
    let outside = PageTag {
        page: PageId(99),
        gen: Generation(1),
    };
    let dst = vec![outside; kv.len()];
    same_both_ways(&cfg, &node, room, P1, KvWrite { id, src, dst, kv });
}

/// A one-sided write runs nothing at the receiver: the node's phase and counters are
/// as they were, the world states the landing as the receiver's event and the
/// writer's NIC completes it once; the bytes and their tags are in the pages.
#[test]
fn a_one_sided_write_runs_no_receiver_software() {
    let cfg = cfg();
    assert_eq!(cfg.transport, KvTransport::OneSided);
    let (h, room) = sending(cfg);
    let node = h.decode(D1).unwrap().clone();
    let write = first_write(&h);
    let (effects, after) = receive(&node, P1, write.clone());
    assert_eq!(after.room_phase(room).map(|_| ()), Some(()));
    assert_eq!(after.counters(), node.counters(), "no software counted it");
    assert_eq!(after.requests(), node.requests());
    assert_eq!(completions(&effects), vec![(P1, true)]);
    let landed: Vec<&TraceEvent> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Trace(ev) => Some(ev),
            _ => None,
        })
        .collect();
    assert!(
        matches!(landed[..], [TraceEvent::KvLanded { node, write: w, .. }] if *node == D1 && *w == write.id),
        "{landed:?}"
    );
    assert_ne!(after.gpu(), node.gpu(), "the bytes are in the pages");
    for t in &write.dst {
        let tag = after.gpu().page_tag(t.page).unwrap().expect("stamped");
        assert_eq!((tag.room, tag.gen), (room, t.gen));
    }
}

/// On one-sided RDMA a write from a node that is not the room's writer lands all the
/// same: nothing at the receiver checks peers (the page tags it carries are what a
/// later read can check).
#[test]
fn a_one_sided_write_lands_whoever_posted_it() {
    let (h, room) = sending(cfg());
    let node = h.decode(D1).unwrap().clone();
    let mut write = first_write(&h);
    write.id.writer = P2;
    let (effects, after) = receive(&node, P2, write);
    assert_eq!(completions(&effects), vec![(P2, true)]);
    assert_eq!(after.counters().peer_refused, node.counters().peer_refused);
    assert!(after.room_phase(room).is_some());
}

/// A two-sided write of `from` for the write `id` is refused by the peer rule before
/// a byte lands: traced as `PeerRefused` naming a `KvWrite`, completed once with
/// `ok: false` to its sender, nothing landed.
fn refused_as_a_write(node: &Node, base: Write, from: NodeId, id: WriteId, why: &str) {
    let write = KvWrite { id, ..base };
    let (received, after) = receive(node, from, write);
    assert_eq!(completions(&received), vec![(from, false)]);
    let refusals: Vec<&str> = received
        .iter()
        .filter_map(|e| match e {
            Effect::Trace(TraceEvent::PeerRefused {
                from: f,
                msg,
                reason,
                ..
            }) if *f == from && msg == "KvWrite" => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(refusals.len(), 1, "{received:?}");
    assert!(refusals[0].contains(why), "{}", refusals[0]);
    assert!(
        !received
            .iter()
            .any(|e| matches!(e, Effect::Trace(TraceEvent::KvLanded { .. }))),
        "nothing landed"
    );
    assert_eq!(after.gpu(), node.gpu(), "no byte landed");
    assert_eq!(
        after.counters().peer_refused,
        node.counters().peer_refused + 1
    );
}

#[test]
fn a_two_sided_write_from_another_prefill_node_is_refused() {
    let (h, _) = sending(two_sided());
    let node = h.decode(D1).unwrap().clone();
    let id = WriteId {
        writer: P2,
        ..first_write(&h).id
    };
    refused_as_a_write(&node, first_write(&h), P2, id, "prefill node is n1");
}

#[test]
fn a_two_sided_write_whose_id_names_another_writer_is_refused() {
    let (h, _) = sending(two_sided());
    let node = h.decode(D1).unwrap().clone();
    let id = first_write(&h).id;
    assert_eq!(id.writer, P1);
    refused_as_a_write(&node, first_write(&h), STRANGER, id, "names another writer");
}

/// A KV write to a node that registers no memory for writes (a prefill node, the
/// router) lands nothing and fails back with its one failed completion, as a remote
/// access error does: the world's rule, whatever the transport.
#[test]
fn a_write_to_a_node_that_takes_none_fails_back() {
    for cfg in [cfg(), two_sided()] {
        let (mut h, _) = sending(cfg);
        let write = first_write(&h);
        let before = h.node(P2).and_then(AnyNode::gpu).cloned();
        let m = h.mark();
        handled(h.inject(P1, P2, write.clone()).unwrap());
        assert_eq!(h.send_kinds_since(m), vec![(P2, "WriteDone", P1)]);
        let done = h.find_kind("WriteDone", P1).unwrap();
        assert_eq!(
            h.in_flight()[done].msg,
            Carried::Msg(Msg::WriteDone {
                id: write.id,
                ok: false
            })
        );
        assert_eq!(h.node(P2).and_then(AnyNode::gpu).cloned(), before);
        assert!(
            h.events_since(m).is_empty(),
            "nothing traced, nothing landed"
        );
    }
}
