//! The prefill node's state: its request phases, the per-room records and the
//! [`PrefillNode`] struct with its constructor, reincarnation and accessors. The
//! transitions live in the sibling concern files, which take names from here; this
//! file takes none from them.

use crate::bugs::Bug;
use crate::counters::Counters;
use crate::env::Outbox;
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token};
use crate::kv::PagePool;
use crate::msg::{Msg, Status, TransferOutcome};
use crate::nodes::retired::{holds, GenTable, RetiredRooms, RETIRED_MIN_HALF};
use crate::nodes::role::Role;
use crate::nodes::worker::WorkerFront;
use crate::shared_cfg::Cfg;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where a prefill request is.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
/// Every phase after `Bootstrapping` holds decode's page list (`meta`): it arrives
/// exactly when the room leaves `Bootstrapping`, so no phase has it optionally.
pub(super) enum Phase {
    /// Sender created; waiting for decode's page list.
    Bootstrapping,
    /// Page list known; waiting in the queue for source pages.
    Waiting { meta: Meta },
    /// In the running batch; the forward completes at the next scheduler tick.
    Forward { meta: Meta, pages: Vec<PageTag> },
    /// KV is being sent.
    Sending {
        meta: Meta,
        pages: Vec<PageTag>,
        next_page: usize,
        in_flight: u32,
    },
    /// The transfer concluded; the scheduler polls it at the next tick.
    Inflight {
        meta: Meta,
        pages: Vec<PageTag>,
        outcome: TransferOutcome,
    },
}

impl Phase {
    /// Decode's page list, known from `Waiting` on.
    pub(super) fn meta(&self) -> Option<&Meta> {
        match self {
            Phase::Bootstrapping => None,
            Phase::Waiting { meta }
            | Phase::Forward { meta, .. }
            | Phase::Sending { meta, .. }
            | Phase::Inflight { meta, .. } => Some(meta),
        }
    }

    /// The incarnation of decode whose page list this is (0 before it is known).
    pub(super) fn decode_epoch(&self) -> u32 {
        self.meta().map_or(0, Meta::epoch)
    }

    /// A sending room's progress (`None` in any other phase).
    pub(super) fn sending(&self) -> Option<Sending<'_>> {
        let Phase::Sending {
            meta,
            pages,
            next_page,
            in_flight,
        } = self
        else {
            return None;
        };
        // Mooncake truncates the source to the destination when decode reserved fewer
        // pages; nothing checks that the counts agree (decode's job).
        let to_send = pages.len().min(meta.dst.len());
        assert!(to_send <= pages.len() && to_send <= meta.dst.len());
        assert!(*next_page <= to_send, "no page is sent past the end");
        Some(Sending {
            dst: &meta.dst,
            pages,
            next_page: *next_page,
            in_flight: *in_flight,
            to_send,
        })
    }
}

/// A view of [`Phase::Sending`]: decode's page list, the source pages, the next page
/// to send, the chunk writes in flight and how many pages are sent in all.
pub(super) struct Sending<'a> {
    pub(super) dst: &'a [PageTag],
    pub(super) pages: &'a [PageTag],
    pub(super) next_page: usize,
    pub(super) in_flight: u32,
    pub(super) to_send: usize,
}

/// Where a prefill room is, as [`PrefillNode::room_phase`] reports it to tests and
/// drivers (read-only introspection; the node never reads it back).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum PrefillPhase {
    /// Sender created; waiting for decode's page list.
    Bootstrapping,
    /// Page list known; waiting in the queue for source pages.
    Waiting,
    /// In the running batch with these source pages.
    Forward { pages: Vec<PageTag> },
    /// KV is being sent: the next page to send and the chunk writes in flight.
    Sending { next_page: usize, in_flight: u32 },
    /// The transfer concluded (`success` is its outcome); polled at the next tick.
    Inflight { success: bool },
}

/// One chunk write to issue ([`PrefillNode::next_chunk`]): its source pages and their
/// destinations, the phase's `next_page` after it, the partial last page it carries
/// (its index in the chunk, the slots it holds) and the decode node it goes to.
pub(super) struct Chunk {
    pub(super) src: Vec<PageTag>,
    pub(super) dst: Vec<PageTag>,
    pub(super) end: usize,
    pub(super) tail: Option<(usize, usize)>,
    pub(super) to: NodeId,
}

/// Does decode still need a `KvDone { Failed }` for a send that fails? Not when decode
/// asked for the stop itself (its drain request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KvDoneOwed {
    Yes,
    No,
}

/// Decode's page list for a room (M5).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Meta {
    pub(super) dst: Vec<PageTag>,
}

