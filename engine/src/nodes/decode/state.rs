//! The decode node's state: its request phases, the transfer facts and quarantine
//! records, and the [`DecodeNode`] struct with its constructors and accessors. The
//! transitions live in the sibling concern files, which take names from here; this
//! file takes none from them.

use super::handles::Handles;
use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::gpu::{DeviceError, Gpu};
use crate::ids::{NodeId, PageTag, RequestId, RoomKey};
use crate::kv::{PagePool, PageRecords};
use crate::nodes::retired::RetiredRooms;
use crate::nodes::role::Role;
use crate::nodes::worker::WorkerFront;
use crate::shared_cfg::Cfg;
use crate::trace::TransferClaim;
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
/// Each phase holds the pages it owns: none before the reservation; from then on every
/// page reserved, the prompt's first (the transfer destination), then the pages the
/// reply will be written into.
pub(super) enum Phase {
    /// Receiver created; waiting for pages.
    #[default]
    Prealloc,
    /// Pages reserved and announced; KV writes may land. The first `dst_pages` of
    /// `pages` are the transfer destination. Which of them a write landed in is not
    /// noted here (a one-sided write runs nothing at the receiver): it is what each
    /// page's tag says.
    Transferring {
        pages: Vec<PageTag>,
        dst_pages: usize,
    },
    /// Generating.
    Running {
        pages: Vec<PageTag>,
        seq_len: u64,
        step: u32,
    },
}

impl Phase {
    /// The pages, taking them out of the phase.
    pub(super) fn into_pages(self) -> Vec<PageTag> {
        match self {
            Phase::Prealloc => Vec::new(),
            Phase::Transferring { pages, .. } | Phase::Running { pages, .. } => pages,
        }
    }

    /// Every page the room use holds in this phase.
    pub(super) fn pages(&self) -> &[PageTag] {
        match self {
            Phase::Prealloc => &[],
            Phase::Transferring { pages, .. } | Phase::Running { pages, .. } => pages,
        }
    }
}

/// Where a decode room is, as [`DecodeNode::room_phase`] reports it to tests and
/// drivers (read-only introspection; the node never reads it back).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum DecodePhase {
    /// Receiver created; waiting for pages.
    Prealloc,
    /// Pages reserved and announced; `written[i]` says whether destination page `i`
    /// carries this room use's tag (a write of it landed there).
    Transferring { written: Vec<bool> },
    /// Generating: the next step and the sequence length so far.
    Running { step: u32, seq_len: u64 },
    /// Aborted or failed while a write could still land: the pages wait for the drain
    /// ack; `retries` drain requests were repeated so far.
    Quarantined { retries: u32 },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Request {
    /// The request the router's start named: a start naming another one for this room
    /// use is refused (the peer check).
    pub(super) req: RequestId,
    pub(super) prefill: NodeId,
    /// vLLM's pull (`nodes/decode/pull.rs`): prefill's pages, which decode reads
    /// itself; `None` under SGLang's push.
    pub(super) remote: Option<Vec<PageTag>>,
    pub(super) prompt_len: u64,
    pub(super) max_new_tokens: u32,
    pub(super) phase: Phase,
}

/// Decode's judgement of prefill's conclusion ([`DecodeNode::judge_transfer`]).
pub(super) enum Verdict {
    /// Run the request; prefill's counts as it reported them.
    Accept { tokens: u64, pages: u32 },
    /// Fail the room, for this reason.
    Reject(String),
    /// The device failed while checking.
    Device(DeviceError),
}

/// What both the accepted and the refused transfer state about the room.
#[derive(Clone, Copy)]
pub(super) struct TransferFacts {
    pub(super) from: NodeId,
    pub(super) prompt_len: u64,
    pub(super) reserved_pages: u32,
    pub(super) fully_written: bool,
}

