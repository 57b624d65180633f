//! A decode request's admission: intake with its own length check, then the prealloc
//! queue (reserve pages for the prompt plus the reply, send the page list, M5). It
//! does not land KV nor run the decode loop.

use super::state::{DecodeNode, Phase, Request};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RequestId, RoomKey};
use crate::kv::PageRecords;
use crate::msg::{Msg, Status, Why};
use crate::trace::{Side, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// The router's start: intake checks (a stopped node, the queue, the length), then
    /// the room waits in the prealloc queue for its pages.
    pub(super) fn on_start(
        &mut self,
        room: RoomKey,
        req: RequestId,
        prompt_len: u64,
        max_new_tokens: u32,
        (prefill, remote): (NodeId, Option<Vec<PageTag>>),
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
                req,
                prefill,
                remote,
                prompt_len,
                max_new_tokens,
                phase: Phase::Prealloc,
            },
        );
        self.prealloc.push_back(room);
        self.start_heartbeat(room, env);
        self.try_prealloc(env);
    }

    /// Refuse a start at intake, stating `reason`, and answer once with `why`.
    pub(super) fn reject_start(
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
    pub(super) fn check_length(
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
    pub(super) fn try_prealloc(&mut self, env: &mut Outbox<G::Kv>) {
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
            let remote = req.remote.clone();
            self.flush(env, None);
            if let Some(r) = self.requests.get_mut(&room) {
                assert_eq!(r.phase, Phase::Prealloc);
                r.phase = Phase::Transferring { pages, dst_pages };
            }
            if let Some(src) = remote {
                self.post_read(room, prefill, src, dst, env);
                continue;
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
}