impl Meta {
    /// The incarnation of decode that handed out the page list (its tags' epoch).
    pub(super) fn epoch(&self) -> u32 {
        epoch_of(&self.dst)
    }
}

/// The incarnation of decode that handed out the page list `dst` (its tags' epoch).
pub(super) fn epoch_of(dst: &[PageTag]) -> u32 {
    dst.first().map_or(0, |t| t.gen.epoch())
}

/// Tell `decode` that `room`'s transfer to the page list of its incarnation `epoch`
/// failed (M7 `KvDone { Failed }`).
pub(super) fn tell_failed<K>(env: &mut Outbox<K>, room: RoomKey, decode: NodeId, epoch: u32) {
    env.send(
        decode,
        Msg::KvDone {
            room,
            outcome: TransferOutcome::Failed,
            epoch,
        },
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) req: RequestId,
    pub(super) decode: NodeId,
    /// The prompt this node runs (the 1-token placeholder after a legacy rejection).
    pub(super) prompt: Vec<Token>,
    /// A pending abort that takes effect at the next result (SGLang `to_finish`).
    pub(super) to_finish: Option<Status>,
    /// The terminal reason once set (SGLang `finished_reason`).
    pub(super) finished_reason: Option<Status>,
    pub(super) phase: Phase,
}

impl Request {
    /// Move to the phase `next` makes of the current one; `next` returns a phase it
    /// does not move from unchanged.
    pub(super) fn advance(&mut self, next: impl FnOnce(Phase) -> Phase) {
        let now = std::mem::replace(&mut self.phase, Phase::Bootstrapping);
        self.phase = next(now);
    }
}

/// Writes of one room use still in flight, kept after the request retires.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct Outstanding {
    /// The decode node the writes go to (the only node whose completions and drain
    /// requests for this room use are believed).
    pub(super) to: NodeId,
    /// Chunk number -> the source pages its send holds.
    pub(super) chunks: BTreeMap<u32, Vec<PageTag>>,
    pub(super) next_chunk: u32,
    /// A write of this room failed (the `failed-send-reports-drained` bug reads it).
    pub(super) any_failed: bool,
    /// Decode asked for a drain ack; send it once `chunks` is empty.
    pub(super) drain_requested_by: Option<NodeId>,
}

/// The prefill node state machine, generic over its KV memory.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PrefillNode<G> {
    pub(super) id: NodeId,
    pub(super) cfg: Cfg,
    pub(super) router: NodeId,
    pub(super) pool: PagePool,
    pub(super) gpu: G,
    pub(super) requests: BTreeMap<RoomKey, Request>,
    /// Rooms waiting for source pages, in arrival order.
    pub(super) waiting: VecDeque<RoomKey>,
    pub(super) outstanding: BTreeMap<RoomKey, Outstanding>,
    /// Per room number, the newest generation this node has retired: any message for
    /// that generation or an older one is stale (a late or reordered delivery).
    pub(super) retired: RetiredRooms,
    /// Page lists that arrived before their `PrefillStart` (reordering), bounded, one
    /// per room and sender: the start names the room's decode node, and only its list
    /// is used, so a list from another node can neither stand in for it nor evict it.
    pub(super) early_meta: BTreeMap<(RoomKey, NodeId), Vec<PageTag>>,
    /// Drain requests that arrived before their `PrefillStart`, bounded, one per room
    /// and sender. Each was acked at once (this node has no write for the room), but
    /// the room is retired only when the start names the sender as its decode node: a
    /// request from any other node is refused then, so a forged one cannot retire the
    /// room and leave the real request hanging.
    pub(super) early_drain: BTreeSet<(RoomKey, NodeId)>,
    /// Room uses this node failed before their decode's page list arrived, with the
    /// decode node each one's start named. That node reserved pages and waits for the
    /// transfer (behind SGLang's router nobody else tells it), so its page list, when
    /// it comes, is answered once with `KvDone { Failed }` ([`Self::on_failed_meta`]).
    /// Bounded as the retired table is.
    pub(super) owed_failure: GenTable<NodeId>,
    /// A `Compute` timer is pending (so new work does not postpone it).
    pub(super) compute_armed: bool,
    /// The forward batch of the scheduler pass under way still to finish, in order
    /// (one room's device work at a time, [`crate::compute::Job`]). Empty between the
    /// steps of every driver: a pass starts and ends in one step.
    pub(super) batch: VecDeque<RoomKey>,
    pub(super) counters: Counters,
    /// Worker mode under an engine router: the node's worker front, which the
    /// router reaches it through (`nodes/worker/behind.rs`); in its process, so a
    /// restart gives it a fresh one.
    pub(crate) front: Option<WorkerFront>,
}

