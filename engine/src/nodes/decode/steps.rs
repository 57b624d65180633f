//! The decode loop's steps: one step job per tick, echo attention with the page-tag
//! check (defense 4), streamed tokens. It does not admit requests nor land KV.

use super::state::{DecodeNode, Phase};
use crate::compute::{Job, StepJob, StepOutcome};
use crate::env::Outbox;
use crate::gpu::{query_position, trace_write, Gpu, TagError, TagMismatch, WriteError};
use crate::ids::{PageTag, RoomKey, Token};
use crate::kv::PageRecords;
use crate::msg::{Msg, Status, Why};
use crate::trace::{Side, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// The scheduler pass: one decode step for every running request (up to
    /// `max_batch`), one room's device work at a time ([`Self::next_step`]).
    pub(super) fn on_tick(&mut self, env: &mut Outbox<G::Kv>) {
        assert!(self.batch.is_empty(), "a pass starts with none under way");
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
    pub(super) fn next_step(&mut self, env: &mut Outbox<G::Kv>) {
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
    pub(super) fn step_job(&self, room: RoomKey) -> Option<StepJob> {
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
    pub(super) fn stepped(
        &mut self,
        mut job: StepJob,
        outcome: StepOutcome,
        env: &mut Outbox<G::Kv>,
    ) {
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
    pub(super) fn trace_attend(&self, job: &mut StepJob, env: &mut Outbox<G::Kv>) {
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
    pub(super) fn advance(&mut self, job: &StepJob, token: Token, env: &mut Outbox<G::Kv>) {
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
            assert_eq!((*len, *at), (seq_len, step));
            *len = seq_len + 1;
            *at = step + 1;
        }
        if done {
            self.finish(room, Status::OK, None, env);
        }
    }

    /// Defense 4 refused a step: a page does not carry the reader's tag. State it (with
    /// the page's current generation) and fail the request.
    pub(super) fn tag_mismatch(
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
}