impl TransferFacts {
    /// The claim stated in the trace: these facts with prefill's reported counts.
    pub(super) fn claim(self, (sent_tokens, sent_pages): (u64, u32)) -> TransferClaim {
        let claim = TransferClaim {
            from: self.from,
            prompt_len: self.prompt_len,
            reserved_pages: self.reserved_pages,
            sent_tokens,
            sent_pages,
            fully_written: self.fully_written,
        };
        // Restates the fields copied just above: debug only.
        debug_assert_eq!(claim.from, self.from);
        debug_assert_eq!(claim.reserved_pages, self.reserved_pages);
        claim
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Quarantine {
    pub(super) pages: Vec<PageTag>,
    pub(super) prefill: NodeId,
    pub(super) retries: u32,
    /// A pull's quarantine: released by the completion of decode's own READ (which
    /// always comes, success or failure), not by a drain ack.
    pub(super) read: bool,
}

/// The decode node state machine, generic over its KV memory and over the form of its
/// one page ownership record (a [`PagePool`] for every driver but the hardware
/// runtime, whose transfer thread shares a [`crate::kv::SharedRecord`] with it).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct DecodeNode<G, P = PagePool> {
    pub(super) id: NodeId,
    pub(super) cfg: Cfg,
    pub(super) router: NodeId,
    /// The prefill nodes of the deployment (the topology): a start naming any other
    /// node as the room's writer is refused, since no drain ack could ever come from
    /// it and a quarantine waiting on it would never end.
    pub(super) prefills: Vec<NodeId>,
    pub(super) pool: P,
    pub(super) gpu: G,
    pub(super) requests: BTreeMap<RoomKey, Request>,
    pub(super) prealloc: VecDeque<RoomKey>,
    pub(super) quarantine: BTreeMap<RoomKey, Quarantine>,
    /// A pull's READ handles not yet counted, per room use (`handles.rs`).
    pub(super) handles: BTreeMap<RoomKey, Handles>,
    pub(super) retired: RetiredRooms,
    /// Pages of recently finished requests, kept for the `double-free-on-finish` bug's
    /// second release path (bounded by `max_queue`; empty unless the bug is on).
    pub(super) finished_pages: VecDeque<(RoomKey, Vec<PageTag>)>,
    pub(super) compute_armed: bool,
    /// The running rooms of the scheduler pass under way still to step, in order (one
    /// step's device work at a time, [`crate::compute::Job`]). Empty between the steps
    /// of every driver: a pass starts and ends in one step.
    pub(super) batch: VecDeque<RoomKey>,
    /// Set when the node stopped itself (a drain ack never came).
    pub(super) fatal: Option<String>,
    pub(super) counters: Counters,
    /// Worker mode under an engine router: the node's worker front, which the
    /// router reaches it through (`nodes/worker/behind.rs`); in its process, so a
    /// restart gives it a fresh one.
    pub(crate) front: Option<WorkerFront>,
}

impl<G: Gpu> DecodeNode<G> {
    /// A decode node; `prefills` are the deployment's prefill nodes.
    pub fn new(id: NodeId, cfg: Cfg, router: NodeId, prefills: Vec<NodeId>, gpu: G) -> Self {
        let pool = PagePool::new(gpu.pages(), gpu.page_size()).journal();
        Self::with_records(id, cfg, router, prefills, gpu, pool)
    }

    pub fn pool(&self) -> &PagePool {
        &self.pool
    }
}

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// A decode node deciding with `pool`, a fresh and full record of `gpu`'s pages;
    /// `prefills` are the deployment's prefill nodes.
    pub fn with_records(
        id: NodeId,
        cfg: Cfg,
        router: NodeId,
        prefills: Vec<NodeId>,
        gpu: G,
        pool: P,
    ) -> Self {
        let retired = RetiredRooms::new(cfg.max_rooms);
        DecodeNode {
            id,
            cfg,
            router,
            prefills,
            pool,
            gpu,
            requests: BTreeMap::new(),
            prealloc: VecDeque::new(),
            quarantine: BTreeMap::new(),
            handles: BTreeMap::new(),
            retired,
            finished_pages: VecDeque::new(),
            compute_armed: false,
            batch: VecDeque::new(),
            fatal: None,
            counters: Counters::default(),
            front: None,
        }
    }

    /// Worker mode under an engine router: the node sits behind its worker front,
    /// whose router is `router`, and is reached only through it
    /// (`nodes/worker/behind.rs`); the front ends a decode half on its prefill's
    /// failure where `cancels_both`.
    pub fn put_behind(&mut self, router: NodeId, cancels_both: bool) {
        let front = WorkerFront::new(self.id, Role::Decode, router, cancels_both);
        let wait_ns = super::super::worker::pairing_wait_ns(&self.cfg.timeouts);
        self.front = Some(front.pairing(self.pool.epoch(), wait_ns));
    }

    /// The room uses this node retired (bounded: [`RetiredRooms::bound`]).
    pub fn retired(&self) -> &RetiredRooms {
        &self.retired
    }
    pub fn id(&self) -> NodeId {
        self.id
    }
    /// The configuration the node runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    /// The node's ownership record.
    pub fn records(&self) -> &P {
        &self.pool
    }
    pub fn gpu(&self) -> &G {
        &self.gpu
    }
    pub fn requests(&self) -> usize {
        self.requests.len()
    }
    pub fn quarantined_rooms(&self) -> usize {
        self.quarantine.len()
    }
    /// Pages held in quarantine, over every quarantined room use.
    pub fn quarantined_pages(&self) -> usize {
        self.quarantine.values().map(|q| q.pages.len()).sum()
    }
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}
