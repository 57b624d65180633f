//! `DecodeNode`: receives KV from prefill and generates the reply.
//!
//! The SGLang decode scheduler, transfer queue and receiving NIC in one state
//! machine: intake (its own length check) -> prealloc queue (reserve pages for the
//! prompt length it was told plus the reply, send the page list, M5) -> transfer (KV
//! writes land, each acknowledged to the writer) -> verify on completion (defense 2)
//! -> running batch (echo attention with the page-tag check, defense 4; stream
//! tokens) -> finish and release. On abort or failure while a transfer may still
//! write, pages are quarantined until prefill acks that this exact room use drained
//! (defense 3); a drain ack that never comes fails the node loudly instead of
//! releasing.
//!
//! It is not the transport: a KV write is a message handled here the way a receiver
//! thread would handle it, and it is refused (never applied) when a destination tag is
//! stale or not the room's, as long as page tags are on.
//!
//! Invariant: a quarantined page returns to the pool only after the drain ack for its
//! own room use; a request attends only over pages whose tags it was given.

use crate::bugs::Bug;
use crate::compute::{Done, Job, StepJob, StepOutcome};
use crate::counters::Counters;
use crate::env::{Input, Outbox, Timer};
use crate::gpu::{
    device_fault, ids, query_position, trace_write, zero_on_free, DeviceError, Gpu, TagError,
    TagMismatch, WriteError,
};
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token, WriteId};
use crate::invariant::{Invariant, Violation};
use crate::kv::{land, PagePool, PageRecords, PageState, Refusal};
use crate::msg::{only_router, Msg, Status, TransferOutcome, Why};
use crate::retired::RetiredRooms;
use crate::shared_cfg::Cfg;
use crate::trace::{NodeFault, ReleaseKind, Side, TraceEvent, TransferClaim};
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
/// Each phase holds the pages it owns: none before the reservation; from then on every
/// page reserved, the prompt's first (the transfer destination), then the pages the
/// reply will be written into.
enum Phase {
    /// Receiver created; waiting for pages.
    #[default]
    Prealloc,
    /// Pages reserved and announced; KV writes may land. The first `dst_pages` of
    /// `pages` are the transfer destination, and `written[i]` says whether destination
    /// page `i` has been written (`written.len() == dst_pages`).
    Transferring {
        pages: Vec<PageTag>,
        dst_pages: usize,
        written: Vec<bool>,
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
    fn into_pages(self) -> Vec<PageTag> {
        match self {
            Phase::Prealloc => Vec::new(),
            Phase::Transferring { pages, .. } | Phase::Running { pages, .. } => pages,
        }
    }

    /// Every page the room use holds in this phase.
    fn pages(&self) -> &[PageTag] {
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
    /// has been written.
    Transferring { written: Vec<bool> },
    /// Generating: the next step and the sequence length so far.
    Running { step: u32, seq_len: u64 },
    /// Aborted or failed while a write could still land: the pages wait for the drain
    /// ack; `retries` drain requests were repeated so far.
    Quarantined { retries: u32 },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Request {
    prefill: NodeId,
    prompt_len: u64,
    max_new_tokens: u32,
    phase: Phase,
}

/// Decode's judgement of prefill's conclusion ([`DecodeNode::judge_transfer`]).
enum Verdict {
    /// Run the request; prefill's counts as it reported them.
    Accept { tokens: u64, pages: u32 },
    /// Fail the room, for this reason.
    Reject(String),
    /// The device failed while checking.
    Device(DeviceError),
}

/// What both the accepted and the refused transfer state about the room.
#[derive(Clone, Copy)]
struct TransferFacts {
    from: NodeId,
    prompt_len: u64,
    reserved_pages: u32,
    fully_written: bool,
}

impl TransferFacts {
    /// The claim stated in the trace: these facts with prefill's reported counts.
    fn claim(self, (sent_tokens, sent_pages): (u64, u32)) -> TransferClaim {
        let claim = TransferClaim {
            from: self.from,
            prompt_len: self.prompt_len,
            reserved_pages: self.reserved_pages,
            sent_tokens,
            sent_pages,
            fully_written: self.fully_written,
        };
        debug_assert_eq!(claim.from, self.from);
        debug_assert_eq!(claim.reserved_pages, self.reserved_pages);
        claim
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Quarantine {
    pages: Vec<PageTag>,
    prefill: NodeId,
    retries: u32,
}

/// The decode node state machine, generic over its KV memory and over the form of its
/// one page ownership record (a [`PagePool`] for every driver but the hardware
/// runtime, whose transfer thread shares a [`crate::kv::SharedRecord`] with it).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct DecodeNode<G, P = PagePool> {
    id: NodeId,
    cfg: Cfg,
    router: NodeId,
    /// The prefill nodes of the deployment (the topology): a start naming any other
    /// node as the room's writer is refused, since no drain ack could ever come from
    /// it and a quarantine waiting on it would never end.
    prefills: Vec<NodeId>,
    pool: P,
    gpu: G,
    requests: BTreeMap<RoomKey, Request>,
    prealloc: VecDeque<RoomKey>,
    quarantine: BTreeMap<RoomKey, Quarantine>,
    retired: RetiredRooms,
    /// Pages of recently finished requests, kept for the `double-free-on-finish` bug's
    /// second release path (bounded by `max_queue`; empty unless the bug is on).
    finished_pages: VecDeque<(RoomKey, Vec<PageTag>)>,
    compute_armed: bool,
    /// The running rooms of the scheduler pass under way still to step, in order (one
    /// step's device work at a time, [`crate::compute::Job`]). Empty between the steps
    /// of every driver: a pass starts and ends in one step.
    batch: VecDeque<RoomKey>,
    /// Set when the node stopped itself (a drain ack never came).
    fatal: Option<String>,
    counters: Counters,
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
            retired,
            finished_pages: VecDeque::new(),
            compute_armed: false,
            batch: VecDeque::new(),
            fatal: None,
            counters: Counters::default(),
        }
    }

    /// The room uses this node retired (bounded: [`RetiredRooms::bound`]).
    pub fn retired(&self) -> &RetiredRooms {
        &self.retired
    }
    pub fn id(&self) -> NodeId {
        self.id
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

    /// Trace the page changes the pool journaled since the last call, in order; a
    /// quarantine release names the drain ack that caused it (`acked`).
    fn flush(&mut self, env: &mut Outbox<G::Kv>, acked: Option<RoomKey>) {
        let id = self.id;
        self.pool
            .drain_changes(|c| env.trace(c.into_event(id, acked)));
    }

    /// Report a fault of this node (drivers act on it).
    fn fault(&mut self, fault: NodeFault, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        self.counters.fault(env, id, fault);
    }

    /// Peer identity: the router starts and aborts rooms; a KV write, a transfer's
    /// conclusion and a drain ack about a room this node knows are believed only from
    /// that room's prefill node, and a write only when its id names its sender. For a
    /// room this node does not know there is no recorded peer: a write for it is then
    /// judged by the page tags alone (as RDMA into a registered region would be), and an
    /// ack for it releases nothing.
    fn check_peer(&self, from: NodeId, msg: &Msg<G::Kv>) -> Result<(), String> {
        let prefill_of = |room: &RoomKey| {
            self.requests
                .get(room)
                .map(|r| r.prefill)
                .or_else(|| self.quarantine.get(room).map(|q| q.prefill))
        };
        match msg {
            Msg::DecodeStart { .. } | Msg::Abort { .. } if from != self.router => {
                Err(only_router(self.router, from))
            }
            Msg::DecodeStart { room, prefill, .. } if !self.prefills.contains(prefill) => Err(
                format!("{room}'s start names {prefill}, which is not a prefill node"),
            ),
            Msg::KvWrite { id, .. } => self.check_writer(from, *id),
            Msg::KvDone { room, .. } => match prefill_of(room) {
                Some(p) if p != from => Err(format!("{room}'s prefill node is {p}")),
                _ => Ok(()),
            },
            Msg::DrainAck { room } => {
                let asked: Vec<NodeId> = if self.cfg.bugs.has(Bug::AckIgnoresGeneration) {
                    self.quarantine
                        .iter()
                        .filter(|(k, _)| k.room == room.room)
                        .map(|(_, q)| q.prefill)
                        .collect()
                } else {
                    self.quarantine
                        .get(room)
                        .map(|q| q.prefill)
                        .into_iter()
                        .collect()
                };
                // Believed from a node that was asked. Under the generation-blind bug a
                // room number may wait on several prefill nodes at once (one per use);
                // the ack of any one of them is believed, as that system would.
                if !asked.is_empty() && !asked.contains(&from) {
                    Err(format!("{from} was not asked to drain {room}"))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// The peer rule of a KV write, delivered or landed by the driver's receiver: its
    /// id names its sender, and a room this node knows is written only by its prefill.
    fn check_writer(&self, from: NodeId, id: WriteId) -> Result<(), String> {
        if id.writer != from {
            return Err(format!("the write {id} names another writer"));
        }
        let prefill = self
            .requests
            .get(&id.room)
            .map(|r| r.prefill)
            .or_else(|| self.quarantine.get(&id.room).map(|q| q.prefill));
        match prefill {
            Some(p) if p != from => Err(format!("{}'s prefill node is {p}", id.room)),
            _ => Ok(()),
        }
    }

    /// Become the next incarnation, `epoch` (a driver asks for it through
    /// [`world::restart`](crate::world::restart), after the crash walk): requests,
    /// queues, quarantine, the fatal flag and tombstones are gone; the pool starts over,
    /// full, in the new epoch, so a write addressed with a tag handed out before the
    /// crash can never match a page allocated after it. KV memory is kept as it was
    /// (never zeroed). The driver must also forget the node's pending timers and
    /// undelivered messages. `epoch` must exceed every earlier one.
    pub(crate) fn reincarnate(&mut self, epoch: u32) {
        assert!(
            epoch > self.pool.epoch(),
            "a restart needs a new, higher epoch"
        );
        // Destructure so that a field added later cannot be forgotten here.
        let DecodeNode {
            id: _,
            cfg: _,
            router: _,
            prefills: _,
            pool,
            gpu: _,
            requests,
            prealloc,
            quarantine,
            retired,
            finished_pages,
            compute_armed,
            batch,
            fatal,
            counters: _,
        } = self;
        *pool = pool.restarted(epoch);
        requests.clear();
        prealloc.clear();
        quarantine.clear();
        retired.clear();
        finished_pages.clear();
        *compute_armed = false;
        batch.clear();
        *fatal = None;
    }

    fn is_stale(&self, room: RoomKey) -> bool {
        self.retired.is_stale(room)
    }

    /// Ask for the scheduler loop's next pass (`Timer::Compute`), unless one is armed.
    fn arm_compute(&mut self, env: &mut Outbox<G::Kv>) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.decode_step_ns);
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
                    if let Msg::KvWrite { id, .. } = msg {
                        // Exactly one completion per write, even for a refused one.
                        env.send(from, Msg::WriteDone { id, ok: false });
                    }
                    return;
                }
                match msg {
                    Msg::DecodeStart {
                        room,
                        req,
                        prompt,
                        max_new_tokens,
                        prefill,
                    } => {
                        self.on_start(room, req, prompt.len() as u64, max_new_tokens, prefill, env)
                    }
                    Msg::KvWrite { id, dst, kv, .. } => self.on_kv_write(from, id, dst, kv, env),
                    // A conclusion about a dead incarnation's page list: not ours.
                    Msg::KvDone { epoch, .. } if epoch != self.pool.epoch() => {}
                    Msg::KvDone { room, outcome, .. } => self.on_kv_done(from, room, outcome, env),
                    Msg::Abort { room } => self.on_abort(room, Status::CLIENT_CLOSED, env),
                    Msg::DrainAck { room } => self.on_drain_ack(room, env),
                    _ => {}
                }
            }
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env)
            }
            Input::Timer(Timer::WaitingForKv(room)) => {
                if matches!(
                    self.requests.get(&room).map(|r| &r.phase),
                    Some(Phase::Transferring { .. })
                ) {
                    env.trace(TraceEvent::TransferFailed {
                        node: self.id,
                        room,
                        reason: "waiting timeout".into(),
                    });
                    self.fail(room, Status::INTERNAL, Some(Why::TransferFailed), env);
                }
            }
            Input::Timer(Timer::DrainRetry(room, arming)) => self.on_drain_retry(room, arming, env),
            Input::Timer(_) => {}
            Input::Landed {
                from,
                id,
                dst,
                landing,
            } => self.on_landed(from, id, dst, landing, env),
            Input::Computed(Done::DecodeStep { job, outcome }) => {
                self.stepped(job, outcome, env);
                self.next_step(env);
            }
            // A forward is a prefill node's.
            Input::Computed(Done::Forward { .. }) => {}
        }
    }

