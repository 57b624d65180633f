//! `HandoffModel`'s data: the spec, the engine configuration and the oracle's run
//! header it is built from, its node-transition cache key, and the initial state.
//!
//! What is not here: which actions a state enables ([`crate::model::actions`]), how
//! one is carried out ([`crate::model::tx`]), and the properties
//! ([`crate::model::properties`]).

use crate::memo::{self, Cause, Effect, Machine};
use crate::model_state::{Book, Client, FaultsUsed, State, ROUTER};
use crate::spec::{ClientSpec, ModelSpec, SpecError};
use kvsim_engine::config::Protocol;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::gpu::SymbolicGpu;
use kvsim_engine::ids::{NodeId, RequestId};
use kvsim_engine::msg::Status;
use kvsim_engine::node::Node;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::prefill_vllm::VllmPrefill;
use kvsim_engine::router::Router;
use kvsim_engine::trace::Side;
use kvsim_engine::world::{Arriving, Timers, Topology};
use kvsim_engine::Cfg;
use kvsim_oracle::oracle_state::must_reject;
use kvsim_oracle::schema::{ClockKind, RunHeader};
use kvsim_oracle::shared::Shared;
use kvsim_oracle::OracleState;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// A model of the prefill-to-decode handoff around the engine's real nodes.
#[derive(Debug)]
pub struct HandoffModel {
    pub(super) spec: ModelSpec,
    cfg: Cfg,
    /// The facts of the run the oracle needs (the same header a simulator trace has).
    pub(super) header: RunHeader,
    /// The nodes and their ids ([`HandoffModel::topology_of`]).
    topology: Topology,
    /// Per client slot, its group: the first slot with an identical spec.
    groups: Vec<u8>,
    /// Properties that already have a discovery (one bit each, see [`latch_first`](crate::model::properties::latch_first)).
    pub(super) latched: AtomicU64,
    /// This model's key in the node-transition caches ([`crate::memo`]).
    id: u64,
    /// Recompute every cached transition and compare (tests).
    memo_check: bool,
    /// Bypass the caches altogether (to measure what they save).
    memo_off: bool,
}

/// Model keys for the transition caches: one per `HandoffModel::new`.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

impl Clone for HandoffModel {
    /// A clone starts with no discovery latched: it is a fresh model for a new run.
    fn clone(&self) -> Self {
        HandoffModel {
            spec: self.spec.clone(),
            cfg: self.cfg.clone(),
            header: self.header.clone(),
            topology: self.topology.clone(),
            groups: self.groups.clone(),
            latched: AtomicU64::new(0),
            id: self.id,
            memo_check: self.memo_check,
            memo_off: self.memo_off,
        }
    }
}

impl HandoffModel {
    pub fn new(spec: ModelSpec) -> Result<Self, SpecError> {
        spec.validate()?;
        let groups = spec
            .clients
            .iter()
            .map(|c| {
                let first = spec.clients.iter().position(|d| d == c);
                first.expect("a client is equal to itself") as u8
            })
            .collect();
        let topology = Self::topology_of(&spec);
        let header = RunHeader::new(
            "kvsim-models",
            ClockKind::Simulated,
            &spec.engine,
            &topology,
        );
        Ok(HandoffModel {
            cfg: Cfg::new(spec.engine.clone()),
            header,
            topology,
            spec,
            groups,
            latched: AtomicU64::new(0),
            id: NEXT_MODEL_ID.fetch_add(1, AtomicOrdering::Relaxed),
            memo_check: false,
            memo_off: false,
        })
    }

    /// The spec's prefill and decode nodes as the simulator numbers them: router
    /// `n0`, the prefill nodes, the decode nodes, the client endpoint last (with one
    /// of each: prefill `n1`, decode `n2`, client `n3`).
    pub fn topology_of(spec: &ModelSpec) -> Topology {
        Topology {
            prefill_pools: vec![spec.prefill_pages; usize::from(spec.nodes.prefill)],
            decode_pools: vec![spec.decode_pages; usize::from(spec.nodes.decode)],
        }
    }

    /// The deployment's topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Recompute every node transition the cache answers and panic if the engine now
    /// says something else (proves the cache changes nothing; slow).
    pub fn with_memo_check(mut self) -> Self {
        self.memo_check = true;
        self
    }

    /// Compute every node transition afresh: no cache (for comparison).
    pub fn without_memo(mut self) -> Self {
        self.memo_off = true;
        self
    }

    /// Node transitions this model's checks computed and reused so far (complete for
    /// threads that have exited: call it after the checker is joined).
    pub fn memo_stats(&self) -> memo::MemoStats {
        memo::stats(self.id)
    }

