//! A decode node behind its worker front, stepped by hand: the router's start
//! reaches the node through the front, which traces nothing the router traces; an
//! start waits for prefill's bootstrap to take its registration; an
//! abort of a half the front does not have is the router's closed connection, which
//! the router hears as the half's end; a message the worker API does not carry never
//! reaches the node.

use crate::config::EngineConfig;
use crate::env::{Effect, Input, Outbox};
use crate::gpu::SymbolicGpu;
use crate::ids::{Generation, NodeId, RequestId, RoomId, RoomKey};
use crate::msg::{Msg, Status};
use crate::nodes::decode::DecodeNode;
use crate::shared_cfg::Cfg;
use crate::trace::TraceEvent;

const ROUTER: NodeId = NodeId(0);
const PREFILL: NodeId = NodeId(1);
const DECODE: NodeId = NodeId(2);

fn decode_behind() -> DecodeNode<SymbolicGpu> {
    let cfg = Cfg::new(EngineConfig::default());
    let gpu = SymbolicGpu::new(64, cfg.page_size);
    let mut n = DecodeNode::new(DECODE, cfg, ROUTER, vec![PREFILL], gpu);
    n.put_behind(ROUTER, true);
    n
}

fn from_router(n: &mut DecodeNode<SymbolicGpu>, msg: Msg) -> Vec<Effect<Msg>> {
    let mut out = Outbox::new(0);
    n.handle(Input::Message { from: ROUTER, msg }, &mut out);
    out.effects
        .into_iter()
        .map(|e| match e {
            Effect::Write { .. } => panic!("decode posts no write"),
            Effect::Send { to, msg } => Effect::Send { to, msg },
            Effect::Timer(op) => Effect::Timer(op),
            Effect::Trace(t) => Effect::Trace(t),
            Effect::Stream { .. } | Effect::Compute(_) => panic!("not at a start"),
        })
        .collect()
}

#[test]
fn the_router_reaches_a_node_only_through_its_front() {
    let mut n = decode_behind();
    let room = RoomKey {
        room: RoomId(1),
        gen: Generation(7),
    };
    // An abort of a half the front does not have: the router's connection closes,
    // and the router hears the half's end.
    let out = from_router(&mut n, Msg::Abort { room });
    let closed = Msg::DecodeFinished {
        room,
        status: Status::CLIENT_CLOSED,
        why: None,
    };
    assert_eq!(
        out,
        vec![Effect::Send {
            to: ROUTER,
            msg: closed
        }]
    );
    // The start reaches the node (its page list goes to prefill); the pairing's
    // record is the router's, not the front's.
    let start = Msg::DecodeStart {
        room,
        req: RequestId(7),
        prompt: (1..=8).collect(),
        max_new_tokens: 2,
        prefill: PREFILL,
    };
    let out = from_router(&mut n, start);
    let register = Msg::Register { room };
    assert_eq!(
        out,
        vec![Effect::Send {
            to: PREFILL,
            msg: register
        }]
    );
    // Prefill's bootstrap takes the registration: the half reaches the node.
    let mut o = Outbox::new(0);
    let msg = Msg::Registered { room, epoch: 0 };
    n.handle(Input::Message { from: PREFILL, msg }, &mut o);
    let out = o.effects;
    let meta = out
        .iter()
        .any(|e| matches!(e, Effect::Send { to, msg: Msg::KvMeta { .. } } if *to == PREFILL));
    assert!(meta, "{out:?}");
    assert!(!out
        .iter()
        .any(|e| matches!(e, Effect::Trace(TraceEvent::Routed { .. }))));
    assert!(n.front.as_ref().is_some_and(|f| f.has_half(room)));
    // What the worker API does not carry never reaches the node.
    let drain = Msg::DrainRequest { room };
    assert_eq!(from_router(&mut n, drain), Vec::new());
}
