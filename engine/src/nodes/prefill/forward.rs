//! The prefill scheduler's tick: admit waiting requests (allocate source pages), run
//! one forward, and hand its result to the sender. It does not write KV itself.

use super::state::{Phase, PrefillNode};
use crate::bugs::Bug;
use crate::compute::{ForwardJob, Job};
use crate::env::Outbox;
use crate::gpu::{trace_write, Gpu, WriteError};
use crate::ids::RoomKey;
use crate::msg::{Status, Why};
use crate::trace::{NodeFault, Side, TraceEvent};

impl<G: Gpu> PrefillNode<G> {
    /// One pass of the scheduler loop: poll concluded transfers, finish the forward
    /// batch (one room's device work at a time, [`Self::next_forward`]), then admit
    /// waiting requests into the next batch.
    pub(super) fn on_tick(&mut self, env: &mut Outbox<G::Kv>) {
        assert!(self.batch.is_empty(), "a pass starts with none under way");
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
    pub(super) fn next_forward(&mut self, env: &mut Outbox<G::Kv>) {
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
    pub(super) fn admit_waiting(&mut self, env: &mut Outbox<G::Kv>) {
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
                if !self.cfg.bugs.has(Bug::PrefillDropsFailedPageList) {
                    self.notify_decode_failed(room, env);
                }
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
                assert!(matches!(r.phase, Phase::Forward { .. }));
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
    pub(super) fn forward_job(
        &mut self,
        room: RoomKey,
        env: &mut Outbox<G::Kv>,
    ) -> Option<ForwardJob> {
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
    pub(super) fn forwarded(
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
            assert!(matches!(r.phase, Phase::Sending { .. }));
        }
        self.send_chunks(room, env);
    }
}
