//! Looking at what happened: the messages in flight, the nodes and their phases, the
//! timers, pages, events and answers.

use crate::decode::{DecodeNode, DecodePhase};
use crate::env::Timer;
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageId, RequestId, RoomKey};
use crate::invariant::Violation;
use crate::kv::PageRecord;
use crate::node::Node;
use crate::prefill::{PrefillNode, PrefillPhase};
use crate::router::{Router, RouterRoomState};
use crate::trace::{NodeFault, TraceEvent};
use crate::world::{self, Transport};

use super::drive::*;
use super::records::*;

impl<G: Gpu> Harness<G> {
    // ---- looking ------------------------------------------------------------------

    /// Messages in flight, in sending order unless the test reordered them.
    pub fn in_flight(&self) -> &[Flight<G::Kv>] {
        &self.world.flights
    }

    /// The index of the first message in flight that matches.
    pub fn find(
        &self,
        what: &str,
        pred: impl Fn(&Flight<G::Kv>) -> bool,
    ) -> Result<usize, HarnessError> {
        self.world
            .flights
            .iter()
            .position(pred)
            .ok_or_else(|| HarnessError::NoMatch(what.to_string()))
    }

    /// The index of the first message in flight of `kind` to `to`.
    pub fn find_kind(&self, kind: &str, to: NodeId) -> Result<usize, HarnessError> {
        self.find(&format!("{kind} to {to}"), |f| {
            f.msg.kind() == kind && f.to == to
        })
    }

    /// How many messages in flight are of `kind`.
    pub fn count_kind(&self, kind: &str) -> usize {
        self.world
            .flights
            .iter()
            .filter(|f| f.msg.kind() == kind)
            .count()
    }

    pub fn node(&self, id: NodeId) -> Option<&Node<G>> {
        self.nodes.get(id.0 as usize)
    }

    pub fn router(&self) -> Option<&Router> {
        match self.nodes.first() {
            Some(Node::Router(r)) => Some(r),
            _ => None,
        }
    }

    pub fn prefill(&self, id: NodeId) -> Option<&PrefillNode<G>> {
        self.node(id)?.as_prefill()
    }

    pub fn decode(&self, id: NodeId) -> Option<&DecodeNode<G>> {
        self.node(id)?.as_decode()
    }

    pub fn prefill_phase(&self, id: NodeId, room: RoomKey) -> Option<PrefillPhase> {
        self.prefill(id)?.room_phase(room)
    }

    pub fn decode_phase(&self, id: NodeId, room: RoomKey) -> Option<DecodePhase> {
        self.decode(id)?.room_phase(room)
    }

    pub fn router_room(&self, room: RoomKey) -> Option<RouterRoomState> {
        self.router()?.room_state(room)
    }

    /// The live room use serving client request `req`.
    pub fn room_of(&self, req: u64) -> Option<RoomKey> {
        self.router()?.room_of(RequestId(req))
    }

    /// `node`'s pending timers, sorted.
    pub fn timers_of(&self, node: NodeId) -> Vec<Timer> {
        self.world.timers.of(node).collect()
    }

    /// Is any timer pending, on any node?
    pub fn any_timer_pending(&self) -> bool {
        !self.world.timers.is_empty()
    }

    pub fn timer_pending(&self, node: NodeId, timer: Timer) -> bool {
        self.world.timers.get(node, timer).is_some()
    }

    /// Every page record of a node's pool (empty for the router).
    pub fn pages(&self, node: NodeId) -> Vec<(PageId, PageRecord)> {
        self.node(node)
            .and_then(|n| n.pool())
            .map(|p| p.records().map(|(id, r)| (id, r.clone())).collect())
            .unwrap_or_default()
    }

    /// Free pages of a node's pool (0 for the router).
    pub fn free_pages(&self, node: NodeId) -> usize {
        self.node(node)
            .and_then(|n| n.pool())
            .map_or(0, |p| p.free_count())
    }

