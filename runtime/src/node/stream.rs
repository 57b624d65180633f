//! What of a router's tokens reaches its client's stream as decode makes them: the
//! stream decision, taken from the router's state after it handled the token's
//! message. Not the terminal answer (the router's own `Response`, through
//! [`Io`](crate::node::io::Io)) nor how a front renders the stream.

use crate::node::node_loop::NodeLoop;
use crate::node::reply::ReplyEv;
use crate::seam::NodeRuntime;
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RoomKey, Token};
use kvsim_engine::msg::Msg;
use kvsim_engine::node::Node;

impl<G: Gpu, R: NodeRuntime<Kv = G::Kv>> NodeLoop<G, R> {
    /// The token a message read off a connection carries to the router, to be passed
    /// on ([`NodeLoop::stream_token`]) once the router has handled the message.
    pub(super) fn streamable_token(&self, msg: &Msg) -> Option<(RoomKey, u32, Token)> {
        match (&self.node, msg) {
            (Node::Router(_), Msg::TokenOut { room, index, token }) => {
                Some((*room, *index, *token))
            }
            _ => None,
        }
    }

    /// A token decode produced, to its client's stream as it is made: only a token the
    /// router took (from the room's own decode node, for a room not yet answered, now
    /// held at its index) is passed on, read from the router's state after it handled
    /// the message; the terminal answer still comes from the router alone.
    pub(super) fn stream_token(&mut self, from: NodeId, room: RoomKey, index: u32, token: Token) {
        let Node::Router(r) = &self.node else {
            return;
        };
        let Some(st) = r.room_state(room) else {
            return;
        };
        let held = st.tokens.get(index as usize).copied().flatten() == Some(token);
        if st.decode != from || st.answered || !held {
            return;
        }
        if let Some(c) = self.io.clients.get_mut(&st.req) {
            c.send(ReplyEv::Token { index, token });
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::node::event::NodeEvent;
    use crate::node::io::Io;
    use crate::node::node_loop::NodeLoop;
    use crate::node::reply::{ReplyEv, ReplySink};
    use crate::node::step::RuntimeNode;
    use crate::seam::Threads;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::ids::{NodeId, RequestId, TenantId};
    use kvsim_engine::msg::{Carried, Msg};
    use kvsim_engine::router::Router;
    use kvsim_engine::shared_cfg::Cfg;
    use std::collections::BTreeMap;
    use std::sync::mpsc::channel;

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
