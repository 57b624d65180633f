//! What of a router's tokens reaches its client's stream as decode makes them: the
//! router's own [`Effect::Stream`](kvsim_engine::env::Effect::Stream), which
//! [`Io`](crate::node::io::Io) passes to the client's reply as the router emits it
//! (once per index, for a request not yet answered, from the room's own decode node).
//! This module holds its test over a router's loop.

#[cfg(test)]
mod tests {
    use crate::node::event::NodeEvent;
    use crate::node::io::Io;
    use crate::node::node_loop::NodeLoop;
    use crate::node::reply::{ReplyEv, ReplySink};
    use crate::node::step::RuntimeNode;
    use crate::seam::Threads;
    use crate::sync::mpsc::channel;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::ids::{NodeId, RequestId, TenantId};
    use kvsim_engine::msg::{Carried, Msg};
    use kvsim_engine::router::Router;
    use kvsim_engine::shared_cfg::Cfg;
    use std::collections::BTreeMap;

    /// The router's loop passes each token it took to the client's stream as it
    /// arrives, and nothing it refused (a token from a node that is not the room's
    /// decode node).
    #[test]
    fn tokens_reach_the_client_as_decode_makes_them() {
        let (router, p, d, client) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let cfg = Cfg::new(EngineConfig::default());
        let node = RuntimeNode::<SymbolicGpu>::Router(Router::new(router, cfg, vec![p], vec![d]));
        let (me, rx) = channel();
        let (ptx, _prx) = channel();
        let (dtx, drx) = channel();
        let peers = BTreeMap::from([(p, ptx), (d, dtx)]);
        let rt = Threads::new(None, peers, me, rx);
        let mut lp = NodeLoop::new(node, Io::new(router, 0, client, rt));
        let (tx, answers) = channel();
        lp.handle(NodeEvent::Submit {
            req: RequestId(7),
            tenant: TenantId(0),
            prompt: vec![1, 2, 3, 4],
            max_new_tokens: 2,
            reply: ReplySink::channel(tx),
        });
        let room = match drx.try_recv() {
            Ok(Carried::Msg(Msg::DecodeStart { room, .. })) => room,
            other => panic!("decode was not started: {other:?}"),
        };
        let out = |index, token| Msg::TokenOut { room, index, token };
        lp.handle(NodeEvent::Msg {
            from: p,
            msg: out(0, 99),
        });
        assert!(
            answers.try_recv().is_err(),
            "a token from prefill is not decode's"
        );
        lp.handle(NodeEvent::Msg {
            from: d,
            msg: out(0, 5),
        });
        assert_eq!(
            answers.try_recv().ok(),
            Some(ReplyEv::Token { index: 0, token: 5 })
        );
        lp.handle(NodeEvent::Msg {
            from: d,
            msg: out(1, 6),
        });
        assert_eq!(
            answers.try_recv().ok(),
            Some(ReplyEv::Token { index: 1, token: 6 })
        );
        assert!(
            answers.try_recv().is_err(),
            "no answer before decode finished"
        );
    }
}
