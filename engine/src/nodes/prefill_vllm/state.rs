//! The vLLM prefill node's state: its requests and their phases, the struct, its
//! constructor, reincarnation and read-only queries.

use crate::counters::Counters;
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token};
use crate::invariant::{Invariant, Violation};
use crate::kv::PagePool;
use crate::nodes::retired::RetiredRooms;
use crate::shared_cfg::Cfg;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where a request is; each phase after `Waiting` holds the pages it owns.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) enum Phase {
    /// Admitted; waiting in the queue for pages.
    Waiting,
    /// Pages allocated; the forward runs at the next scheduler tick.
    Forward { pages: Vec<PageTag> },
    /// Answered 200; the pages wait for decode's READ handles under a lease:
    /// `notified` holds the ranks whose notification came (`lease.rs`, `on_notify`).
    Leased {
        pages: Vec<PageTag>,
        notified: BTreeSet<u32>,
    },
}

/// A room's phase as [`VllmPrefill::room_phase`] reports it (read-only).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum VllmPhase {
    Waiting,
    Forward,
    Leased { pages: Vec<PageTag> },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) req: RequestId,
    /// The decode node the router named: the one peer whose notification and
    /// heartbeats are believed.
    pub(super) decode: NodeId,
    pub(super) prompt: Vec<Token>,
    pub(super) phase: Phase,
}

/// vLLM's prefill node (module doc).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct VllmPrefill<G> {
    pub(super) id: NodeId,
    pub(super) cfg: Cfg,
    pub(super) router: NodeId,
    pub(super) pool: PagePool,
    pub(super) gpu: G,
    pub(super) requests: BTreeMap<RoomKey, Request>,
    pub(super) waiting: VecDeque<RoomKey>,
    pub(super) retired: RetiredRooms,
    pub(super) compute_armed: bool,
    pub(super) counters: Counters,
}

impl<G: Gpu> VllmPrefill<G> {
    pub fn new(id: NodeId, cfg: Cfg, router: NodeId, gpu: G) -> Self {
        let pool = PagePool::new(gpu.pages(), gpu.page_size()).journal();
        let retired = RetiredRooms::new(cfg.max_rooms);
        VllmPrefill {
            id,
            cfg,
            router,
            pool,
            gpu,
            requests: BTreeMap::new(),
            waiting: VecDeque::new(),
            retired,
            compute_armed: false,
            counters: Counters::default(),
        }
    }

    /// Become the next incarnation, `epoch`: requests, queue and tombstones are gone,
    /// the pool starts over full in the new epoch; memory is kept as it was.
    pub(crate) fn reincarnate(&mut self, epoch: u32) {
        assert!(
            epoch > self.pool.epoch(),
            "a restart needs a new, higher epoch"
        );
        let VllmPrefill {
            id: _,
            cfg: _,
            router: _,
            pool,
            gpu,
            requests,
            waiting,
            retired,
            compute_armed,
            counters: _,
        } = self;
        *pool = PagePool::with_epoch(gpu.pages(), gpu.page_size(), epoch).journal();
        requests.clear();
        waiting.clear();
        retired.clear();
        *compute_armed = false;
    }

    /// S1/S8 on the pool, and every owned page owned by a live request.
    pub fn invariants(&self) -> Result<(), Violation> {
        self.pool.invariants()?;
        for (page, rec) in self.pool.records() {
            if let Some(owner) = rec.owner.filter(|o| !self.requests.contains_key(o)) {
                let id = self.id;
                let what = format!("vllm prefill {id}: {page} is owned by {owner}, not live");
                return Err(Violation::new(Invariant::S1, what));
            }
        }
        Ok(())
    }

    pub fn id(&self) -> NodeId {
        self.id
    }
    pub fn gpu(&self) -> &G {
        &self.gpu
    }
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn requests(&self) -> usize {
        self.requests.len()
    }

    /// The phase of a live room use, `None` when this node has none for it.
    pub fn room_phase(&self, room: RoomKey) -> Option<VllmPhase> {
        Some(match &self.requests.get(&room)?.phase {
            Phase::Waiting => VllmPhase::Waiting,
            Phase::Forward { .. } => VllmPhase::Forward,
            Phase::Leased { pages, .. } => VllmPhase::Leased {
                pages: pages.clone(),
            },
        })
    }
}