    /// A write its receiver already landed (or refused), entering through `handle`: the
    /// peer rule of a delivered write first, then [`Self::landed`].
    fn on_landed(
        &mut self,
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
        env: &mut Outbox<G::Kv>,
    ) {
        if let Err(reason) = self.check_writer(from, id) {
            // Refused as the delivered write would be, by the same rule, with the one
            // completion the writer is owed.
            let node = self.id;
            let kind = "KvWrite";
            self.counters
                .refuse_peer(env, node, from, Some(id.room), kind, reason);
            env.send(from, Msg::WriteDone { id, ok: false });
            return;
        }
        self.landed(from, id, dst, landing, env)
    }

    /// Answer the router for `room`, once, with the engine's reason for an error
    /// `status` where it has one: a repeated answer (an abort seen again, for a use
    /// already answered) repeats the first status and reason.
    fn answer(&mut self, room: RoomKey, status: Status, why: Option<Why>, env: &mut Outbox<G::Kv>) {
        let from = (self.id, self.router, Side::Decode);
        self.retired
            .answer_once(env, from, room, (status, why), &self.quarantine);
    }

    /// The router's start: intake checks (a stopped node, the queue, the length), then
    /// the room waits in the prealloc queue for its pages.
    fn on_start(
        &mut self,
        room: RoomKey,
        req: RequestId,
        prompt_len: u64,
        max_new_tokens: u32,
        prefill: NodeId,
        env: &mut Outbox<G::Kv>,
    ) {
        if self.requests.contains_key(&room) || self.is_stale(room) {
            return;
        }
        if let Some(reason) = &self.fatal {
            let reason = format!("node stopped: {reason}");
            let why = Why::NodeStopped { side: Side::Decode };
            self.reject_start(room, Status::UNAVAILABLE, why, reason, env);
            return;
        }
        if self.requests.len() >= self.cfg.max_queue as usize {
            let why = Why::QueueFull { side: Side::Decode };
            self.reject_start(room, Status::UNAVAILABLE, why, why.to_string(), env);
            return;
        }
        let prompt_len = match self.check_length(room, prompt_len, max_new_tokens, env) {
            Ok(len) => len,
            Err(why) => {
                self.reject_start(room, Status::BAD_REQUEST, why, why.to_string(), env);
                return;
            }
        };
        env.trace(TraceEvent::Admitted {
            node: self.id,
            room,
            req,
            side: Side::Decode,
            prompt_len,
        });
        self.requests.insert(
            room,
            Request {
                prefill,
                prompt_len,
                max_new_tokens,
                phase: Phase::Prealloc,
            },
        );
        self.prealloc.push_back(room);
        self.try_prealloc(env);
    }