impl<G: Gpu> PrefillNode<G> {
    /// A prefill node. The pool size is the GPU's; run the pre-flight check first
    /// ([`crate::config::EngineConfig::preflight`]).
    pub fn new(id: NodeId, cfg: Cfg, router: NodeId, gpu: G) -> Self {
        let pool = PagePool::new(gpu.pages(), gpu.page_size()).journal();
        let retired = RetiredRooms::new(cfg.max_rooms);
        let owed_failure = GenTable::new((cfg.max_rooms as usize).max(RETIRED_MIN_HALF));
        PrefillNode {
            id,
            cfg,
            router,
            pool,
            gpu,
            requests: BTreeMap::new(),
            waiting: VecDeque::new(),
            outstanding: BTreeMap::new(),
            retired,
            early_meta: BTreeMap::new(),
            early_drain: BTreeSet::new(),
            owed_failure,
            compute_armed: false,
            batch: VecDeque::new(),
            counters: Counters::default(),
            front: None,
        }
    }

    /// Worker mode under an engine router: the node sits behind its worker front,
    /// whose router is `router`, and is reached only through it
    /// (`nodes/worker/behind.rs`); the front ends a decode half on its prefill's
    /// failure where `cancels_both`.
    pub fn put_behind(&mut self, router: NodeId, cancels_both: bool) {
        let front = WorkerFront::new(self.id, Role::Prefill, router, cancels_both);
        let wait_ns = super::super::worker::pairing_wait_ns(&self.cfg.timeouts);
        self.front = Some(front.pairing(self.pool.epoch(), wait_ns));
    }

    /// Become the next incarnation, `epoch` (a driver asks for it through
    /// [`world::restart`](crate::world::restart), after the crash walk): every volatile
    /// structure (requests, queues, writes in flight, tombstones, timers) is gone, and
    /// the pool starts over, full, handing out generations of the new epoch only. KV
    /// memory is kept as it was (never zeroed, as GPU memory handed to a new process is
    /// not trusted to be), so a restarted node that read a page it had not written would
    /// read stale KV. The driver must also forget the node's pending timers and
    /// undelivered messages: they belonged to the old incarnation. `epoch` must exceed
    /// every earlier one.
    pub(crate) fn reincarnate(&mut self, epoch: u32) {
        assert!(
            epoch > self.pool.epoch(),
            "a restart needs a new, higher epoch"
        );
        // Destructure so that a field added later cannot be forgotten here.
        let PrefillNode {
            id: _,
            cfg: _,
            router: _,
            pool,
            gpu,
            requests,
            waiting,
            outstanding,
            retired,
            early_meta,
            early_drain,
            owed_failure,
            compute_armed,
            batch,
            counters: _,
            front,
        } = self;
        *front = front.as_ref().map(|f| f.fresh(epoch));
        *pool = PagePool::with_epoch(gpu.pages(), gpu.page_size(), epoch).journal();
        requests.clear();
        waiting.clear();
        outstanding.clear();
        retired.clear();
        early_meta.clear();
        early_drain.clear();
        owed_failure.clear();
        *compute_armed = false;
        batch.clear();
    }

    pub(super) fn is_stale(&self, room: RoomKey) -> bool {
        self.retired.is_stale(room)
    }

    pub(super) fn tombstone(&mut self, room: RoomKey) {
        let out = &self.outstanding;
        self.retired.retire(room, &|n| holds(out, n));
        self.early_meta.retain(|(r, _), _| *r != room);
        self.early_drain.retain(|(r, _)| *r != room);
    }

    /// The room uses this node retired (bounded: [`RetiredRooms::bound`]).
    pub fn retired(&self) -> &RetiredRooms {
        &self.retired
    }
    pub fn id(&self) -> NodeId {
        self.id
    }
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }
    pub fn gpu(&self) -> &G {
        &self.gpu
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Live requests.
    pub fn requests(&self) -> usize {
        self.requests.len()
    }
    /// Writes in flight for a room use.
    pub fn writes_in_flight(&self, room: RoomKey) -> usize {
        self.outstanding.get(&room).map_or(0, |o| o.chunks.len())
    }
    /// Every room use with writes in flight.
    pub fn rooms_in_flight(&self) -> Vec<RoomKey> {
        self.outstanding
            .iter()
            .filter(|(_, o)| !o.chunks.is_empty())
            .map(|(k, _)| *k)
            .collect()
    }

    /// SGLang's `is_aborted(req)`: both fields, unless the legacy gates are back, which
    /// read `finished()` (i.e. `finished_reason`) only.
    pub(super) fn is_aborted(&self, r: &Request) -> bool {
        if self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
            r.finished_reason.is_some()
        } else {
            r.finished_reason.is_some() || r.to_finish.is_some()
        }
    }
}
