//! `PrefillNode`: runs prompts and pushes their KV to decode.
//!
//! The SGLang prefill scheduler and its KV manager in one state machine:
//! intake (length check, defense 1) -> bootstrap (wait for decode's page list, M5) ->
//! waiting queue (allocate source pages) -> forward (one scheduler tick) -> send KV in
//! bounded chunks (M6) with at most `max_inflight_chunks` writes in flight -> conclude
//! (M7) -> inflight poll on the next tick (release source pages, answer the router).
//! Decode's drain requests (M8) are acked only once every write for that exact room use
//! has completed (defense 3); source pages are held by their in-flight sends, so a
//! release while a send still reads them leaves them Draining, never Free.
//!
//! It is not a transport: writes are messages, and each write gets exactly one
//! completion (`WriteDone`, as an RDMA reliable connection gives one completion per
//! work request, success or error).
//!
//! Invariant: a request rejected at intake never gets a sender, pages or a transfer;
//! a room's drain ack is sent only when it has no write in flight.

use crate::bugs::Bug;
use crate::compute::{Done, ForwardJob, Job};
use crate::counters::Counters;
use crate::env::{Input, Outbox, Timer};
use crate::gpu::KvPayload;
use crate::gpu::{device_fault, ids, trace_write, zero_on_free, DeviceError, Gpu, WriteError};
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token, WriteId};
use crate::invariant::{Invariant, Violation};
use crate::kv::{PagePool, PageState};
use crate::msg::{only_router, Msg, Status, TransferOutcome, Why};
use crate::retired::{holds, GenTable, RetiredRooms, RETIRED_MIN_HALF};
use crate::shared_cfg::Cfg;
use crate::trace::{NodeFault, Side, TraceEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where a prefill request is.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
/// Every phase after `Bootstrapping` holds decode's page list (`meta`): it arrives
/// exactly when the room leaves `Bootstrapping`, so no phase has it optionally.
enum Phase {
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
    fn meta(&self) -> Option<&Meta> {
        match self {
            Phase::Bootstrapping => None,
            Phase::Waiting { meta }
            | Phase::Forward { meta, .. }
            | Phase::Sending { meta, .. }
            | Phase::Inflight { meta, .. } => Some(meta),
        }
    }

    /// The incarnation of decode whose page list this is (0 before it is known).
    fn decode_epoch(&self) -> u32 {
        self.meta().map_or(0, Meta::epoch)
    }

    /// A sending room's progress (`None` in any other phase).
    fn sending(&self) -> Option<Sending<'_>> {
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
        debug_assert!(*next_page <= to_send, "no page is sent past the end");
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
struct Sending<'a> {
    dst: &'a [PageTag],
    pages: &'a [PageTag],
    next_page: usize,
    in_flight: u32,
    to_send: usize,
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
struct Chunk {
    src: Vec<PageTag>,
    dst: Vec<PageTag>,
    end: usize,
    tail: Option<(usize, usize)>,
    to: NodeId,
}

/// Does decode still need a `KvDone { Failed }` for a send that fails? Not when decode
/// asked for the stop itself (its drain request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KvDoneOwed {
    Yes,
    No,
}

/// Decode's page list for a room (M5).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Meta {
    dst: Vec<PageTag>,
}

impl Meta {
    /// The incarnation of decode that handed out the page list (its tags' epoch).
    fn epoch(&self) -> u32 {
        epoch_of(&self.dst)
    }
}

/// The incarnation of decode that handed out the page list `dst` (its tags' epoch).
fn epoch_of(dst: &[PageTag]) -> u32 {
    dst.first().map_or(0, |t| t.gen.epoch())
}

