//! The vLLM prefill node's entry: the peer check, intake, the scheduler tick that runs
//! one forward a tick, and its answer to the router.

use super::state::{Phase, Request, VllmPrefill};
use crate::compute::{Done, ForwardJob, Job};
use crate::env::{Input, Outbox, Timer};
use crate::gpu::{trace_write, Gpu};
use crate::ids::{NodeId, RequestId, RoomKey, Token};
use crate::msg::{only_router, Msg, Status, Why};
use crate::trace::{Side, TraceEvent};
use std::collections::BTreeSet;

impl<G: Gpu> VllmPrefill<G> {
    /// The router starts and aborts rooms; a room's notification and heartbeats are
    /// believed only from the decode node its start named.
    fn check_peer(&self, from: NodeId, msg: &Msg) -> Result<(), String> {
        match msg {
            Msg::PrefillStart { .. } | Msg::Abort { .. } if from != self.router => {
                Err(only_router(self.router, from))
            }
            Msg::ReadNotify { room, .. } | Msg::Heartbeat { room } => {
                match self.requests.get(room).map(|r| r.decode) {
                    Some(d) if d != from => Err(format!("{room}'s decode node is {d}")),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    pub fn handle(&mut self, input: Input, env: &mut Outbox<G::Kv>) {
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
                    Msg::Abort { room } => self.on_abort(room, env),
                    Msg::ReadNotify { room, rank } => self.on_notify(room, rank, env),
                    Msg::Heartbeat { room } => self.renew(room, env),
                    _ => {}
                }
            }
            Input::Timer(Timer::Compute) => {
                self.compute_armed = false;
                self.on_tick(env);
            }
            Input::Timer(Timer::Lease(room)) => self.lease_ended(room, true, env),
            Input::Timer(_) | Input::Landed { .. } => {}
            Input::Computed(Done::Forward { job, written }) => {
                self.forwarded(job, written, env);
                self.on_tick(env);
            }
            Input::Computed(Done::DecodeStep { .. }) => {}
        }
    }

    fn on_start(
        &mut self,
        room: RoomKey,
        req: RequestId,
        prompt: Vec<Token>,
        decode: NodeId,
        env: &mut Outbox<G::Kv>,
    ) {
        if self.requests.contains_key(&room) || self.retired.is_stale(room) {
            return;
        }
        let len = prompt.len() as u64;
        let limit = self.cfg.admission_limit(self.pool.capacity() as u32);
        let refusal = if self.requests.len() >= self.cfg.max_queue as usize {
            Some((
                Status::UNAVAILABLE,
                Why::QueueFull {
                    side: Side::Prefill,
                },
            ))
        } else if let Some(limit) = limit.filter(|&l| len > l) {
            let why = Why::PromptTooLong { tokens: len, limit };
            Some((Status::BAD_REQUEST, why))
        } else {
            None
        };
        if let Some((status, why)) = refusal {
            let (node, side, reason) = (self.id, Side::Prefill, why.to_string());
            env.trace(TraceEvent::Rejected {
                node,
                room,
                side,
                status,
                reason,
            });
            self.answer(room, status, Some(why), env);
            return;
        }
        env.trace(TraceEvent::Admitted {
            node: self.id,
            room,
            req,
            side: Side::Prefill,
            prompt_len: len,
        });
        let phase = Phase::Waiting;
        let r = Request {
            req,
            decode,
            prompt,
            phase,
        };
        self.requests.insert(room, r);
        self.waiting.push_back(room);
        self.arm_compute(env);
    }

    pub(super) fn arm_compute(&mut self, env: &mut Outbox<G::Kv>) {
        if !self.compute_armed {
            self.compute_armed = true;
            env.set_timer(Timer::Compute, self.cfg.latencies.prefill_forward_ns);
        }
    }

    /// The scheduler's pass: pages for the waiting rooms, FIFO, then one forward.
    fn on_tick(&mut self, env: &mut Outbox<G::Kv>) {
        while let Some(&room) = self.waiting.front() {
            let Some(r) = self.requests.get(&room) else {
                self.waiting.pop_front();
                continue;
            };
            let need = self.cfg.pages_for(r.prompt.len() as u64) as usize;
            let Ok(pages) = self.pool.alloc(need, room) else {
                break;
            };
            self.waiting.pop_front();
            self.flush(env);
            if let Some(r) = self.requests.get_mut(&room) {
                r.phase = Phase::Forward { pages };
            }
        }
        let next = self.requests.iter().find_map(|(room, r)| match &r.phase {
            Phase::Forward { pages } => Some(ForwardJob {
                room: *room,
                pages: pages.clone(),
                prompt: r.prompt.clone(),
            }),
            _ => None,
        });
        if let Some(job) = next {
            let (node, room, side) = (self.id, job.room, Side::Prefill);
            env.trace(TraceEvent::Running { node, room, side });
            env.compute(Job::Forward(job));
        }
    }

    /// What the device did with a forward: the pages go under a lease and the router
    /// gets the reply's `kv_transfer_params` and 200; a refused or failed write fails
    /// the request.
    fn forwarded(
        &mut self,
        job: ForwardJob,
        written: Result<(), crate::gpu::WriteError>,
        env: &mut Outbox<G::Kv>,
    ) {
        let ForwardJob {
            room,
            pages,
            prompt,
        } = job;
        let (at, ps) = ((&pages[..], 0), self.cfg.page_size);
        let written = trace_write(env, (self.id, room), at, &prompt, ps, written);
        if written.is_err() || self.pool.mark_ready(room, &pages).is_err() {
            self.release(room, &pages, env);
            self.requests.remove(&room);
            self.answer(room, Status::INTERNAL, None, env);
            return;
        }
        self.flush(env);
        let tokens = prompt.len() as u64;
        let src = pages.clone();
        if let Some(r) = self.requests.get_mut(&room) {
            r.phase = Phase::Leased {
                pages,
                notified: BTreeSet::new(),
            };
        }
        let node = self.id;
        env.trace(TraceEvent::Leased {
            node,
            room,
            pages: src.clone(),
        });
        env.set_timer(Timer::Lease(room), self.cfg.timeouts.lease_ns);
        env.send(self.router, Msg::KvParams { room, src, tokens });
        self.answer(room, Status::OK, None, env);
    }

    /// Answer the router for `room`, once (a repeat repeats the first answer).
    pub(super) fn answer(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        let from = (self.id, self.router, Side::Prefill);
        self.retired
            .answer_once(env, from, room, (status, why), &self.requests);
    }

    /// Trace the page changes the pool journaled since the last call, in order.
    pub(super) fn flush(&mut self, env: &mut Outbox<G::Kv>) {
        let id = self.id;
        for c in self.pool.take_changes() {
            env.trace(c.into_event(id, None));
        }
    }
}

impl<G: Gpu> crate::step::Stepper<G::Kv> for VllmPrefill<G> {
    fn handle(&mut self, input: Input, out: &mut Outbox<G::Kv>) {
        VllmPrefill::handle(self, input, out);
    }
    fn compute(&mut self, job: Job) -> Done {
        job.run(&mut self.gpu)
    }
}