    /// The effect of `input` on one node, computed by the engine or reused.
    pub(super) fn transition<N: Machine>(
        &self,
        id: NodeId,
        before: &Shared<N>,
        cause: Cause,
    ) -> Arc<Effect<N>> {
        if self.memo_off {
            memo::tally(self.id, false);
            Arc::new(memo::compute(id, before, &cause))
        } else {
            memo::transition(self.id, id, before, cause, self.memo_check)
        }
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn cfg(&self) -> &Cfg {
        &self.cfg
    }

    pub fn header(&self) -> &RunHeader {
        &self.header
    }

    /// The spec of a client.
    pub fn client_spec(&self, c: &Client) -> &ClientSpec {
        &self.spec.clients[c.group as usize]
    }

    /// The prompt a client sends once it has been given `req` (the canary prompt).
    pub fn prompt(&self, c: &Client, req: RequestId) -> Vec<kvsim_engine::Token> {
        kvsim_oracle::canary::prompt(req, self.client_spec(c).prompt_len)
    }

    /// Must either half reject this request (the oracle's rule), on some pair of
    /// nodes the router may choose?
    pub fn over_length(&self, spec: &ClientSpec) -> bool {
        let decodes = self.topology.decode_ids();
        self.topology.prefill_ids().into_iter().any(|prefill| {
            decodes.iter().any(|&decode| {
                [Side::Prefill, Side::Decode].into_iter().any(|side| {
                    must_reject(
                        &self.header,
                        side,
                        prefill,
                        decode,
                        spec.prompt_len,
                        spec.max_new_tokens,
                    )
                })
            })
        })
    }

    /// Must this request be refused whatever the environment does? Malformed (the
    /// router's 400: no prompt, no or too many new tokens) or over-length.
    pub fn must_refuse(&self, spec: &ClientSpec) -> bool {
        spec.prompt_len == 0
            || spec.max_new_tokens == 0
            || spec.max_new_tokens > self.cfg.max_new_tokens_limit
            || self.over_length(spec)
    }

    /// Is a client's error answer explained by the environment or the request? Judged
    /// when the router answers (see [`names::CAUSED`](crate::model::names::CAUSED)), on the state after its
    /// transition: the client cancelled; the request must be refused; a fault has
    /// been used; or the answer is the router's 503 for a full room table (every
    /// room is live with another request: load shedding at the stated capacity,
    /// `max_rooms`).
    pub fn error_explained(&self, s: &State, slot: usize, status: Status) -> bool {
        let c = &s.clients()[slot];
        status.is_ok()
            || c.cancelled
            || self.must_refuse(self.client_spec(c))
            || s.faults().any()
            || (status == Status::UNAVAILABLE
                && s.router.get().live_rooms() >= self.cfg.max_rooms as usize)
    }

    /// The initial state: fresh nodes, idle clients, nothing in flight.
    pub fn initial(&self) -> State {
        let (prefills, decodes) = (self.topology.prefill_ids(), self.topology.decode_ids());
        let router = Router::new(ROUTER, self.cfg.clone(), prefills.clone(), decodes.clone());
        let ps = self.cfg.page_size;
        let (fronts, cancels_both) = (
            self.spec.nodes.fronts,
            self.cfg.defenses.router_cancels_both,
        );
        let prefill = |&id: &NodeId| {
            let gpu = SymbolicGpu::new(self.spec.prefill_pages, ps);
            let cfg = self.cfg.clone();
            // The prefill of the router's protocol family.
            Shared::new(match cfg.router.protocol() {
                Protocol::Sglang => {
                    let mut node = PrefillNode::new(id, cfg, ROUTER, gpu);
                    if fronts {
                        node.put_behind(ROUTER, cancels_both);
                    }
                    Node::Prefill(node)
                }
                Protocol::Vllm => Node::VllmPrefill(VllmPrefill::new(id, cfg, ROUTER, gpu)),
            })
        };
        let decode = |&id: &NodeId| {
            let gpu = SymbolicGpu::new(self.spec.decode_pages, ps);
            let mut node = DecodeNode::new(id, self.cfg.clone(), ROUTER, prefills.clone(), gpu);
            if fronts {
                node.put_behind(ROUTER, cancels_both);
            }
            Shared::new(node)
        };
        State {
            router: Shared::new(router),
            prefills: prefills.iter().map(prefill).collect(),
            decodes: decodes.iter().map(decode).collect(),
            net: Vec::new(),
            timers: Timers::new(),
            stale: Vec::new(),
            book: Shared::new(Book {
                clients: self
                    .groups
                    .iter()
                    .map(|&group| Client {
                        group,
                        req: None,
                        cancelled: false,
                        reply: None,
                    })
                    .collect(),
                notes: SmallVec::new(),
                faults: FaultsUsed::default(),
                violations: 0,
                detected: 0,
                uncaused: false,
                spent: SmallVec::new(),
            }),
            oracle: Shared::new(OracleState::new(&self.header)),
        }
    }

    /// What the world knows about a message arriving at `to` in `s` (every node is up
    /// and connected: crashes restart at once, the models have no partitions).
    pub(super) fn arriving(&self, s: &State, to: NodeId, fail: bool) -> Arriving {
        Arriving {
            sender_alive: true,
            receiver_alive: true,
            receiver_restarted: false,
            receiver_epoch: s.epoch(to),
            partitioned: false,
            injected_failure: fail,
            transport: self.spec.engine.transport,
        }
    }
}

/// The symmetry representative: clients of one group are interchangeable (identical
/// specs; ids are handed out in submission order, not per client), so sorting them is
/// a permutation the engine cannot observe. Pages and rooms are not permuted: renaming
/// them is not an automorphism of the engine (the pool releases a batch in page-id
/// order, as SGLang's `free` sorts it, so ids decide which page is handed out next;
/// see `renaming_pages_is_not_an_automorphism_of_the_allocator` in the engine's tests).
/// Nor are nodes: on a topology with several pairs the router takes a pair by its
/// attempt cursor (never by client), so sorting clients stays sound there, while
/// swapping pairs would need the cursor and every stored node id renamed
/// (docs/DECISIONS.md, "The real topology and the model checker's reductions").
pub fn representative(s: &State) -> State {
    let mut r = s.clone();
    r.book(|b| b.clients.sort());
    r
}
