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
use crate::env::{Env, Input, Timer};
use crate::gpu::{ids, Gpu};
use crate::ids::{NodeId, PageTag, RoomKey, Token};
use crate::invariant::{Invariant, Violation};
use crate::kv::PagePool;
use crate::msg::{Msg, Status, TransferOutcome};
use crate::retired::RetiredRooms;
use crate::shared_cfg::Cfg;
use crate::trace::{ReleaseKind, Side, TraceEvent};
use std::collections::{BTreeMap, VecDeque};

/// Where a prefill request is.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Phase {
    /// Sender created; waiting for decode's page list.
    Bootstrapping,
    /// Page list known; waiting in the queue for source pages.
    Waiting,
    /// In the running batch; the forward completes at the next scheduler tick.
    Forward { pages: Vec<PageTag> },
    /// KV is being sent.
    Sending {
        pages: Vec<PageTag>,
        next_page: usize,
        in_flight: u32,
    },
    /// The transfer concluded; the scheduler polls it at the next tick.
    Inflight {
        pages: Vec<PageTag>,
        outcome: TransferOutcome,
    },
}

/// Decode's page list for a room (M5).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Meta {
    dst: Vec<PageTag>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Request {
    decode: NodeId,
    /// The prompt this node runs (the 1-token placeholder after a legacy rejection).
    prompt: Vec<Token>,
    /// A pending abort that takes effect at the next result (SGLang `to_finish`).
    to_finish: Option<Status>,
    /// The terminal reason once set (SGLang `finished_reason`).
    finished_reason: Option<Status>,
    meta: Option<Meta>,
    phase: Phase,
}

/// Writes of one room use still in flight, kept after the request retires.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
struct Outstanding {
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
    /// Page lists that arrived before their `PrefillStart` (reordering), bounded.
    early_meta: BTreeMap<RoomKey, Vec<PageTag>>,
    /// A `Compute` timer is pending (so new work does not postpone it).
    compute_armed: bool,
}

impl<G: Gpu> PrefillNode<G> {
    /// A prefill node. The pool size is the GPU's; run the pre-flight check first
    /// ([`crate::config::EngineConfig::preflight`]).
    pub fn new(id: NodeId, cfg: Cfg, router: NodeId, gpu: G) -> Self {
        let pool = PagePool::new(gpu.pages(), gpu.page_size());
        PrefillNode {
            id,
            cfg,
            router,
            pool,
            gpu,
            requests: BTreeMap::new(),
            waiting: VecDeque::new(),
            outstanding: BTreeMap::new(),
            retired: RetiredRooms::default(),
            early_meta: BTreeMap::new(),
            compute_armed: false,
        }
    }

