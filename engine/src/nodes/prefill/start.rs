//! A prefill request's start: intake with its length check (defense 1), the bootstrap
//! wait for decode's page list (M5), page lists that arrive early, and a drain asked
//! before the start. It does not run the forward nor send KV.

use super::state::{Meta, Phase, PrefillNode, Request};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RequestId, RoomKey, Token};
use crate::msg::{Status, Why};
use crate::trace::{Side, TraceEvent};

impl<G: Gpu> PrefillNode<G> {
    /// The router's start (M1): intake checks (queue, length, the bootstrap-queue gate),
    /// then the room waits for decode's page list (which may have arrived first).
    pub(super) fn on_start(
        &mut self,
        room: RoomKey,
        req_id: RequestId,
        prompt: Vec<Token>,
        decode: NodeId,
        env: &mut Outbox<G::Kv>,
    ) {
        let fits = (self.cfg.admission_limit(self.pool.capacity() as u32))
            .is_none_or(|limit| prompt.len() as u64 <= limit);
        if let Some(held) = self.requests.get_mut(&room) {
            // Another request's start passed the peer check only under the switch: an
            // admitted one takes the live room's bootstrap entry over, as SGLang's is
            // keyed by the room number alone. Otherwise this is a duplicate delivery.
            if held.req != req_id && fits {
                (held.req, held.prompt, held.decode) = (req_id, prompt, decode);
            }
            return;
        }
        if self.is_stale(room) {
            return; // late delivery of a room use this node already answered
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
    pub(super) fn on_bootstrap_timeout(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
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
    pub(super) fn reject_start(
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
    pub(super) fn check_length(
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
    pub(super) fn take_early_meta(
        &mut self,
        room: RoomKey,
        decode: NodeId,
        env: &mut Outbox<G::Kv>,
    ) {
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
    pub(super) fn drained_before_start(
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

    pub(super) fn on_meta(
        &mut self,
        from: NodeId,
        room: RoomKey,
        dst: Vec<PageTag>,
        env: &mut Outbox<G::Kv>,
    ) {
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
}
