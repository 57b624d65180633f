//! `Node`: one of the three state machines behind one interface, for drivers.
//!
//! Drivers (simulator, model checker, hardware runtime) hold a topology of nodes and
//! feed each one inputs; this enum lets them do so without knowing which is which.
//! `P` is the decode node's form of its ownership record: a [`PagePool`] for every
//! driver but the hardware runtime, whose decode node decides with the
//! [`crate::kv::SharedRecord`] its transfer thread gates landings with.

use crate::compute::{Done, Job};
use crate::env::{Input, Outbox};
use crate::gpu::Gpu;
use crate::ids::NodeId;
use crate::invariant::Violation;
use crate::kv::{PagePool, PageRecords};
use crate::msg::Msg;
use crate::nodes::decode::DecodeNode;
use crate::nodes::prefill::PrefillNode;
use crate::nodes::prefill_vllm::VllmPrefill;
use crate::nodes::router::Router;
use crate::nodes::worker::WorkerFront;
use crate::world::read::serve_read;

pub use crate::nodes::role::Role;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Node<G, P = PagePool> {
    Router(Router),
    Prefill(PrefillNode<G>),
    Decode(DecodeNode<G, P>),
    /// vLLM's prefill (its NIXL connector's pull mode): role `Prefill`.
    VllmPrefill(VllmPrefill<G>),
}

impl<G: Gpu, P: PageRecords> Node<G, P> {
    pub fn id(&self) -> NodeId {
        match self {
            Node::Router(n) => n.id(),
            Node::Prefill(n) => n.id(),
            Node::Decode(n) => n.id(),
            Node::VllmPrefill(n) => n.id(),
        }
    }

    pub fn role(&self) -> Role {
        match self {
            Node::Router(_) => Role::Router,
            Node::Prefill(_) | Node::VllmPrefill(_) => Role::Prefill,
            Node::Decode(_) => Role::Decode,
        }
    }

    /// Feed one input. The node's effects leave through `env`, in the order issued.
    /// An RDMA READ request (`Msg::KvRead`) is not the node's to handle: its NIC
    /// serves it ([`crate::world::serve_read`]) and its software runs nothing.
    pub fn handle(&mut self, input: Input, env: &mut Outbox<G::Kv>) {
        let input = match input {
            Input::Message {
                from,
                msg: Msg::KvRead { id, src, dst },
            } => return serve_read(self.read_source(), from, (id, src, dst), env),
            other => other,
        };
        match self {
            Node::Router(n) => n.handle(input, env),
            Node::Prefill(n) => n.handle(input, env),
            Node::Decode(n) => n.handle(input, env),
            Node::VllmPrefill(n) => n.handle(input, env),
        }
    }

    /// The node's memory as an RDMA READ's source, with its id: registered for remote
    /// reads only on a node that hands out its pages to readers (vLLM's prefill).
    fn read_source(&self) -> Result<(NodeId, &G), NodeId> {
        match self {
            Node::VllmPrefill(n) => Ok((n.id(), n.gpu())),
            other => Err(other.id()),
        }
    }

    /// Put a prefill or decode node behind its worker front, whose router is
    /// `router` (worker mode under an engine router, `nodes/worker/behind.rs`); the
    /// front ends a decode half on its prefill's failure where `cancels_both`.
    pub fn put_behind(&mut self, router: NodeId, cancels_both: bool) {
        match self {
            // SGLang's worker front stands before SGLang's nodes only: worker mode
            // needs the `sglang-router` policy, which builds no vLLM node.
            Node::Router(_) | Node::VllmPrefill(_) => {}
            Node::Prefill(n) => n.put_behind(router, cancels_both),
            Node::Decode(n) => n.put_behind(router, cancels_both),
        }
    }

    /// The worker front the node is behind, if it is.
    pub fn front(&self) -> Option<&WorkerFront> {
        match self {
            Node::Router(_) | Node::VllmPrefill(_) => None,
            Node::Prefill(n) => n.front.as_ref(),
            Node::Decode(n) => n.front.as_ref(),
        }
    }

    /// A prefill or decode node becomes its next incarnation, `epoch` (a driver asks
    /// for it through [`world::restart`](crate::world::restart)).
    ///
    /// # Panics
    /// On the router: it is the clients' endpoint, and no driver restarts it.
    pub(crate) fn reincarnate(&mut self, epoch: u32) {
        match self {
            Node::Router(_) => panic!(
                "the router is never restarted (drivers restart prefill and decode nodes only)"
            ),
            Node::Prefill(n) => n.reincarnate(epoch),
            Node::Decode(n) => n.reincarnate(epoch),
            Node::VllmPrefill(n) => n.reincarnate(epoch),
        }
    }

    /// The node's local invariants (pool partition, ownership bookkeeping).
    pub fn invariants(&self) -> Result<(), Violation> {
        match self {
            Node::Router(n) => n.invariants(),
            Node::Prefill(n) => n.invariants(),
            Node::Decode(n) => n.invariants(),
            Node::VllmPrefill(n) => n.invariants(),
        }
    }

    pub fn gpu(&self) -> Option<&G> {
        match self {
            Node::Router(_) => None,
            Node::Prefill(n) => Some(n.gpu()),
            Node::Decode(n) => Some(n.gpu()),
            Node::VllmPrefill(n) => Some(n.gpu()),
        }
    }

    /// The requests (rooms, on the router) the node holds now.
    pub fn live_requests(&self) -> usize {
        match self {
            Node::Router(n) => n.live_rooms(),
            Node::Prefill(n) => n.requests(),
            Node::Decode(n) => n.requests(),
            Node::VllmPrefill(n) => n.requests(),
        }
    }

    /// A prefill node's phase of `room`, as text (`None`: not a prefill node, or no
    /// request of the room there).
    pub fn prefill_phase_text(&self, room: crate::ids::RoomKey) -> Option<String> {
        match self {
            Node::Prefill(n) => n.room_phase(room).map(|p| format!("{p:?}")),
            Node::VllmPrefill(n) => n.room_phase(room).map(|p| format!("{p:?}")),
            Node::Router(_) | Node::Decode(_) => None,
        }
    }

    pub fn as_prefill(&self) -> Option<&PrefillNode<G>> {
        match self {
            Node::Prefill(n) => Some(n),
            _ => None,
        }
    }

    pub fn as_decode(&self) -> Option<&DecodeNode<G, P>> {
        match self {
            Node::Decode(n) => Some(n),
            _ => None,
        }
    }
}

impl<G: Gpu> Node<G> {
    pub fn pool(&self) -> Option<&PagePool> {
        match self {
            Node::Router(_) => None,
            Node::Prefill(n) => Some(n.pool()),
            Node::Decode(n) => Some(n.pool()),
            Node::VllmPrefill(n) => Some(n.pool()),
        }
    }
}

impl<G: Gpu, P: PageRecords> crate::step::Stepper<G::Kv> for Node<G, P> {
    fn handle(&mut self, input: Input, out: &mut Outbox<G::Kv>) {
        Node::handle(self, input, out);
    }
    fn compute(&mut self, job: Job) -> Done {
        match self {
            Node::Router(_) => unreachable!("the router asks for no compute"),
            Node::Prefill(n) => crate::step::Stepper::compute(n, job),
            Node::Decode(n) => crate::step::Stepper::compute(n, job),
            Node::VllmPrefill(n) => crate::step::Stepper::compute(n, job),
        }
    }
}