    /// Refuse a start at intake, stating `reason`, and answer once with `why`.
    fn reject_start(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Why,
        reason: String,
        env: &mut Outbox<G::Kv>,
    ) {
        env.trace(TraceEvent::Rejected {
            node: self.id,
            room,
            side: Side::Decode,
            status,
            reason,
        });
        self.answer(room, status, Some(why), env);
    }

    /// Decode's own length check: the prompt plus the reply must fit the admission
    /// limit. Returns the prompt length to reserve for (the legacy rejection, a bug
    /// switch, lets a 1-token placeholder through), or the reason to refuse.
    fn check_length(
        &self,
        room: RoomKey,
        prompt_len: u64,
        max_new_tokens: u32,
        env: &mut Outbox<G::Kv>,
    ) -> Result<u64, Why> {
        let need = prompt_len + u64::from(max_new_tokens);
        let Some(limit) = self.cfg.admission_limit(self.pool.capacity() as u32) else {
            return Ok(prompt_len);
        };
        if need <= limit {
            return Ok(prompt_len);
        }
        if !self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
            return Err(Why::ReplyTooLong {
                tokens: prompt_len,
                new_tokens: max_new_tokens,
                limit,
            });
        }
        // The same legacy rejection as prefill's: a 1-token placeholder that decode's
        // `finished_reason`-only gate lets through.
        env.trace(TraceEvent::RejectedLegacy {
            node: self.id,
            room,
            prompt_len,
        });
        Ok(1)
    }

    /// `pop_preallocated`: reserve pages FIFO and send each room's page list.
    fn try_prealloc(&mut self, env: &mut Outbox<G::Kv>) {
        while let Some(&room) = self.prealloc.front() {
            let Some(req) = self.requests.get(&room) else {
                self.prealloc.pop_front();
                continue;
            };
            let need = self
                .cfg
                .pages_for(req.prompt_len + u64::from(req.max_new_tokens))
                as usize;
            if need > self.pool.capacity() && !self.cfg.bugs.has(Bug::AdmitBeyondPool) {
                self.prealloc.pop_front();
                self.requests.remove(&room);
                self.answer(room, Status::INTERNAL, None, env);
                continue;
            }
            let Ok(pages) = self.pool.alloc(need, room) else {
                break;
            };
            self.prealloc.pop_front();
            let dst_pages = (self.cfg.pages_for(req.prompt_len) as usize).min(pages.len());
            let dst = pages[..dst_pages].to_vec();
            // Fresh allocation: the pages are Reserved and ours.
            self.pool
                .expect_write(room, &dst)
                .expect("fresh allocation is owned and Reserved (S1)");
            let (prefill, prompt_len) = (req.prefill, req.prompt_len);
            self.flush(env, None);
            if let Some(r) = self.requests.get_mut(&room) {
                debug_assert_eq!(r.phase, Phase::Prealloc);
                r.phase = Phase::Transferring {
                    pages,
                    dst_pages,
                    written: vec![false; dst_pages],
                };
            }
            env.send(
                prefill,
                Msg::KvMeta {
                    room,
                    dst,
                    prompt_len,
                },
            );
            env.set_timer(Timer::WaitingForKv(room), self.cfg.timeouts.waiting_ns);
        }
    }

    /// The receiver applying one chunk write: [`land`] (the gate and the memory write,
    /// the one landing function every driver uses), then `landed`. With
    /// the landing gate (two-sided only, `EngineConfig::landing_gated`), a destination that is
    /// not this room use's (stale generation, another owner, freed, `Ready`) refuses the
    /// whole chunk; on one-sided RDMA the write lands wherever it points.
    fn on_kv_write(
        &mut self,
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        kv: Vec<G::Kv>,
        env: &mut Outbox<G::Kv>,
    ) {
        let landing = land(
            &self.pool,
            &mut self.gpu,
            self.cfg.landing_gated(),
            id.room,
            &dst,
            &kv,
        );
        self.landed(from, id, dst, landing, env);
    }

    /// A KV write of `from` landed in (or was refused by) this node's memory: trace
    /// it, note the written pages, and complete the write (exactly one completion).
    /// The hardware runtime's transfer thread lands writes with [`land`] on the shared
    /// record and reports each one here as an [`Input::Landed`], through `handle`.
    fn landed(
        &mut self,
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
        env: &mut Outbox<G::Kv>,
    ) {
        let room = id.room;
        if let Err(Refusal { tag, reason }) = landing {
            self.counters.writes_refused += 1;
            env.trace(TraceEvent::KvRefused {
                node: self.id,
                write: id,
                tag,
                reason,
            });
            env.send(from, Msg::WriteDone { id, ok: false });
            return;
        }
        debug_assert!(
            self.check_writer(from, id).is_ok(),
            "a landing reaches here only past the peer rule"
        );
        env.trace(TraceEvent::KvLanded {
            node: self.id,
            write: id,
            dst: dst.clone(),
        });
        if let Some(req) = self.requests.get_mut(&room) {
            if let Phase::Transferring {
                pages,
                dst_pages,
                written,
            } = &mut req.phase
            {
                debug_assert_eq!(written.len(), *dst_pages, "one mark per destination page");
                for t in &dst {
                    if let Some(i) = pages[..*dst_pages].iter().position(|p| p == t) {
                        written[i] = true;
                    }
                }
            }
        }
        env.send(from, Msg::WriteDone { id, ok: true });
    }

    /// Prefill concluded the room's transfer: judge it ([`Self::judge_transfer`]), then
    /// accept it and run the request, or fail the room (refused at verification, a
    /// reported failure, or this node's device failing the check).
    fn on_kv_done(
        &mut self,
        from: NodeId,
        room: RoomKey,
        outcome: TransferOutcome,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Transferring {
            pages,
            dst_pages,
            written,
        } = &req.phase
        else {
            return;
        };
        env.trace(TraceEvent::TransferReported {
            node: self.id,
            room,
            from,
            success: matches!(outcome, TransferOutcome::Success { .. }),
        });
        let verdict = self.judge_transfer(req, &pages[..*dst_pages], written, &outcome);
        let facts = TransferFacts {
            from,
            prompt_len: req.prompt_len,
            reserved_pages: *dst_pages as u32,
            fully_written: written.iter().all(|w| *w),
        };
        match (verdict, outcome) {
            (Verdict::Accept { tokens, pages }, _) => {
                self.accept_transfer(room, facts, tokens, pages, env)
            }
            (Verdict::Reject(reason), TransferOutcome::Success { tokens, pages, .. }) => {
                self.refuse_transfer(room, facts, (tokens, pages), reason, env)
            }
            (Verdict::Reject(reason), TransferOutcome::Failed) => {
                self.counters.transfers_failed += 1;
                env.trace(TraceEvent::TransferFailed {
                    node: self.id,
                    room,
                    reason,
                });
                self.fail(room, Status::INTERNAL, Some(Why::TransferFailed), env);
            }
            (Verdict::Device(e), _) => {
                self.counters.transfers_failed += 1;
                self.device_failed(room, &e, env);
            }
        }
    }

    /// Defense 2, verify on completion: do prefill's token and page counts, the written
    /// marks and the checksum agree with what this node reserved? Reads only.
    fn judge_transfer(
        &self,
        req: &Request,
        dst_tags: &[PageTag],
        written: &[bool],
        outcome: &TransferOutcome,
    ) -> Verdict {
        let dst = ids(dst_tags);
        let verify = self.cfg.defenses.verify_on_completion;
        let checksum_is = |tokens: u64, want: u64, what: &str| match self.gpu.digest(&dst, tokens) {
            Err(e) => Err(Verdict::Device(e)),
            Ok(d) if d != want => Err(Verdict::Reject(format!("checksum over {what} differs"))),
            Ok(_) => Ok(()),
        };
        match *outcome {
            TransferOutcome::Failed if self.cfg.bugs.has(Bug::FailOpenOnRecvError) => {
                // vLLM #52234: a receive failure is treated as done; the request runs
                // on whatever its pages hold.
                Verdict::Accept {
                    tokens: 0,
                    pages: 0,
                }
            }
            TransferOutcome::Failed => {
                Verdict::Reject("prefill reported the transfer failed".into())
            }
            TransferOutcome::Success {
                tokens,
                pages,
                checksum,
            } => {
                let checked = if verify && !self.cfg.bugs.has(Bug::NoLengthAgreement) {
                    if tokens != req.prompt_len {
                        Err(Verdict::Reject(format!(
                            "prefill sent {tokens} tokens, decode expects {}",
                            req.prompt_len
                        )))
                    } else if pages as usize != dst_tags.len() {
                        Err(Verdict::Reject(format!(
                            "prefill sent {pages} pages, decode reserved {}",
                            dst_tags.len()
                        )))
                    } else if let Some(i) = written.iter().position(|w| !w) {
                        Err(Verdict::Reject(format!(
                            "destination page {} was never written",
                            dst_tags[i]
                        )))
                    } else {
                        checksum_is(req.prompt_len, checksum, "the reserved prompt")
                    }
                } else if verify {
                    // The legacy digest covers only what prefill says it sent.
                    checksum_is(tokens, checksum, "the sent tokens")
                } else {
                    Ok(())
                };
                match checked {
                    Ok(()) => Verdict::Accept { tokens, pages },
                    Err(v) => v,
                }
            }
        }
    }

    /// Verification refused prefill's successful transfer: state both sides' counts and
    /// fail the room (its pages go to quarantine: a write may still land).
    fn refuse_transfer(
        &mut self,
        room: RoomKey,
        facts: TransferFacts,
        (sent_tokens, sent_pages): (u64, u32),
        reason: String,
        env: &mut Outbox<G::Kv>,
    ) {
        self.counters.transfers_failed += 1;
        env.trace(TraceEvent::TransferRefused {
            node: self.id,
            room,
            claim: facts.claim((sent_tokens, sent_pages)),
            reason,
        });
        self.fail(room, Status::INTERNAL, Some(Why::TransferRefused), env);
    }

    /// The transfer was accepted: the destination pages hold verified KV; the request
    /// starts generating.
    fn accept_transfer(
        &mut self,
        room: RoomKey,
        facts: TransferFacts,
        sent_tokens: u64,
        sent_pages: u32,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(Phase::Transferring {
            pages, dst_pages, ..
        }) = self.requests.get(&room).map(|r| &r.phase)
        else {
            return;
        };
        let dst_tags = pages[..*dst_pages].to_vec();
        // Under fail-open they may be Writing still; mark_ready accepts both.
        if let Err(e) = self.pool.mark_ready(room, &dst_tags) {
            self.fault(NodeFault::record_refused(room, "mark-ready", &e), env);
        }
        self.flush(env, None);
        env.trace(TraceEvent::TransferAccepted {
            node: self.id,
            room,
            claim: facts.claim((sent_tokens, sent_pages)),
        });
        env.trace(TraceEvent::Running {
            node: self.id,
            room,
            side: Side::Decode,
        });
        env.cancel_timer(Timer::WaitingForKv(room));
        if let Some(r) = self.requests.get_mut(&room) {
            let pages = std::mem::take(&mut r.phase).into_pages();
            r.phase = Phase::Running {
                pages,
                seq_len: facts.prompt_len,
                step: 0,
            };
        }
        self.arm_compute(env);
    }

    /// The device failed serving `room`: state it, and fail the request with its reason
    /// (its pages released, or quarantined while a write may still land).
    fn device_failed(&mut self, room: RoomKey, e: &DeviceError, env: &mut Outbox<G::Kv>) {
        self.fault(device_fault(Some(room), e), env);
        let why = Some(Why::DeviceFailed { side: Side::Decode });
        match self.requests.get(&room).map(|r| &r.phase) {
            Some(Phase::Running { .. }) => self.finish(room, Status::INTERNAL, why, env),
            _ => self.fail(room, Status::INTERNAL, why, env),
        }
    }

    /// The scheduler pass: one decode step for every running request (up to
    /// `max_batch`), one room's device work at a time ([`Self::next_step`]).
    fn on_tick(&mut self, env: &mut Outbox<G::Kv>) {
        debug_assert!(self.batch.is_empty(), "a pass starts with none under way");
        self.batch = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Running { .. }))
            .map(|(k, _)| *k)
            .take(self.cfg.max_batch as usize)
            .collect();
        self.next_step(env);
    }

    /// Ask the device for the next room's step of the pass; at the end of the pass,
    /// ask for the next pass while any request runs.
    fn next_step(&mut self, env: &mut Outbox<G::Kv>) {
        while let Some(room) = self.batch.pop_front() {
            if let Some(job) = self.step_job(room) {
                env.compute(Job::DecodeStep(job));
                return;
            }
        }
        if self
            .requests
            .values()
            .any(|r| matches!(r.phase, Phase::Running { .. }))
        {
            self.arm_compute(env);
        }
    }

    /// The device work of one decode step of `room`: the tag check (defense 4) over the
    /// sequence's pages, echo attention, the new token's KV into the request's own
    /// pages. `None` if the room is not running.
    fn step_job(&self, room: RoomKey) -> Option<StepJob> {
        let req = self.requests.get(&room)?;
        let Phase::Running {
            pages: all,
            seq_len,
            step,
        } = &req.phase
        else {
            return None;
        };
        let ps = u64::from(self.cfg.page_size);
        let seq_pages = (seq_len.div_ceil(ps) as usize).min(all.len());
        Some(StepJob {
            room,
            step: *step,
            seq_len: *seq_len,
            query_pos: query_position(*step, req.max_new_tokens, req.prompt_len),
            pages: all[..seq_pages].to_vec(),
            check_tags: self.cfg.defenses.page_tags,
            write: all.clone(),
        })
    }

    /// What the device did with one decode step of `room`: a refused tag check fails
    /// the request; otherwise the attention is traced, then the token's KV write, then
    /// the token goes to the router and the request advances (or finishes).
    fn stepped(&mut self, mut job: StepJob, outcome: StepOutcome, env: &mut Outbox<G::Kv>) {
        let room = job.room;
        let Some(Phase::Running { seq_len, step, .. }) = self.requests.get(&room).map(|r| &r.phase)
        else {
            return;
        };
        assert_eq!(
            (*seq_len, *step),
            (job.seq_len, job.step),
            "a step's result belongs to the step that asked for it"
        );
        let (token, write) = match outcome {
            StepOutcome::TagsFailed(TagError::Mismatch(m)) => {
                self.tag_mismatch(room, (job.step, job.seq_len), job.pages, m, env);
                return;
            }
            StepOutcome::TagsFailed(TagError::Device(e)) => {
                self.device_failed(room, &e, env);
                return;
            }
            StepOutcome::AttendFailed(e) => {
                self.trace_attend(&mut job, env);
                self.device_failed(room, &e, env);
                return;
            }
            StepOutcome::Attended { token, write } => (token, write),
        };
        self.trace_attend(&mut job, env);
        let ps = self.cfg.page_size;
        let at = (&job.write[..], job.seq_len);
        if let Err(e) = trace_write(env, (self.id, room), at, &[token], ps, write) {
            // Past the request's pages (refused whole), or the device failed; stated
            // as a fault. The request fails.
            let why = match e {
                WriteError::Refused(_) => None,
                WriteError::Device(_) => Some(Why::DeviceFailed { side: Side::Decode }),
            };
            self.finish(room, Status::INTERNAL, why, env);
            return;
        }
        self.advance(&job, token, env);
    }

    /// State the step's attention; the event takes the job's page list (the step
    /// reads only `job.write` after this).
    fn trace_attend(&self, job: &mut StepJob, env: &mut Outbox<G::Kv>) {
        env.trace(TraceEvent::Attend {
            node: self.id,
            room: job.room,
            step: job.step,
            query_pos: job.query_pos,
            seq_len: job.seq_len,
            pages: std::mem::take(&mut job.pages),
        });
    }

    /// The step's token to the router; the request moves one position on, and
    /// finishes after its last token.
    fn advance(&mut self, job: &StepJob, token: Token, env: &mut Outbox<G::Kv>) {
        let (room, step, seq_len) = (job.room, job.step, job.seq_len);
        env.send(
            self.router,
            Msg::TokenOut {
                room,
                index: step,
                token,
            },
        );
        let Some(req) = self.requests.get_mut(&room) else {
            return;
        };
        let done = step + 1 >= req.max_new_tokens;
        if let Phase::Running {
            seq_len: len,
            step: at,
            ..
        } = &mut req.phase
        {
            debug_assert_eq!((*len, *at), (seq_len, step));
            *len = seq_len + 1;
            *at = step + 1;
        }
        if done {
            self.finish(room, Status::OK, None, env);
        }
    }

    /// Defense 4 refused a step: a page does not carry the reader's tag. State it (with
    /// the page's current generation) and fail the request.
    fn tag_mismatch(
        &mut self,
        room: RoomKey,
        (step, seq_len): (u32, u64),
        pages: Vec<PageTag>,
        m: TagMismatch,
        env: &mut Outbox<G::Kv>,
    ) {
        let current = self
            .pool
            .page(m.expected.page)
            .map_or(m.expected.gen, |r| r.gen);
        self.counters.tag_mismatches += 1;
        env.trace(TraceEvent::TagMismatch {
            node: self.id,
            room,
            step,
            seq_len,
            pages,
            tag: m.expected,
            current,
        });
        self.finish(room, Status::INTERNAL, None, env);
    }

    /// Normal end (or a failed step): release the pages and answer once, with the
    /// engine's reason for an error `status` where it has one.
    fn finish(&mut self, room: RoomKey, status: Status, why: Option<Why>, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.remove(&room) else {
            return;
        };
        // Release only the pages this room still owns: after a tag mismatch some page
        // may belong to someone else now, and only the owner frees (S8).
        let owned: Vec<PageTag> = req
            .phase
            .pages()
            .iter()
            .copied()
            .filter(|t| self.pool.owns(room, *t))
            .collect();
        self.release(room, &owned, ReleaseKind::Owner, env);
        if self.cfg.bugs.has(Bug::DoubleFreeOnFinish) {
            if self.finished_pages.len() >= self.cfg.max_queue as usize {
                self.finished_pages.pop_front();
            }
            self.finished_pages
                .push_back((room, req.phase.into_pages()));
        }
        self.answer(room, status, why, env);
    }

    fn release(
        &mut self,
        room: RoomKey,
        pages: &[PageTag],
        how: ReleaseKind,
        env: &mut Outbox<G::Kv>,
    ) {
        match how {
            ReleaseKind::Unchecked => self.pool.free_unchecked(room, pages),
            ReleaseKind::Owner => {
                if let Err(e) = self.pool.release(room, pages) {
                    self.fault(NodeFault::record_refused(room, "release", &e), env);
                    return;
                }
            }
        }
        self.flush(env, None);
        self.after_free(pages, env);
    }

    fn after_free(&mut self, pages: &[PageTag], env: &mut Outbox<G::Kv>) {
        if self.cfg.defenses.zero_on_free {
            let pool = &self.pool;
            let is_free = |p| pool.page(p).is_some_and(|r| r.state == PageState::Free);
            let node = (self.id, &mut self.counters);
            zero_on_free(&mut self.gpu, env, node, pages, is_free);
        }
        self.try_prealloc(env);
    }

    /// The request failed (transfer failure, verification, timeout, abort, the device):
    /// answer with the engine's reason where it has one, and hand its pages to
    /// quarantine if a write may still land in them.
    fn fail(&mut self, room: RoomKey, status: Status, why: Option<Why>, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.remove(&room) else {
            return;
        };
        env.cancel_timer(Timer::WaitingForKv(room));
        match req.phase {
            Phase::Prealloc => self.prealloc.retain(|r| *r != room),
            Phase::Running { pages, .. } => {
                let owned: Vec<PageTag> = pages
                    .iter()
                    .copied()
                    .filter(|t| self.pool.owns(room, *t))
                    .collect();
                self.release(room, &owned, ReleaseKind::Owner, env);
            }
            Phase::Transferring { pages, .. } => {
                let deferred = self.cfg.defenses.deferred_release
                    && !self.cfg.bugs.has(Bug::DecodeReleaseImmediate);
                if deferred {
                    if let Err(e) = self.pool.quarantine(room, &pages) {
                        self.fault(NodeFault::record_refused(room, "quarantine", &e), env);
                    } else {
                        self.flush(env, None);
                        self.quarantine.insert(
                            room,
                            Quarantine {
                                pages,
                                prefill: req.prefill,
                                retries: 0,
                            },
                        );
                        env.send(req.prefill, Msg::DrainRequest { room });
                        env.set_timer(Timer::DrainRetry(room, 0), self.cfg.timeouts.drain_retry_ns);
                    }
                } else {
                    // Free now, while prefill may still be writing (pre-#35049).
                    env.send(req.prefill, Msg::DrainRequest { room });
                    self.release(room, &pages, ReleaseKind::Owner, env);
                }
            }
        }
        self.answer(room, status, why, env);
    }

    fn on_abort(&mut self, room: RoomKey, status: Status, env: &mut Outbox<G::Kv>) {
        if self.requests.contains_key(&room) {
            env.trace(TraceEvent::AbortNoted {
                node: self.id,
                room,
                side: Side::Decode,
            });
            self.fail(room, status, None, env);
            return;
        }
        if self.cfg.bugs.has(Bug::DoubleFreeOnFinish) {
            // The second release path: the abort handler frees the finished request's
            // pages again through the allocator's unchecked free.
            if let Some(i) = self.finished_pages.iter().position(|(r, _)| *r == room) {
                if let Some((_, pages)) = self.finished_pages.remove(i) {
                    self.release(room, &pages, ReleaseKind::Unchecked, env);
                }
            }
        }
        // Unknown or already answered: answer again (the router ignores duplicates) so
        // that a lost answer or a start message still in flight cannot wedge the room.
        self.answer(room, status, None, env);
    }

    fn on_drain_ack(&mut self, ack: RoomKey, env: &mut Outbox<G::Kv>) {
        let matching: Vec<RoomKey> = if self.cfg.bugs.has(Bug::AckIgnoresGeneration) {
            self.quarantine
                .keys()
                .filter(|k| k.room == ack.room)
                .copied()
                .collect()
        } else {
            self.quarantine
                .contains_key(&ack)
                .then_some(ack)
                .into_iter()
                .collect()
        };
        for room in matching {
            let Some(q) = self.quarantine.remove(&room) else {
                continue;
            };
            env.cancel_timer(Timer::DrainRetry(room, q.retries));
            if let Err(e) = self.pool.release_quarantined(room, &q.pages) {
                self.fault(
                    NodeFault::record_refused(room, "quarantine release", &e),
                    env,
                );
                continue;
            }
            self.flush(env, Some(ack));
            self.after_free(&q.pages, env);
        }
    }

    /// A drain-retry timer of `room`'s quarantine fired, set when the quarantine had
    /// made `arming` retries. Only the arming decode set last counts: an earlier one
    /// delivered again (a stale entry of a timer wheel, a cancelled timer) is ignored,
    /// so that it cannot use up the retry budget and stop the node early.
    fn on_drain_retry(&mut self, room: RoomKey, arming: u32, env: &mut Outbox<G::Kv>) {
        let max = self.cfg.timeouts.drain_retries;
        let retry_ns = self.cfg.timeouts.drain_retry_ns;
        let Some(q) = self.quarantine.get_mut(&room) else {
            return;
        };
        if arming != q.retries {
            return;
        }
        // Saturate, so a node that keeps asking has finitely many states.
        q.retries = q.retries.saturating_add(1).min(max.saturating_add(1));
        let (retries, prefill) = (q.retries, q.prefill);
        if retries > max && self.fatal.is_none() {
            // Never release on a timeout: a write may still land. Stop loudly: the
            // node takes no new request from here on.
            let fault = NodeFault::DrainAckMissing { room, retries: max };
            self.fatal = Some(fault.to_string());
            self.fault(fault, env);
        }
        // Keep asking, stopped or not: the writer may come back (a partition heals,
        // a node restarts), and its ack is the only thing that may release these
        // pages. Giving up here would leave them quarantined forever after every
        // outage longer than the retry budget (liveness, L3/L4), with nothing gained
        // for safety.
        env.send(prefill, Msg::DrainRequest { room });
        env.set_timer(Timer::DrainRetry(room, retries), retry_ns);
    }

    /// S1/S8 on the pool; every owned page belongs to a live request or a quarantine
    /// that lists it, and vice versa. Linear in the pool size (drivers call it after
    /// every event, so the page -> holder map is a compact index, not a copy of keys).
    pub fn invariants(&self) -> Result<(), Violation> {
        self.pool.with_pool(|pool| self.invariants_with(pool))
    }

    fn invariants_with(&self, pool: &PagePool) -> Result<(), Violation> {
        pool.invariants()?;
        // holders[i]: 1 + the index in `lists` of the list that holds page i (0: none).
        let mut holders: Vec<u32> = vec![0; pool.capacity() + 1];
        let lists: Vec<(&RoomKey, &[PageTag], bool)> = self
            .requests
            .iter()
            .map(|(k, r)| (k, r.phase.pages(), false))
            .chain(self.quarantine.iter().map(|(k, q)| (k, &q.pages[..], true)))
            .collect();
        for (idx, (_, pages, _)) in lists.iter().enumerate() {
            for t in pages.iter() {
                if let Some(slot) = holders.get_mut(t.page.0 as usize) {
                    *slot = idx as u32 + 1;
                }
            }
        }
        for (page, rec) in pool.records() {
            let Some(owner) = rec.owner else { continue };
            let held_by = match holders[page.0 as usize] {
                0 => None,
                h => lists.get(h as usize - 1).map(|(k, _, q)| (**k, *q)),
            };
            let ok = held_by == Some((owner, rec.state == PageState::Quarantined));
            if !ok {
                return Err(Violation::new(
                    Invariant::S1,
                    format!(
                        "decode {}: {page} is {} for {owner}, which does not hold it",
                        self.id, rec.state
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The phase of a room use on this node: a live request, or a quarantine waiting
    /// for its drain ack; `None` otherwise.
    pub fn room_phase(&self, room: RoomKey) -> Option<DecodePhase> {
        if let Some(r) = self.requests.get(&room) {
            return Some(match &r.phase {
                Phase::Prealloc => DecodePhase::Prealloc,
                Phase::Transferring { written, .. } => DecodePhase::Transferring {
                    written: written.clone(),
                },
                Phase::Running { seq_len, step, .. } => DecodePhase::Running {
                    step: *step,
                    seq_len: *seq_len,
                },
            });
        }
        self.quarantine
            .get(&room)
            .map(|q| DecodePhase::Quarantined { retries: q.retries })
    }

    /// Every page reserved for a live room use (prompt pages first), or the pages of
    /// its quarantine.
    pub fn room_pages(&self, room: RoomKey) -> Option<Vec<PageTag>> {
        match self.requests.get(&room) {
            Some(r) => Some(r.phase.pages().to_vec()),
            None => self.quarantine.get(&room).map(|q| q.pages.clone()),
        }
    }

    /// Whether this node retired the room use (any message for it is stale).
    pub fn is_retired(&self, room: RoomKey) -> bool {
        self.is_stale(room)
    }
}

impl<G: Gpu, P: PageRecords> crate::step::Stepper<G::Kv> for DecodeNode<G, P> {
    fn handle(&mut self, input: Input<G::Kv>, out: &mut crate::env::Outbox<G::Kv>) {
        DecodeNode::handle(self, input, out);
    }
    /// The node's own memory runs the job (every driver but the hardware runtime, whose
    /// device thread runs it on the same memory).
    fn compute(&mut self, job: Job) -> Done {
        job.run(&mut self.gpu)
    }
}
