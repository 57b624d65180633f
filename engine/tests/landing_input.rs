//! One door into a decode node: a KV write that a driver's own receiver landed (the
//! hardware runtime's transfer thread, through [`land`]) enters the node as
//! [`Input::Landed`] through `handle`, never through a second public method.
//!
//! Checked here, on one decode node cloned out of a hand-stepped run: a landing fed
//! through `handle` has exactly the effects (trace events, completion, order), phase
//! and memory of the same write delivered as a `KvWrite` message, refused or not; and
//! a landing from a node that is not the room's writer is refused by the same peer
//! rule, with the same effects, as that write delivered would be. Not a test of the
//! transfer thread itself (the runtime's tests cover it).

mod common;
use common::{cfg, handled, prompt, LEN, NEW};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::land;
use kvsim_engine::msg::Msg;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::Topology;
use kvsim_engine::{Effect, EngineConfig, Input, Outbox, Timer};

type H = common::H;
type Node = DecodeNode<SymbolicGpu>;
type Write = Msg<SymbolicPage>;

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
    h.in_flight()[i].msg.clone()
}

/// What one input did to a copy of `node`: its effects, and the node after it.
fn feed(node: &Node, input: Input<SymbolicPage>) -> (Vec<Effect<Write>>, Node) {
    let mut n = node.clone();
    let mut out = Outbox::new(0);
    n.handle(input, &mut out);
    n.invariants().unwrap();
    (out.effects, n)
}

/// `msg` delivered from `from`, and the same write landed outside the node (on a copy
/// of its memory, as the transfer thread lands it on the shared memory) then fed as a
/// landing: the same effects, phase and memory.
fn same_both_ways(cfg: &EngineConfig, node: &Node, room: RoomKey, from: NodeId, msg: Write) {
    let (delivered, a) = feed(
        node,
        Input::Message {
            from,
            msg: msg.clone(),
        },
    );
    let Msg::KvWrite { id, dst, kv, .. } = msg else {
        panic!("not a write: {msg:?}");
    };
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
    assert!(!delivered.is_empty());
    assert_eq!(delivered, landed, "the same effects, in the same order");
    assert_eq!(a.room_phase(room), b.room_phase(room));
    assert_eq!(a.gpu(), &memory, "the same memory written");
    assert_eq!(a.counters().writes_refused, b.counters().writes_refused);
    assert_eq!(a.counters().peer_refused, b.counters().peer_refused);
}

/// The completion each effect list sends, as `(to, ok)`.
fn completions(effects: &[Effect<Write>]) -> Vec<(NodeId, bool)> {
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

#[test]
fn a_landing_through_handle_is_the_delivered_write() {
    let cfg = cfg();
    let (h, room) = sending(cfg.clone());
    let node = h.decode(D1).unwrap().clone();
    same_both_ways(&cfg, &node, room, P1, first_write(&h));
}

#[test]
fn a_refused_landing_through_handle_is_the_refused_delivered_write() {
    let cfg = cfg();
    let (h, room) = sending(cfg.clone());
    let node = h.decode(D1).unwrap().clone();
    let Msg::KvWrite { id, src, kv, .. } = first_write(&h) else {
        unreachable!()
    };
    // Outside the registered memory: the NIC refuses it, gate or not.
    let outside = PageTag {
        page: PageId(99),
        gen: Generation(1),
    };
    let dst = vec![outside; kv.len()];
    let forged = Msg::KvWrite { id, src, dst, kv };
    same_both_ways(&cfg, &node, room, P1, forged);
}

#[test]
fn a_landing_gated_on_a_two_sided_transport_is_the_delivered_write() {
    let mut cfg = cfg();
    cfg.transport = kvsim_engine::world::KvTransport::TwoSided;
    cfg.defenses.landing_gate = true;
    assert!(cfg.landing_gated());
    let (h, room) = sending(cfg.clone());
    let node = h.decode(D1).unwrap().clone();
    same_both_ways(&cfg, &node, room, P1, first_write(&h));
}

/// A landing of `from` for the write `id` is refused by the peer rule: traced as
/// `PeerRefused` naming a `KvWrite`, completed once with `ok: false` to its sender,
/// nothing noted; exactly what the same write delivered as a message gets.
fn refused_as_a_write(
    node: &Node,
    room: RoomKey,
    base: Write,
    from: NodeId,
    id: WriteId,
    why: &str,
) {
    let Msg::KvWrite { src, dst, kv, .. } = base else {
        unreachable!()
    };
    let msg = Msg::KvWrite {
        id,
        src,
        dst: dst.clone(),
        kv,
    };
    let (delivered, _) = feed(node, Input::Message { from, msg });
    let landed_input = Input::Landed {
        from,
        id,
        dst,
        landing: Ok(()),
    };
    let (landed, after) = feed(node, landed_input);
    assert_eq!(landed, delivered, "refused the way the delivered write is");
    assert_eq!(completions(&landed), vec![(from, false)]);
    let refusals: Vec<&str> = landed
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
    assert_eq!(refusals.len(), 1, "{landed:?}");
    assert!(refusals[0].contains(why), "{}", refusals[0]);
    assert!(
        !landed
            .iter()
            .any(|e| matches!(e, Effect::Trace(TraceEvent::KvLanded { .. }))),
        "nothing landed"
    );
    assert_eq!(
        after.room_phase(room),
        node.room_phase(room),
        "no page noted"
    );
    assert_eq!(
        after.counters().peer_refused,
        node.counters().peer_refused + 1
    );
}

#[test]
fn a_landing_from_another_prefill_node_is_refused_like_its_write() {
    let (h, room) = sending(cfg());
    let node = h.decode(D1).unwrap().clone();
    let id = match first_write(&h) {
        Msg::KvWrite { id, .. } => WriteId { writer: P2, ..id },
        other => panic!("{other:?}"),
    };
    refused_as_a_write(&node, room, first_write(&h), P2, id, "prefill node is n1");
}

#[test]
fn a_landing_whose_id_names_another_writer_is_refused_like_its_write() {
    let (h, room) = sending(cfg());
    let node = h.decode(D1).unwrap().clone();
    let id = match first_write(&h) {
        Msg::KvWrite { id, .. } => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(id.writer, P1);
    refused_as_a_write(
        &node,
        room,
        first_write(&h),
        STRANGER,
        id,
        "names another writer",
    );
}