    /// Crash and restart as incarnation `epoch`: every volatile structure (requests,
    /// queues, writes in flight, tombstones, timers) is gone, and the pool starts over,
    /// full, handing out generations of the new epoch only. KV memory is kept as it was
    /// (never zeroed, as GPU memory handed to a new process is not trusted to be), so a
    /// restarted node that read a page it had not written would read stale KV. The
    /// driver must also forget the node's pending timers and undelivered messages: they
    /// belonged to the old incarnation. `epoch` must exceed every earlier one.
    pub fn restart(&mut self, epoch: u32) {
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
            compute_armed,
        } = self;
        *pool = PagePool::with_epoch(gpu.pages(), gpu.page_size(), epoch);
        requests.clear();
        waiting.clear();
        outstanding.clear();
        retired.clear();
        early_meta.clear();
        *compute_armed = false;
    }

    fn is_stale(&self, room: RoomKey) -> bool {
        self.retired.is_stale(room)
    }

    fn tombstone(&mut self, room: RoomKey) {
        self.retired.retire(room);
        self.early_meta.remove(&room);
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

    pub fn handle<E: Env<G::Kv>>(&mut self, input: Input<G::Kv>, env: &mut E) {
        match input {
            Input::Message { from, msg } => match msg {
                Msg::PrefillStart {
                    room,
                    prompt,
                    decode,
                } => self.on_start(room, prompt, decode, env),
                Msg::KvMeta { room, dst, .. } => self.on_meta(room, dst, env),
                Msg::WriteDone { room, chunk, ok } => self.on_write_done(room, chunk, ok, env),
                Msg::Abort { room } => self.on_abort(room, Status::CLIENT_CLOSED, env),
                Msg::DrainRequest { room } => self.on_drain_request(from, room, env),
                _ => {}
            },
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env)
            }
            Input::Timer(Timer::Bootstrap(room)) => {
                if matches!(
                    self.requests.get(&room).map(|r| &r.phase),
                    Some(Phase::Bootstrapping)
                ) {
                    self.retire(room, Status::INTERNAL, env);
                }
            }
            Input::Timer(_) => {}
        }
    }

    fn kick<E: Env<G::Kv>>(&mut self, env: &mut E) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.prefill_forward_ns);
        }
    }

    fn on_start<E: Env<G::Kv>>(
        &mut self,
        room: RoomKey,
        prompt: Vec<Token>,
        decode: NodeId,
        env: &mut E,
    ) {
        if self.requests.contains_key(&room) || self.is_stale(room) {
            return; // duplicate or late delivery of a room use this node already answered
        }
        let len = prompt.len() as u64;
        let reject = |this: &mut Self, env: &mut E, status: Status, reason: String| {
            this.tombstone(room);
            env.trace(TraceEvent::Rejected {
                node: this.id,
                room,
                side: Side::Prefill,
                status,
                reason,
            });
            env.trace(TraceEvent::Responded {
                node: this.id,
                room,
                side: Side::Prefill,
                status,
            });
            env.send(this.router, Msg::PrefillFinished { room, status });
        };
        if self.requests.len() >= self.cfg.max_queue as usize {
            reject(self, env, Status::UNAVAILABLE, "prefill queue full".into());
            return;
        }
        let mut req = Request {
            decode,
            prompt,
            to_finish: None,
            finished_reason: None,
            meta: None,
            phase: Phase::Bootstrapping,
        };
        if let Some(limit) = self.cfg.admission_limit(self.pool.capacity() as u32) {
            if len > limit && self.cfg.allow_auto_truncate {
                // `validate_input_length` with truncation on: keep the head of the prompt.
                req.prompt.truncate(limit as usize);
                env.trace(TraceEvent::Truncated {
                    node: self.id,
                    room,
                    from: len,
                    to: limit,
                });
            } else if len > limit {
                if self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
                    // SGLang `set_finish_with_abort`: keep the error in `to_finish`,
                    // swap the prompt for a 1-token placeholder, stay live.
                    req.prompt = vec![0];
                    req.to_finish = Some(Status::BAD_REQUEST);
                    env.trace(TraceEvent::RejectedLegacy {
                        node: self.id,
                        room,
                        prompt_len: len,
                    });
                } else {
                    let reason =
                        format!("prompt of {len} tokens exceeds the admission limit of {limit}");
                    reject(self, env, Status::BAD_REQUEST, reason);
                    return;
                }
            }
        }
        // The bootstrap-queue gate (`PrefillBootstrapQueue.add`).
        if self.is_aborted(&req) {
            let status = req
                .to_finish
                .or(req.finished_reason)
                .unwrap_or(Status::BAD_REQUEST);
            reject(self, env, status, "rejected at intake".into());
            return;
        }
        env.trace(TraceEvent::Admitted {
            node: self.id,
            room,
            side: Side::Prefill,
            prompt_len: req.prompt.len() as u64,
        });
        self.requests.insert(room, req);
        env.set_timer(Timer::Bootstrap(room), self.cfg.timeouts.bootstrap_ns);
        if let Some(dst) = self.early_meta.remove(&room) {
            self.on_meta(room, dst, env);
        }
    }

    fn on_meta<E: Env<G::Kv>>(&mut self, room: RoomKey, dst: Vec<PageTag>, env: &mut E) {
        let Some(req) = self.requests.get_mut(&room) else {
            // Decode's page list can overtake the router's start message.
            if !self.is_stale(room) && self.early_meta.len() < self.cfg.max_queue as usize {
                self.early_meta.insert(room, dst);
            }
            return;
        };
        if req.phase != Phase::Bootstrapping {
            return;
        }
        req.meta = Some(Meta { dst });
        req.phase = Phase::Waiting;
        self.waiting.push_back(room);
        env.cancel_timer(Timer::Bootstrap(room));
        self.kick(env);
    }

    /// One pass of the scheduler loop: poll concluded transfers, finish the forward
    /// batch, then admit waiting requests into the next batch.
    fn on_tick<E: Env<G::Kv>>(&mut self, env: &mut E) {
        let concluded: Vec<RoomKey> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Inflight { .. }))
            .map(|(k, _)| *k)
            .collect();
        for room in concluded {
            self.poll_inflight(room, env);
        }
        let forwarded: Vec<RoomKey> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Forward { .. }))
            .map(|(k, _)| *k)
            .collect();
        for room in forwarded {
            self.finish_forward(room, env);
        }
        self.admit_waiting(env);
        let busy = self
            .requests
            .values()
            .any(|r| matches!(r.phase, Phase::Forward { .. } | Phase::Inflight { .. }));
        if busy {
            self.kick(env);
        }
    }

    /// `pop_bootstrapped` plus the batch admission: allocate source pages FIFO.
    fn admit_waiting<E: Env<G::Kv>>(&mut self, env: &mut E) {
        let mut batch = 0;
        while let Some(&room) = self.waiting.front() {
            if batch >= self.cfg.max_batch {
                break;
            }
            let Some(req) = self.requests.get(&room) else {
                self.waiting.pop_front();
                continue;
            };
            if req.phase != Phase::Waiting {
                self.waiting.pop_front();
                continue;
            }
            if self.is_aborted(req) {
                self.waiting.pop_front();
                let status = req
                    .to_finish
                    .or(req.finished_reason)
                    .unwrap_or(Status::INTERNAL);
                self.retire(room, status, env);
                continue;
            }
            let need = self.cfg.pages_for(req.prompt.len() as u64) as usize;
            if need > self.pool.capacity() && !self.cfg.bugs.has(Bug::AdmitBeyondPool) {
                // Can never fit: fail it now rather than let it block the queue forever.
                self.waiting.pop_front();
                self.retire(room, Status::INTERNAL, env);
                continue;
            }
            let Ok(pages) = self.pool.alloc(need, room) else {
                break;
            };
            self.waiting.pop_front();
            env.trace(TraceEvent::PagesReserved {
                node: self.id,
                room,
                pages: pages.clone(),
            });
            env.trace(TraceEvent::Running {
                node: self.id,
                room,
                side: Side::Prefill,
            });
            if let Some(r) = self.requests.get_mut(&room) {
                r.phase = Phase::Forward { pages };
            }
            batch += 1;
        }
        if batch > 0 {
            self.kick(env);
        }
    }

    /// `process_batch_result_disagg_prefill` for the last chunk.
    fn finish_forward<E: Env<G::Kv>>(&mut self, room: RoomKey, env: &mut E) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Forward { pages } = &req.phase else {
            return;
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
            self.retire(room, status, env);
            return;
        }
        let prompt = req.prompt.clone();
        self.gpu.write_tokens(&pages, 0, &prompt, room);
        if self.pool.mark_ready(room, &pages).is_err() {
            // Our own fresh allocation must be ours; anything else is an engine bug
            // that only a bug switch can cause. Fail the request loudly.
            self.retire(room, Status::INTERNAL, env);
            return;
        }
        if let Some(r) = self.requests.get_mut(&room) {
            r.phase = Phase::Sending {
                pages,
                next_page: 0,
                in_flight: 0,
            };
        }
        self.pump(room, env);
    }

    /// Issue chunk writes up to the in-flight limit; conclude when all completed.
    fn pump<E: Env<G::Kv>>(&mut self, room: RoomKey, env: &mut E) {
        let chunk_pages = self.cfg.chunk_pages as usize;
        let max_in_flight = self.cfg.max_inflight_chunks;
        let hold = !self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain)
            && self.cfg.defenses.deferred_release;
        let Some(req) = self.requests.get_mut(&room) else {
            return;
        };
        let decode = req.decode;
        let dst_all = req.meta.as_ref().map(|m| m.dst.clone()).unwrap_or_default();
        let Phase::Sending {
            pages,
            next_page,
            in_flight,
        } = &mut req.phase
        else {
            return;
        };
        // Mooncake truncates the source to the destination when decode reserved fewer
        // pages; nothing checks that the counts agree (that is decode's job).
        let to_send = pages.len().min(dst_all.len());
        while *in_flight < max_in_flight && *next_page < to_send {
            let end = (*next_page + chunk_pages).min(to_send);
            let src = pages[*next_page..end].to_vec();
            let dst = dst_all[*next_page..end].to_vec();
            if hold {
                for &t in &src {
                    // Our own Ready pages: a refusal means the record is corrupt.
                    self.pool
                        .hold(t)
                        .expect("sending room owns its source pages (S1)");
                }
            }
            let kv = src.iter().map(|t| self.gpu.read_page(t.page)).collect();
            let out = self.outstanding.entry(room).or_default();
            let chunk = out.next_chunk;
            out.next_chunk += 1;
            out.chunks
                .insert(chunk, if hold { src.clone() } else { Vec::new() });
            env.trace(TraceEvent::KvSent {
                node: self.id,
                room,
                chunk,
                src: src.clone(),
                dst: dst.clone(),
            });
            env.send(
                decode,
                Msg::KvWrite {
                    room,
                    chunk,
                    src,
                    dst,
                    kv,
                },
            );
            *next_page = end;
            *in_flight += 1;
        }
        if *in_flight == 0 && *next_page >= to_send {
            let sent_pages = pages[..to_send].to_vec();
            let tokens = req.prompt.len() as u64;
            // `is_last_chunk = curr_idx == num_kv_indices`: prefill reports its own
            // page count and token count, whatever decode reserved.
            let outcome = TransferOutcome::Success {
                tokens,
                pages: pages.len() as u32,
                checksum: self.gpu.digest(&ids(&sent_pages), tokens),
            };
            let pages = pages.clone();
            req.phase = Phase::Inflight {
                pages,
                outcome: outcome.clone(),
            };
            env.send(decode, Msg::KvDone { room, outcome });
            self.kick(env);
        }
    }

    fn on_write_done<E: Env<G::Kv>>(&mut self, room: RoomKey, chunk: u32, ok: bool, env: &mut E) {
        let Some(out) = self.outstanding.get_mut(&room) else {
            return;
        };
        let Some(held) = out.chunks.remove(&chunk) else {
            return;
        };
        if !ok {
            out.any_failed = true;
        }
        for t in held {
            // Under `prefill-release-before-drain` the page may already be gone; the
            // hold then has nothing to release.
            let _ = self.pool.unhold(t);
        }
        if let Some(req) = self.requests.get_mut(&room) {
            if let Phase::Sending { in_flight, .. } = &mut req.phase {
                *in_flight = in_flight.saturating_sub(1);
                if !ok {
                    // One failed write fails the room (M7 Failed, immediately).
                    self.fail_send(room, true, env);
                } else {
                    self.pump(room, env);
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

    fn maybe_ack_drain<E: Env<G::Kv>>(&mut self, room: RoomKey, env: &mut E) {
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
    fn on_drain_request<E: Env<G::Kv>>(&mut self, from: NodeId, room: RoomKey, env: &mut E) {
        if let Some(req) = self.requests.get_mut(&room) {
            match &req.phase {
                Phase::Sending { .. } => {
                    req.finished_reason.get_or_insert(Status::INTERNAL);
                    // Decode asked: it needs no KvDone.
                    self.fail_send(room, false, env);
                }
                Phase::Bootstrapping | Phase::Waiting | Phase::Forward { .. } => {
                    self.on_abort(room, Status::INTERNAL, env);
                }
                Phase::Inflight { .. } => {}
            }
        }
        if !self.requests.contains_key(&room) {
            self.tombstone(room);
        }
        self.outstanding.entry(room).or_default().drain_requested_by = Some(from);
        self.maybe_ack_drain(room, env);
    }

    /// An abort from the router (client gone, decode failed) or from decode.
    fn on_abort<E: Env<G::Kv>>(&mut self, room: RoomKey, status: Status, env: &mut E) {
        let Some(req) = self.requests.get_mut(&room) else {
            // Unknown: the start message is late or lost, or we already answered. Either
            // way answer (again); the router ignores duplicates, and the tombstone makes
            // a late start message harmless.
            self.tombstone(room);
            env.send(self.router, Msg::PrefillFinished { room, status });
            return;
        };
        env.trace(TraceEvent::AbortNoted {
            node: self.id,
            room,
            side: Side::Prefill,
        });
        match &req.phase {
            Phase::Bootstrapping | Phase::Waiting => {
                let knows_decode = req.meta.is_some();
                if knows_decode {
                    self.notify_decode_failed(room, env);
                }
                self.retire(room, status, env);
            }
            // Abort method 3: the running batch sees it at the next result.
            Phase::Forward { .. } => {
                req.to_finish.get_or_insert(status);
            }
            Phase::Sending { .. } => {
                req.finished_reason.get_or_insert(status);
                self.fail_send(room, true, env);
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
    fn fail_send<E: Env<G::Kv>>(&mut self, room: RoomKey, tell_decode: bool, env: &mut E) {
        let Some(req) = self.requests.get_mut(&room) else {
            return;
        };
        let Phase::Sending { pages, .. } = &mut req.phase else {
            return;
        };
        let pages = std::mem::take(pages);
        req.phase = Phase::Inflight {
            pages,
            outcome: TransferOutcome::Failed,
        };
        if tell_decode {
            self.notify_decode_failed(room, env);
        }
        self.kick(env);
    }

    fn notify_decode_failed<E: Env<G::Kv>>(&self, room: RoomKey, env: &mut E) {
        if let Some(req) = self.requests.get(&room) {
            env.send(
                req.decode,
                Msg::KvDone {
                    room,
                    outcome: TransferOutcome::Failed,
                },
            );
        }
    }

    /// `process_disagg_prefill_inflight_queue` for one concluded room.
    fn poll_inflight<E: Env<G::Kv>>(&mut self, room: RoomKey, env: &mut E) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Inflight { pages, outcome } = &req.phase else {
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
        self.retire(room, status, env);
    }

    /// `release_kv_cache` for the source pages. Held pages drain first, unless the
    /// `prefill-release-before-drain` bug frees them outright.
    fn release_source<E: Env<G::Kv>>(&mut self, room: RoomKey, pages: &[PageTag], env: &mut E) {
        let unchecked = self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain) && !self.drained(room);
        if unchecked {
            self.pool.free_unchecked(pages);
        } else if let Err(e) = self.pool.release(room, pages) {
            env.trace(TraceEvent::Fatal {
                node: self.id,
                reason: format!("release of {room}'s pages refused: {e}"),
            });
            return;
        }
        let how = if unchecked {
            ReleaseKind::Unchecked
        } else {
            ReleaseKind::Owner
        };
        env.trace(TraceEvent::PagesReleased {
            node: self.id,
            room,
            pages: pages.to_vec(),
            how,
        });
        if self.cfg.defenses.zero_on_free {
            for t in pages {
                if self
                    .pool
                    .record(t.page)
                    .is_some_and(|r| r.state == crate::kv::PageState::Free)
                {
                    self.gpu.zero_page(t.page);
                }
            }
        }
        // Freed pages may unblock the head of the waiting queue.
        if !self.waiting.is_empty() {
            self.kick(env);
        }
    }

    /// Remove the request and answer the router once.
    fn retire<E: Env<G::Kv>>(&mut self, room: RoomKey, status: Status, env: &mut E) {
        if self.requests.remove(&room).is_none() {
            return;
        }
        self.tombstone(room);
        env.cancel_timer(Timer::Bootstrap(room));
        env.trace(TraceEvent::Responded {
            node: self.id,
            room,
            side: Side::Prefill,
            status,
        });
        env.send(self.router, Msg::PrefillFinished { room, status });
        self.maybe_ack_drain(room, env);
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
}
