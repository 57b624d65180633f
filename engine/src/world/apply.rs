//! Carrying out a node's effects: the one loop every driver runs over a step's
//! effects, through the driver's own [`Driver`].

use crate::env::{Effect, TimerOp};
use crate::ids::{NodeId, RequestId, Token};
use crate::trace::TraceEvent;

/// What a driver provides to carry out one node's effects (`M`: the message form it
/// takes, `T`: the event form, `W`: the KV write form; owned `Msg`, `TraceEvent` and
/// `KvWrite<K>` for most drivers).
pub trait Driver<M, T = TraceEvent, W = M> {
    /// `from` sent `msg` to `to`: the driver's network takes it (see [`transport`](crate::world::transport)).
    fn send(&mut self, from: NodeId, to: NodeId, msg: M);
    /// `from` posted the KV write `write` into `to`'s pool: the driver carries it
    /// (a [`Carried::Write`](crate::world::Carried)) to [`arrival`](crate::world::arrival)
    /// and [`receive`](crate::world::receive).
    fn write(&mut self, from: NodeId, to: NodeId, write: W);
    /// `node` set or cancelled a timer (see [`Timers::apply`](crate::world::Timers::apply)).
    fn timer(&mut self, node: NodeId, op: TimerOp);
    /// `node` emitted an event (a [`TraceEvent::Fault`] asks the driver to act, see
    /// [`crate::trace::NodeFault::action`]).
    fn event(&mut self, node: NodeId, event: T);
    /// `node` streamed token `index` of `req`'s reply to its client `to`
    /// ([`Effect::Stream`]): a driver whose client shows replies as they are made
    /// passes it on; the others' clients read only the terminal answer.
    fn stream(&mut self, node: NodeId, to: NodeId, req: RequestId, index: u32, token: Token);
}

/// Carry out the effects of one handler call of `node`, in the order it issued them.
pub fn apply<M, T, W, D: Driver<M, T, W>>(
    node: NodeId,
    effects: impl IntoIterator<Item = Effect<M, T, W>>,
    d: &mut D,
) {
    for effect in effects {
        match effect {
            Effect::Send { to, msg } => d.send(node, to, msg),
            Effect::Write { to, write } => d.write(node, to, write),
            Effect::Timer(op) => d.timer(node, op),
            Effect::Trace(ev) => d.event(node, ev),
            Effect::Stream {
                to,
                req,
                index,
                token,
            } => d.stream(node, to, req, index, token),
            Effect::Compute(job) => panic!(
                "{node} left {job:?} unrun: world::step carries out every compute before apply"
            ),
        }
    }
}