    /// `peer_refused` as the node counts it.
    pub fn peer_refused(&self, node: NodeId) -> u64 {
        match self.node(node) {
            Some(Node::Router(r)) => r.counters().peer_refused,
            Some(Node::Prefill(p)) => p.counters().peer_refused,
            Some(Node::Decode(d)) => d.counters().peer_refused,
            Some(Node::VllmPrefill(p)) => p.counters().peer_refused,
            None => 0,
        }
    }

    /// Every event so far, with the node that emitted it.
    pub fn events(&self) -> &[(NodeId, TraceEvent)] {
        &self.world.events
    }

    /// Every message a node sent so far (to nodes and the client), in order; messages
    /// the test posted or injected are not in it.
    pub fn sends(&self) -> &[Sent<G::Kv>] {
        &self.world.sends
    }

    /// Every answer the client received, in order.
    pub fn responses(&self) -> &[ClientResponse] {
        &self.world.responses
    }

    /// The one answer of a request, if any (the first, should there be more).
    pub fn response(&self, req: u64) -> Option<&ClientResponse> {
        self.world
            .responses
            .iter()
            .find(|r| r.req == RequestId(req))
    }

    /// The faults nodes reported, in order.
    pub fn faults(&self) -> Vec<(NodeId, NodeFault)> {
        self.world
            .events
            .iter()
            .filter_map(|(n, e)| match e {
                TraceEvent::Fault { fault, .. } => Some((*n, fault.clone())),
                _ => None,
            })
            .collect()
    }

    /// The current end of the logs, for [`Harness::events_since`] and friends.
    pub fn mark(&self) -> Mark {
        Mark {
            events: self.world.events.len(),
            sends: self.world.sends.len(),
            responses: self.world.responses.len(),
            order: self.world.order.len(),
        }
    }

    /// The events, sends and dropped duplicate completions since `mark`, in the order
    /// the world carried them out.
    pub fn happened_since(&self, mark: Mark) -> Vec<Happened<'_, G::Kv>> {
        let (mut event, mut send) = (mark.events, mark.sends);
        let mut out = Vec::new();
        for logged in self.world.order.get(mark.order..).unwrap_or(&[]) {
            match logged {
                Logged::Event => {
                    if let Some((node, ev)) = self.world.events.get(event) {
                        out.push(Happened::Event(*node, ev));
                    }
                    event += 1;
                }
                Logged::Send => {
                    if let Some(sent) = self.world.sends.get(send) {
                        out.push(Happened::Sent(sent));
                    }
                    send += 1;
                }
                Logged::DroppedCompletion(node) => {
                    out.push(Happened::DuplicateCompletionDropped(*node));
                }
            }
        }
        out
    }

    pub fn events_since(&self, mark: Mark) -> &[(NodeId, TraceEvent)] {
        self.world.events.get(mark.events..).unwrap_or(&[])
    }

    /// The names of the events since `mark` ([`TraceEvent::name`]), in order.
    pub fn event_names_since(&self, mark: Mark) -> Vec<&'static str> {
        self.events_since(mark)
            .iter()
            .map(|(_, e)| e.name())
            .collect()
    }

    pub fn sends_since(&self, mark: Mark) -> &[Sent<G::Kv>] {
        self.world.sends.get(mark.sends..).unwrap_or(&[])
    }

    /// The sends since `mark` as `(from, kind, to)`, in order.
    pub fn send_kinds_since(&self, mark: Mark) -> Vec<(NodeId, &'static str, NodeId)> {
        self.sends_since(mark)
            .iter()
            .map(|s| (s.from, s.msg.kind(), s.to))
            .collect()
    }

    pub fn responses_since(&self, mark: Mark) -> &[ClientResponse] {
        self.world.responses.get(mark.responses..).unwrap_or(&[])
    }

    /// Every node's local invariants.
    pub fn invariants(&self) -> Result<(), Violation> {
        self.nodes.iter().try_for_each(|n| n.invariants())
    }

    /// How a message between two nodes travels (for tests that reason about faults).
    pub fn transport(&self, f: &Flight<G::Kv>) -> Transport {
        world::transport(f.from, f.to, self.client(), &f.msg)
    }
}