/// Tell `decode` that `room`'s transfer to the page list of its incarnation `epoch`
/// failed (M7 `KvDone { Failed }`).
fn tell_failed<K>(env: &mut Outbox<K>, room: RoomKey, decode: NodeId, epoch: u32) {
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
struct Request {
    req: RequestId,
    decode: NodeId,
    /// The prompt this node runs (the 1-token placeholder after a legacy rejection).
    prompt: Vec<Token>,
    /// A pending abort that takes effect at the next result (SGLang `to_finish`).
    to_finish: Option<Status>,
    /// The terminal reason once set (SGLang `finished_reason`).
    finished_reason: Option<Status>,
    phase: Phase,
}

impl Request {
    /// Move to the phase `next` makes of the current one; `next` returns a phase it
    /// does not move from unchanged.
    fn advance(&mut self, next: impl FnOnce(Phase) -> Phase) {
        let now = std::mem::replace(&mut self.phase, Phase::Bootstrapping);
        self.phase = next(now);
    }
}

/// Writes of one room use still in flight, kept after the request retires.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
struct Outstanding {
    /// The decode node the writes go to (the only node whose completions and drain
    /// requests for this room use are believed).
    to: NodeId,
    /// Chunk number -> the source pages its send holds.
    chunks: BTreeMap<u32, Vec<PageTag>>,
    next_chunk: u32,
    /// A write of this room failed (the `failed-send-reports-drained` bug reads it).
    any_failed: bool,
    /// Decode asked for a drain ack; send it once `chunks` is empty.
    drain_requested_by: Option<NodeId>,
}

/// The prefill node state machine, generic over its KV memory.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PrefillNode<G> {
    id: NodeId,
    cfg: Cfg,
    router: NodeId,
    pool: PagePool,
    gpu: G,
    requests: BTreeMap<RoomKey, Request>,
    /// Rooms waiting for source pages, in arrival order.
    waiting: VecDeque<RoomKey>,
    outstanding: BTreeMap<RoomKey, Outstanding>,
    /// Per room number, the newest generation this node has retired: any message for
    /// that generation or an older one is stale (a late or reordered delivery).
    retired: RetiredRooms,
    /// Page lists that arrived before their `PrefillStart` (reordering), bounded, one
    /// per room and sender: the start names the room's decode node, and only its list
    /// is used, so a list from another node can neither stand in for it nor evict it.
    early_meta: BTreeMap<(RoomKey, NodeId), Vec<PageTag>>,
    /// Drain requests that arrived before their `PrefillStart`, bounded, one per room
    /// and sender. Each was acked at once (this node has no write for the room), but
    /// the room is retired only when the start names the sender as its decode node: a
    /// request from any other node is refused then, so a forged one cannot retire the
    /// room and leave the real request hanging.
    early_drain: BTreeSet<(RoomKey, NodeId)>,
    /// Room uses this node failed before their decode's page list arrived, with the
    /// decode node each one's start named. That node reserved pages and waits for the
    /// transfer (behind SGLang's router nobody else tells it), so its page list, when
    /// it comes, is answered once with `KvDone { Failed }` ([`Self::on_failed_meta`]).
    /// Bounded as the retired table is.
    owed_failure: GenTable<NodeId>,
    /// A `Compute` timer is pending (so new work does not postpone it).
    compute_armed: bool,
    /// The forward batch of the scheduler pass under way still to finish, in order
    /// (one room's device work at a time, [`crate::compute::Job`]). Empty between the
    /// steps of every driver: a pass starts and ends in one step.
    batch: VecDeque<RoomKey>,
    counters: Counters,
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
        }
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
        } = self;
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

    fn is_stale(&self, room: RoomKey) -> bool {
        self.retired.is_stale(room)
    }

    fn tombstone(&mut self, room: RoomKey) {
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
    fn is_aborted(&self, r: &Request) -> bool {
        if self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
            r.finished_reason.is_some()
        } else {
            r.finished_reason.is_some() || r.to_finish.is_some()
        }
    }

    pub fn handle(&mut self, input: Input<G::Kv>, env: &mut Outbox<G::Kv>) {
        match input {
            Input::Message { from, msg } => {
                let verdict = self.check_peer(from, &msg);
                if !self
                    .counters
                    .admit_peer(env, (self.id, from), &msg, verdict)
                {
                    return;
                }
                match msg {
                    Msg::PrefillStart {
                        room,
                        req,
                        prompt,
                        decode,
                    } => self.on_start(room, req, prompt, decode, env),
                    Msg::KvMeta { room, dst, .. } => self.on_meta(from, room, dst, env),
                    Msg::WriteDone { id, ok } => self.on_write_done(id, ok, env),
                    Msg::Abort { room } => self.on_abort(room, Status::CLIENT_CLOSED, env),
                    Msg::DrainRequest { room } => self.on_drain_request(from, room, env),
                    _ => {}
                }
            }
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env)
            }
            Input::Timer(Timer::Bootstrap(room)) => self.on_bootstrap_timeout(room, env),
            Input::Timer(_) => {}
            // Only a decode node's receiver lands writes.
            Input::Landed { .. } => {}
            Input::Computed(Done::Forward { job, written }) => {
                self.forwarded(job, written, env);
                self.next_forward(env);
            }
            // A decode step is a decode node's.
            Input::Computed(Done::DecodeStep { .. }) => {}
        }
    }

    /// Peer identity: a message about a room is believed only from that room's peer. The
    /// router starts and aborts rooms; the room's decode node sends its page list and
    /// drain requests; a write's completion comes from the node the write went to, for
    /// a write this incarnation issued. A room this node does not know has no recorded
    /// peer, and what it may do for such a room moves no page (it answers, or keeps a
    /// page list for a start message still on its way).
    fn check_peer(&self, from: NodeId, msg: &Msg<G::Kv>) -> Result<(), String> {
        let decode_of = |room: &RoomKey| {
            self.requests
                .get(room)
                .map(|r| r.decode)
                .or_else(|| self.outstanding.get(room).map(|o| o.to))
                .or_else(|| self.owes_failure_to(*room))
        };
        match msg {
            Msg::PrefillStart { .. } | Msg::Abort { .. } if from != self.router => {
                Err(only_router(self.router, from))
            }
            Msg::KvMeta { room, .. } | Msg::DrainRequest { room } => match decode_of(room) {
                Some(d) if d != from => Err(format!("{room}'s decode node is {d}")),
                _ => Ok(()),
            },
            Msg::WriteDone { id, .. } => {
                if id.writer != self.id || id.epoch != self.pool.epoch() {
                    return Err(format!("{id} is not a write of this incarnation"));
                }
                match self.outstanding.get(&id.room).map(|o| o.to) {
                    Some(to) if to != from => Err(format!("{id} went to {to}")),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Trace the page changes the pool journaled since the last call, in order.
    fn flush(&mut self, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        for c in self.pool.take_changes() {
            env.trace(c.into_event(id, None));
        }
    }

    /// Report a fault of this node (drivers act on it).
    fn fault(&mut self, fault: NodeFault, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        self.counters.fault(env, id, fault);
    }

    /// Ask for the scheduler loop's next pass (`Timer::Compute`), unless one is armed.
    fn arm_compute(&mut self, env: &mut Outbox<G::Kv>) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.prefill_forward_ns);
        }
    }

    /// The router's start (M1): intake checks (queue, length, the bootstrap-queue gate),
    /// then the room waits for decode's page list (which may have arrived first).
    fn on_start(
        &mut self,
        room: RoomKey,
        req_id: RequestId,
        prompt: Vec<Token>,
        decode: NodeId,
        env: &mut Outbox<G::Kv>,
    ) {
        if self.requests.contains_key(&room) || self.is_stale(room) {
            return; // duplicate or late delivery of a room use this node already answered
        }
        if self.drained_before_start(room, decode, env) {
            return;
        }
        if self.requests.len() >= self.cfg.max_queue as usize {
            let why = Why::QueueFull {
                side: Side::Prefill,
            };
            self.reject_start(room, decode, (Status::UNAVAILABLE, why), env);
            return;
        }
        let mut req = Request {
            req: req_id,
            decode,
            prompt,
            to_finish: None,
            finished_reason: None,
            phase: Phase::Bootstrapping,
        };
        if let Err(why) = self.check_length(room, &mut req, env) {
            self.reject_start(room, decode, (Status::BAD_REQUEST, why), env);
            return;
        }
        // The bootstrap-queue gate (`PrefillBootstrapQueue.add`).
        if self.is_aborted(&req) {
            let status = req
                .to_finish
                .or(req.finished_reason)
                .unwrap_or(Status::BAD_REQUEST);
            self.reject_start(room, decode, (status, Why::RejectedAtIntake), env);
            return;
        }
        env.trace(TraceEvent::Admitted {
            node: self.id,
            room,
            req: req_id,
            side: Side::Prefill,
            prompt_len: req.prompt.len() as u64,
        });
        self.requests.insert(room, req);
        env.set_timer(Timer::Bootstrap(room), self.cfg.timeouts.bootstrap_ns);
        self.take_early_meta(room, decode, env);
    }

    /// Decode's page list did not come in time: fail the room; its decode, if it
    /// reserved pages after all, is told when its list arrives.
    fn on_bootstrap_timeout(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        if req.phase != Phase::Bootstrapping {
            return;
        }
        let decode = req.decode;
        self.owe_failure(room, decode, env);
        self.retire(room, Status::INTERNAL, None, env);
    }

    /// Refuse a start at intake: retire the room use and answer once, with the reason;
    /// `decode`, which reserved pages for the room, is told the transfer failed.
    fn reject_start(
        &mut self,
        room: RoomKey,
        decode: NodeId,
        (status, why): (Status, Why),
        env: &mut Outbox<G::Kv>,
    ) {
        self.owe_failure(room, decode, env);
        self.tombstone(room);
        env.trace(TraceEvent::Rejected {
            node: self.id,
            room,
            side: Side::Prefill,
            status,
            reason: why.to_string(),
        });
        self.answer(room, status, Some(why), env);
    }

    /// `validate_input_length`: a prompt over the admission limit is truncated (with
    /// auto-truncation on), kept as a 1-token placeholder with the error pending (the
    /// legacy rejection, a bug switch), or refused with the reason.
    fn check_length(
        &self,
        room: RoomKey,
        req: &mut Request,
        env: &mut Outbox<G::Kv>,
    ) -> Result<(), Why> {
        let len = req.prompt.len() as u64;
        let Some(limit) = self.cfg.admission_limit(self.pool.capacity() as u32) else {
            return Ok(());
        };
        if len <= limit {
            return Ok(());
        }
        if self.cfg.allow_auto_truncate {
            // Truncation on: keep the head of the prompt.
            req.prompt.truncate(limit as usize);
            env.trace(TraceEvent::Truncated {
                node: self.id,
                room,
                from: len,
                to: limit,
            });
            return Ok(());
        }
        if !self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
            return Err(Why::PromptTooLong { tokens: len, limit });
        }
        // SGLang `set_finish_with_abort`: keep the error in `to_finish`, swap the
        // prompt for a 1-token placeholder, stay live.
        req.prompt = vec![0];
        req.to_finish = Some(Status::BAD_REQUEST);
        env.trace(TraceEvent::RejectedLegacy {
            node: self.id,
            room,
            prompt_len: len,
        });
        Ok(())
    }

    /// Page lists that arrived before this start: the room's decode node's is taken
    /// now, any other node's is refused by peer identity.
    fn take_early_meta(&mut self, room: RoomKey, decode: NodeId, env: &mut Outbox<G::Kv>) {
        let early: Vec<(NodeId, Vec<PageTag>)> = self
            .early_meta
            .range((room, NodeId(0))..=(room, NodeId(u16::MAX)))
            .map(|((_, from), dst)| (*from, dst.clone()))
            .collect();
        self.early_meta.retain(|(r, _), _| *r != room);
        for (from, dst) in early {
            if from == decode {
                self.on_meta(from, room, dst, env);
            } else {
                let (id, reason) = (self.id, format!("{room}'s decode node is {decode}"));
                self.counters
                    .refuse_peer(env, id, from, Some(room), "KvMeta", reason);
            }
        }
    }

    /// The drain requests that arrived before this start: those from a node that is not
    /// the room's decode are refused now; one from the room's decode retires the room
    /// (decode gave it up before the start arrived, and was told no write will come).
    fn drained_before_start(
        &mut self,
        room: RoomKey,
        decode: NodeId,
        env: &mut Outbox<G::Kv>,
    ) -> bool {
        let early: Vec<NodeId> = self
            .early_drain
            .range((room, NodeId(0))..=(room, NodeId(u16::MAX)))
            .map(|(_, from)| *from)
            .collect();
        self.early_drain.retain(|(r, _)| *r != room);
        for &from in early.iter().filter(|&&f| f != decode) {
            let (id, reason) = (self.id, format!("{room}'s decode node is {decode}"));
            self.counters
                .refuse_peer(env, id, from, Some(room), "DrainRequest", reason);
        }
        if early.contains(&decode) {
            self.tombstone(room);
            return true;
        }
        false
    }

    fn on_meta(&mut self, from: NodeId, room: RoomKey, dst: Vec<PageTag>, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get_mut(&room) else {
            if self.is_stale(room) {
                self.on_failed_meta(from, room, &dst, env);
            } else if self.early_meta.len() < self.cfg.max_queue as usize {
                // Decode's page list can overtake the router's start message.
                self.early_meta.insert((room, from), dst);
            }
            return;
        };
        if req.phase != Phase::Bootstrapping {
            return;
        }
        req.phase = Phase::Waiting { meta: Meta { dst } };
        self.waiting.push_back(room);
        env.cancel_timer(Timer::Bootstrap(room));
        self.arm_compute(env);
    }

    /// One pass of the scheduler loop: poll concluded transfers, finish the forward
    /// batch (one room's device work at a time, [`Self::next_forward`]), then admit
    /// waiting requests into the next batch.
    fn on_tick(&mut self, env: &mut Outbox<G::Kv>) {
        debug_assert!(self.batch.is_empty(), "a pass starts with none under way");
        let concluded: Vec<RoomKey> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Inflight { .. }))
            .map(|(k, _)| *k)
            .collect();
        for room in concluded {
            self.poll_inflight(room, env);
        }
        self.batch = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Forward { .. }))
            .map(|(k, _)| *k)
            .collect();
        self.next_forward(env);
    }

    /// Ask the device for the next room's forward of the pass; at the end of the
    /// forward batch, admit waiting requests and ask for the next pass while busy.
    fn next_forward(&mut self, env: &mut Outbox<G::Kv>) {
        while let Some(room) = self.batch.pop_front() {
            if let Some(job) = self.forward_job(room, env) {
                env.compute(Job::Forward(job));
                return;
            }
        }
        self.admit_waiting(env);
        let busy = self
            .requests
            .values()
            .any(|r| matches!(r.phase, Phase::Forward { .. } | Phase::Inflight { .. }));
        if busy {
            self.arm_compute(env);
        }
    }

    /// `pop_bootstrapped` plus the batch admission: allocate source pages FIFO.
    fn admit_waiting(&mut self, env: &mut Outbox<G::Kv>) {
        let mut batch = 0;
        while let Some(&room) = self.waiting.front() {
            if batch >= self.cfg.max_batch {
                break;
            }
            let Some(req) = self.requests.get(&room) else {
                self.waiting.pop_front();
                continue;
            };
            if !matches!(req.phase, Phase::Waiting { .. }) {
                self.waiting.pop_front();
                continue;
            }
            if self.is_aborted(req) {
                self.waiting.pop_front();
                let status = req
                    .to_finish
                    .or(req.finished_reason)
                    .unwrap_or(Status::INTERNAL);
                self.retire(room, status, None, env);
                continue;
            }
            let need = self.cfg.pages_for(req.prompt.len() as u64) as usize;
            if need > self.pool.capacity() && !self.cfg.bugs.has(Bug::AdmitBeyondPool) {
                // Can never fit: fail it now rather than let it block the queue forever,
                // and tell decode, which holds pages for it (nobody else will).
                self.waiting.pop_front();
                self.notify_decode_failed(room, env);
                self.retire(room, Status::INTERNAL, None, env);
                continue;
            }
            let Ok(pages) = self.pool.alloc(need, room) else {
                break;
            };
            self.flush(env);
            self.waiting.pop_front();
            env.trace(TraceEvent::Running {
                node: self.id,
                room,
                side: Side::Prefill,
            });
            if let Some(r) = self.requests.get_mut(&room) {
                r.advance(|now| match now {
                    Phase::Waiting { meta } => Phase::Forward { meta, pages },
                    other => other,
                });
                debug_assert!(matches!(r.phase, Phase::Forward { .. }));
            }
            batch += 1;
        }
        if batch > 0 {
            self.arm_compute(env);
        }
    }

    /// The device work of `room`'s forward (its prompt's KV into its source pages),
    /// unless the request was aborted: then it is retired here, not sent. `None` if
    /// there is nothing to compute.
    fn forward_job(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) -> Option<ForwardJob> {
        let req = self.requests.get(&room)?;
        let Phase::Forward { pages, .. } = &req.phase else {
            return None;
        };
        let pages = pages.clone();
        // #36988: an aborted request is retired here, not sent. The legacy path never
        // looked at `to_finish` at this point.
        if self.is_aborted(req) {
            let status = req
                .to_finish
                .or(req.finished_reason)
                .unwrap_or(Status::INTERNAL);
            self.release_source(room, &pages, env);
            self.notify_decode_failed(room, env);
            self.retire(room, status, None, env);
            return None;
        }
        Some(ForwardJob {
            room,
            pages,
            prompt: req.prompt.clone(),
        })
    }

    /// `process_batch_result_disagg_prefill` for the last chunk: what the device did
    /// with `room`'s forward ([`Self::forward_job`]).
    fn forwarded(
        &mut self,
        job: ForwardJob,
        written: Result<(), WriteError>,
        env: &mut Outbox<G::Kv>,
    ) {
        let ForwardJob {
            room,
            pages,
            prompt,
        } = job;
        let Some(Phase::Forward { pages: held, .. }) = self.requests.get(&room).map(|r| &r.phase)
        else {
            return;
        };
        assert_eq!(
            held, &pages,
            "a forward's result belongs to the forward that asked"
        );
        let (at, ps) = ((&pages[..], 0), self.cfg.page_size);
        if let Err(e) = trace_write(env, (self.id, room), at, &prompt, ps, written) {
            // Refused whole or a device failure (stated as a fault): the request fails
            // like an abort, its pages released.
            let why = match e {
                WriteError::Refused(_) => None,
                WriteError::Device(_) => Some(Why::DeviceFailed {
                    side: Side::Prefill,
                }),
            };
            self.release_source(room, &pages, env);
            self.notify_decode_failed(room, env);
            self.retire(room, Status::INTERNAL, why, env);
            return;
        }
        if let Err(e) = self.pool.mark_ready(room, &pages) {
            // Our own fresh allocation must be ours; anything else is an engine bug
            // that only a bug switch can cause. Fail the request loudly.
            self.fault(NodeFault::record_refused(room, "mark-ready", &e), env);
            self.retire(room, Status::INTERNAL, None, env);
            return;
        }
        self.flush(env);
        if let Some(r) = self.requests.get_mut(&room) {
            r.advance(|now| match now {
                Phase::Forward { meta, .. } => Phase::Sending {
                    meta,
                    pages,
                    next_page: 0,
                    in_flight: 0,
                },
                other => other,
            });
            debug_assert!(matches!(r.phase, Phase::Sending { .. }));
        }
        self.send_chunks(room, env);
    }

    /// Issue chunk writes up to the in-flight limit ([`Self::next_chunk`],
    /// [`Self::send_chunk`]); conclude the transfer when every one completed.
    fn send_chunks(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        while let Some(chunk) = self.next_chunk(room) {
            if let Err(e) = self.send_chunk(room, chunk, env) {
                self.send_failed_on_device(room, &e, env);
                return;
            }
        }
        self.conclude_send(room, env);
    }

    /// The next chunk write of a sending room, if the in-flight limit and the pages
    /// left allow one ([`Phase::sending`] says how many pages are sent in all).
    fn next_chunk(&self, room: RoomKey) -> Option<Chunk> {
        let req = self.requests.get(&room)?;
        let Sending {
            dst,
            pages,
            next_page,
            in_flight,
            to_send,
        } = req.phase.sending()?;
        if in_flight >= self.cfg.max_inflight_chunks || next_page >= to_send {
            return None;
        }
        let end = (next_page + self.cfg.chunk_pages as usize).min(to_send);
        // The prompt's last page, when partial, is sent as the slots it holds: a
        // one-sided write places the bytes it carries, so decode's generated KV in the
        // rest of that page is out of reach of this write and of any late copy of it
        // (docs/ARCHITECTURE.md, "Two transports").
        let ps = u64::from(self.cfg.page_size).max(1);
        let slots = (req.prompt.len() as u64 % ps) as usize;
        let tail = match pages.len().checked_sub(1) {
            Some(last) if slots != 0 && (next_page..end).contains(&last) => {
                Some((last - next_page, slots))
            }
            _ => None,
        };
        debug_assert!(next_page < end && end <= to_send);
        Some(Chunk {
            src: pages[next_page..end].to_vec(),
            dst: dst[next_page..end].to_vec(),
            end,
            tail,
            to: req.decode,
        })
    }

    /// Send one chunk write: read the source, hold it until the write completes (with
    /// deferred release), record the write as outstanding, state and send it.
    fn send_chunk(
        &mut self,
        room: RoomKey,
        chunk: Chunk,
        env: &mut Outbox<G::Kv>,
    ) -> Result<(), DeviceError> {
        let Chunk {
            src,
            dst,
            end,
            tail,
            to,
        } = chunk;
        assert_eq!(src.len(), dst.len(), "a chunk writes each source page once");
        // Read before holding: a device that fails here fails the send with no hold
        // taken for a write that never leaves.
        let mut kv = self.gpu.read_pages(&ids(&src))?;
        let hold = !self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain)
            && self.cfg.defenses.deferred_release;
        if hold {
            for &t in &src {
                // Our own Ready pages: a refusal means the record is corrupt.
                self.pool
                    .hold(t)
                    .expect("sending room owns its source pages (S1)");
            }
            for c in self.pool.take_changes() {
                env.trace(c.into_event(self.id, None));
            }
        }
        if let Some((i, slots)) = tail {
            if let Some(k) = kv.get_mut(i) {
                k.keep_slots(slots);
            }
        }
        let out = self.outstanding.entry(room).or_insert_with(|| Outstanding {
            to,
            ..Outstanding::default()
        });
        let id = WriteId {
            writer: self.id,
            epoch: self.pool.epoch(),
            room,
            chunk: out.next_chunk,
        };
        out.next_chunk += 1;
        out.chunks
            .insert(id.chunk, if hold { src.clone() } else { Vec::new() });
        env.trace(TraceEvent::KvSent {
            node: self.id,
            write: id,
            src: src.clone(),
            dst: dst.clone(),
            to: Some(to),
        });
        env.send(to, Msg::KvWrite { id, src, dst, kv });
        if let Some(Phase::Sending {
            next_page,
            in_flight,
            ..
        }) = self.requests.get_mut(&room).map(|r| &mut r.phase)
        {
            *next_page = end;
            *in_flight += 1;
        }
        debug_assert!(self
            .outstanding
            .get(&room)
            .is_some_and(|o| o.chunks.contains_key(&id.chunk)));
        Ok(())
    }

    /// Every chunk was sent and completed: report the transfer to decode (M7) with
    /// prefill's own counts and the digest of what it sent.
    fn conclude_send(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Some(Sending {
            pages,
            next_page,
            in_flight,
            to_send,
            ..
        }) = req.phase.sending()
        else {
            return;
        };
        if in_flight != 0 || next_page < to_send {
            return;
        }
        let tokens = req.prompt.len() as u64;
        let checksum = match self.gpu.digest(&ids(&pages[..to_send]), tokens) {
            Ok(c) => c,
            Err(e) => {
                self.send_failed_on_device(room, &e, env);
                return;
            }
        };
        // `is_last_chunk = curr_idx == num_kv_indices`: prefill reports its own page
        // count and token count, whatever decode reserved.
        let outcome = TransferOutcome::Success {
            tokens,
            pages: pages.len() as u32,
            checksum,
        };
        let (decode, epoch) = (req.decode, req.phase.decode_epoch());
        if let Some(r) = self.requests.get_mut(&room) {
            let reported = outcome.clone();
            r.advance(|now| match now {
                Phase::Sending { meta, pages, .. } => Phase::Inflight {
                    meta,
                    pages,
                    outcome: reported,
                },
                other => other,
            });
            debug_assert!(matches!(r.phase, Phase::Inflight { .. }));
        }
        env.send(
            decode,
            Msg::KvDone {
                room,
                outcome,
                epoch,
            },
        );
        self.arm_compute(env);
    }

    fn on_write_done(&mut self, id: WriteId, ok: bool, env: &mut Outbox<G::Kv>) {
        let room = id.room;
        let Some(out) = self.outstanding.get_mut(&room) else {
            return;
        };
        let Some(held) = out.chunks.remove(&id.chunk) else {
            return;
        };
        if !ok {
            out.any_failed = true;
        }
        debug_assert!(
            !out.chunks.contains_key(&id.chunk),
            "one completion per write"
        );
        debug_assert!(
            id.chunk < out.next_chunk,
            "a completion of a write this room sent"
        );
        env.trace(TraceEvent::WriteCompleted {
            node: self.id,
            write: id,
            ok,
        });
        let free_before = self.pool.free_count();
        for t in held {
            // Under `prefill-release-before-drain` the page may already be gone; the
            // hold then has nothing to release, which is reported, not dropped.
            if let Err(e) = self.pool.unhold(t) {
                self.fault(
                    NodeFault::HoldLost {
                        tag: t,
                        error: e.to_string(),
                    },
                    env,
                );
            }
        }
        self.flush(env);
        // The last hold on a released page frees it: like a release, that may unblock
        // the head of the waiting queue (without this a waiting request sat until a
        // timeout answered it 500, with pages free).
        if self.pool.free_count() > free_before && !self.waiting.is_empty() {
            self.arm_compute(env);
        }
        if let Some(req) = self.requests.get_mut(&room) {
            if let Phase::Sending { in_flight, .. } = &mut req.phase {
                *in_flight = in_flight.saturating_sub(1);
                if !ok {
                    // One failed write fails the room (M7 Failed, immediately).
                    self.fail_send(room, KvDoneOwed::Yes, env);
                } else {
                    self.send_chunks(room, env);
                }
            }
        }
        self.maybe_ack_drain(room, env);
    }

    /// Has every write of this room use completed?
    fn drained(&self, room: RoomKey) -> bool {
        match self.outstanding.get(&room) {
            None => true,
            Some(o) => {
                o.chunks.is_empty()
                    || (o.any_failed && self.cfg.bugs.has(Bug::FailedSendReportsDrained))
            }
        }
    }

    fn maybe_ack_drain(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let drained = self.drained(room);
        let Some(out) = self.outstanding.get_mut(&room) else {
            return;
        };
        if drained {
            if let Some(to) = out.drain_requested_by.take() {
                env.trace(TraceEvent::DrainAcked {
                    node: self.id,
                    room,
                });
                env.send(to, Msg::DrainAck { room });
            }
        }
        if out.chunks.is_empty()
            && out.drain_requested_by.is_none()
            && !self.requests.contains_key(&room)
        {
            self.outstanding.remove(&room);
        }
    }

    /// Decode aborted the room (M8): stop sending; ack once every write drained.
    fn on_drain_request(&mut self, from: NodeId, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if let Some(req) = self.requests.get_mut(&room) {
            match &req.phase {
                Phase::Sending { .. } => {
                    req.finished_reason.get_or_insert(Status::INTERNAL);
                    // Decode asked: it needs no KvDone.
                    self.fail_send(room, KvDoneOwed::No, env);
                }
                Phase::Bootstrapping | Phase::Waiting { .. } | Phase::Forward { .. } => {
                    self.on_abort(room, Status::INTERNAL, env);
                }
                Phase::Inflight { .. } => {}
            }
        }
        let unknown = !self.requests.contains_key(&room)
            && !self.outstanding.contains_key(&room)
            && !self.is_stale(room);
        if unknown {
            // Kept, not believed: the start names the room's decode node. Acked now
            // (there is no write of this node for the room), unless the bound is
            // reached; then decode asks again later.
            if self.early_drain.len() >= self.cfg.max_queue as usize {
                return;
            }
            self.early_drain.insert((room, from));
        } else if !self.requests.contains_key(&room) {
            self.tombstone(room);
        }
        self.outstanding
            .entry(room)
            .or_insert_with(|| Outstanding {
                to: from,
                ..Outstanding::default()
            })
            .drain_requested_by = Some(from);
        self.maybe_ack_drain(room, env);
    }

    /// An abort from the router (client gone, decode failed) or from decode.
    fn on_abort(&mut self, room: RoomKey, status: Status, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get_mut(&room) else {
            // Unknown: the start message is late or lost, or we already answered. Either
            // way answer (again, with the first answer's status); the router ignores
            // duplicates, and the tombstone makes a late start message harmless.
            self.tombstone(room);
            self.answer(room, status, None, env);
            return;
        };
        env.trace(TraceEvent::AbortNoted {
            node: self.id,
            room,
            side: Side::Prefill,
        });
        match &req.phase {
            // An abort is the router's to tell decode (defense 6); prefill tells it
            // only what it knows to be owed, a page list it will never serve.
            Phase::Bootstrapping | Phase::Waiting { .. } => {
                let knows_decode = req.phase.meta().is_some();
                if knows_decode {
                    self.notify_decode_failed(room, env);
                }
                self.retire(room, status, None, env);
            }
            // Abort method 3: the running batch sees it at the next result.
            Phase::Forward { .. } => {
                req.to_finish.get_or_insert(status);
            }
            Phase::Sending { .. } => {
                req.finished_reason.get_or_insert(status);
                self.fail_send(room, KvDoneOwed::Yes, env);
            }
            // The transfer already concluded; the abort is recorded as the finish
            // reason and the poll decides what the router hears.
            Phase::Inflight { .. } => {
                req.finished_reason.get_or_insert(status);
            }
        }
    }

    /// Conclude a sending room's transfer as failed: no further chunk goes out, decode
    /// hears `KvDone { Failed }` unless it asked for the stop itself, and the next
    /// scheduler tick polls the room (which releases the source pages once their writes
    /// drained). The three ways a send fails (a write failed, an abort, decode's drain
    /// request) all end here.
    fn fail_send(&mut self, room: RoomKey, owed: KvDoneOwed, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get_mut(&room) else {
            return;
        };
        if !matches!(req.phase, Phase::Sending { .. }) {
            return;
        }
        req.advance(|now| match now {
            Phase::Sending { meta, pages, .. } => Phase::Inflight {
                meta,
                pages,
                outcome: TransferOutcome::Failed,
            },
            other => other,
        });
        debug_assert!(matches!(req.phase, Phase::Inflight { .. }));
        if owed == KvDoneOwed::Yes {
            self.notify_decode_failed(room, env);
        }
        self.arm_compute(env);
    }

    /// The device failed reading the source or its digest: state it and fail the send
    /// as a failed write does (decode told, the writes in flight still complete, the
    /// source released when they drained).
    fn send_failed_on_device(&mut self, room: RoomKey, e: &DeviceError, env: &mut Outbox<G::Kv>) {
        self.fault(device_fault(Some(room), e), env);
        self.fail_send(room, KvDoneOwed::Yes, env);
    }

    fn notify_decode_failed(&self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        if let Some(req) = self.requests.get(&room) {
            tell_failed(env, room, req.decode, req.phase.decode_epoch());
        }
    }

    /// `room` failed before `decode`'s page list was used: tell `decode` at once if its
    /// list is here already (kept early), or record that it is owed the news
    /// ([`Self::on_failed_meta`]).
    fn owe_failure(&mut self, room: RoomKey, decode: NodeId, env: &mut Outbox<G::Kv>) {
        if let Some(dst) = self.early_meta.remove(&(room, decode)) {
            tell_failed(env, room, decode, epoch_of(&dst));
            return;
        }
        let e = self
            .owed_failure
            .entry(room.room, || (room.gen, decode), &|_| false);
        *e = (room.gen, decode);
    }

    /// A page list for a room use this node already retired. If the use failed here
    /// before its page list came, the decode its start named is told the transfer
    /// failed, once (peer identity, [`Self::check_peer`], refused a list from any other
    /// node), and then releases its pages instead of waiting for its own timeout. A
    /// late copy of a list already used changes nothing.
    fn on_failed_meta(
        &mut self,
        from: NodeId,
        room: RoomKey,
        dst: &[PageTag],
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(decode) = self.owes_failure_to(room) else {
            return;
        };
        assert_eq!(decode, from, "peer identity admits only the room's decode");
        self.owed_failure.remove(room.room);
        tell_failed(env, room, decode, epoch_of(dst));
    }

    /// `process_disagg_prefill_inflight_queue` for one concluded room.
    fn poll_inflight(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Inflight { pages, outcome, .. } = &req.phase else {
            return;
        };
        let pages = pages.clone();
        let status = match outcome {
            TransferOutcome::Success { .. } => {
                // #33507: the Success branch set FINISH_LENGTH unconditionally. The fix
                // keeps a pending abort. Under the legacy gates `to_finish` is invisible.
                let pending = if self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
                    req.finished_reason
                } else {
                    req.finished_reason.or(req.to_finish)
                };
                if self.cfg.bugs.has(Bug::SuccessOverwritesAbort) {
                    Status::OK
                } else {
                    pending.unwrap_or(Status::OK)
                }
            }
            TransferOutcome::Failed => req
                .finished_reason
                .or(req.to_finish)
                .unwrap_or(Status::INTERNAL),
        };
        self.release_source(room, &pages, env);
        self.retire(room, status, None, env);
    }

    /// `release_kv_cache` for the source pages. Held pages drain first, unless the
    /// `prefill-release-before-drain` bug frees them outright.
    fn release_source(&mut self, room: RoomKey, pages: &[PageTag], env: &mut Outbox<G::Kv>) {
        let unchecked = self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain) && !self.drained(room);
        if unchecked {
            self.pool.free_unchecked(room, pages);
        } else if let Err(e) = self.pool.release(room, pages) {
            self.fault(NodeFault::record_refused(room, "release", &e), env);
            return;
        }
        self.flush(env);
        if self.cfg.defenses.zero_on_free {
            let pool = &self.pool;
            let is_free = |p| pool.record(p).is_some_and(|r| r.state == PageState::Free);
            let node = (self.id, &mut self.counters);
            zero_on_free(&mut self.gpu, env, node, pages, is_free);
        }
        // Freed pages may unblock the head of the waiting queue.
        if !self.waiting.is_empty() {
            self.arm_compute(env);
        }
    }

    /// Remove the request and answer the router once, with the engine's reason for an
    /// error `status` where it has one.
    fn retire(&mut self, room: RoomKey, status: Status, why: Option<Why>, env: &mut Outbox<G::Kv>) {
        if self.requests.remove(&room).is_none() {
            return;
        }
        self.tombstone(room);
        env.cancel_timer(Timer::Bootstrap(room));
        self.answer(room, status, why, env);
        self.maybe_ack_drain(room, env);
    }

    /// Answer the router for `room`, once, with the engine's reason for an error
    /// `status` where it has one: a repeated answer (an abort seen again, for a use
    /// already answered) repeats the first status and reason.
    fn answer(&mut self, room: RoomKey, status: Status, why: Option<Why>, env: &mut Outbox<G::Kv>) {
        let from = (self.id, self.router, Side::Prefill);
        self.retired
            .answer_once(env, from, room, (status, why), &self.outstanding);
    }

    /// S1/S8 on the pool, and every page owned by a live request or draining.
    pub fn invariants(&self) -> Result<(), Violation> {
        self.pool.invariants()?;
        for (page, rec) in self.pool.records() {
            if let Some(owner) = rec.owner {
                if !self.requests.contains_key(&owner) {
                    return Err(Violation::new(
                        Invariant::S1,
                        format!(
                            "prefill {}: {page} is owned by {owner}, which is not live",
                            self.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The phase of a live room use, `None` when this node has no request for it.
    pub fn room_phase(&self, room: RoomKey) -> Option<PrefillPhase> {
        Some(match &self.requests.get(&room)?.phase {
            Phase::Bootstrapping => PrefillPhase::Bootstrapping,
            Phase::Waiting { .. } => PrefillPhase::Waiting,
            Phase::Forward { pages, .. } => PrefillPhase::Forward {
                pages: pages.clone(),
            },
            Phase::Sending {
                next_page,
                in_flight,
                ..
            } => PrefillPhase::Sending {
                next_page: *next_page,
                in_flight: *in_flight,
            },
            Phase::Inflight { outcome, .. } => PrefillPhase::Inflight {
                success: matches!(outcome, TransferOutcome::Success { .. }),
            },
        })
    }

    /// The nodes whose page lists for a room use are kept, when they arrived before
    /// the room's start message.
    /// The decode node still owed the news that `room` failed here (its page list has
    /// not come yet), if any.
    pub fn owes_failure_to(&self, room: RoomKey) -> Option<NodeId> {
        self.owed_failure
            .get(room.room)
            .filter(|(gen, _)| *gen == room.gen)
            .map(|(_, decode)| *decode)
    }

    pub fn early_meta_from(&self, room: RoomKey) -> Vec<NodeId> {
        self.early_meta
            .range((room, NodeId(0))..=(room, NodeId(u16::MAX)))
            .map(|((_, from), _)| *from)
            .collect()
    }

    /// The node a drain ack for this room use is owed to, if one was asked for and
    /// not yet sent.
    pub fn drain_owed_to(&self, room: RoomKey) -> Option<NodeId> {
        self.outstanding.get(&room)?.drain_requested_by
    }

    /// Whether this node retired the room use (any message for it is stale).
    pub fn is_retired(&self, room: RoomKey) -> bool {
        self.is_stale(room)
    }
}

impl<G: Gpu> crate::step::Stepper<G::Kv> for PrefillNode<G> {
    fn handle(&mut self, input: Input<G::Kv>, out: &mut crate::env::Outbox<G::Kv>) {
        PrefillNode::handle(self, input, out);
    }
    fn compute(&mut self, job: crate::compute::Job) -> crate::compute::Done {
        job.run(&mut self.gpu)
    }
}
