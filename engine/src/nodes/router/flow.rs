//! What the router does with an input, whatever its policy: admit the peer, take a
//! request, start an attempt in a room, stream tokens, cancel, answer the client once,
//! retry an attempt, clear a room. A half's answer and the request timeout go to the
//! policy (`policy.rs`).

use super::state::{Answer, Answers, Attempt, Retry, RoomUse, Router};
use crate::bugs::Bug;
use crate::env::{Control, Input, Timer};
use crate::ids::{Generation, NodeId, RequestId, RoomKey, TenantId, Token};
use crate::msg::{Msg, Status, Why};
use crate::trace::{Side, TraceEvent};

impl Router {
    /// Handle one input. Drain order of effects: messages in the order sent.
    pub fn handle(&mut self, input: Input, env: &mut dyn Control) {
        match input {
            Input::Message { from, msg } => {
                let verdict = self.check_peer(from, &msg);
                if !self
                    .counters
                    .admit_peer(env, (self.id, from), &msg, verdict)
                {
                    return;
                }
                self.on_message(from, msg, env)
            }
            Input::Timer(Timer::Request(room)) => self.on_request_timeout(room, env),
            Input::Timer(_) => {}
            // Only a decode node's receiver lands writes.
            Input::Landed { .. } => {}
            // Only a decode node asks for device work yet.
            Input::Computed(_) => {}
        }
    }

    fn on_message(&mut self, from: NodeId, msg: Msg, env: &mut dyn Control) {
        {
            match msg {
                Msg::Submit {
                    req,
                    tenant,
                    prompt,
                    max_new_tokens,
                } => self.on_submit(from, req, tenant, prompt, max_new_tokens, env),
                Msg::Cancel { req } => self.on_cancel(req, env),
                Msg::PrefillFinished { room, status, why } => {
                    self.on_half(room, (status, why), Side::Prefill, env)
                }
                Msg::DecodeFinished { room, status, why } => {
                    self.on_half(room, (status, why), Side::Decode, env)
                }
                Msg::TokenOut { room, index, token } => self.on_token(room, index, token, env),
                Msg::KvParams { room, src, .. } => self.on_params(room, src, env),
                // Anything else is not for a router: ignore it rather than trust a peer.
                _ => {}
            }
        }
    }

    /// Decode's token `index` of room use `room` (the peer check admitted it from the
    /// room's decode node): kept at its index, and, the first time that index is taken
    /// for a request not yet answered nor given up, streamed to the client.
    fn on_token(&mut self, room: RoomKey, index: u32, token: Token, env: &mut dyn Control) {
        let limit = self.cfg.max_new_tokens_limit as usize;
        let Some(u) = self.slot(room) else {
            return;
        };
        let i = index as usize;
        if i >= limit {
            return;
        }
        if u.tokens.len() <= i {
            u.tokens.resize(i + 1, None);
        }
        let first = u.tokens[i].is_none();
        u.tokens[i] = Some(token);
        if first && !u.answers.client && !u.abandoned {
            env.stream(u.client, u.req, index, token);
        }
    }

    pub(super) fn respond(
        &self,
        env: &mut dyn Control,
        client: NodeId,
        req: RequestId,
        room: Option<RoomKey>,
        answer: Answer,
    ) {
        let Answer {
            status,
            tokens,
            why,
        } = answer;
        env.trace(TraceEvent::RouterResponse {
            node: self.id,
            req,
            room,
            status,
            tokens: tokens.clone(),
        });
        env.send(
            client,
            Msg::Response {
                req,
                status,
                tokens,
                why,
            },
        );
    }

    fn on_submit(
        &mut self,
        client: NodeId,
        req: RequestId,
        tenant: TenantId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
        env: &mut dyn Control,
    ) {
        if self.by_req.contains_key(&req) {
            return; // a duplicate of a live request
        }
        if max_new_tokens == 0
            || max_new_tokens > self.cfg.max_new_tokens_limit
            || prompt.is_empty()
        {
            let why = Why::InvalidRequest {
                max_new_tokens_limit: self.cfg.max_new_tokens_limit,
            };
            let answer = Answer::error(Status::BAD_REQUEST, Some(why));
            self.respond(env, client, req, None, answer);
            return;
        }
        let first = Attempt {
            client,
            req,
            tenant,
            prompt,
            max_new_tokens,
            number: 1,
        };
        if !self.start_attempt(first, None, env) {
            let answer = Answer::error(Status::UNAVAILABLE, Some(Why::NoRoom));
            self.respond(env, client, req, None, answer);
        }
    }

    /// The room use a new attempt takes: a free room at its next generation, or, for a
    /// replay under `retry-reuses-room`, the use `reuse` the given-up attempt had
    /// (taken back from the free rooms, or out of the hands of that attempt, which the
    /// router then forgets); `None` when the room table is full.
    fn open_room(&mut self, reuse: Option<RoomKey>) -> Option<RoomKey> {
        if let Some(key) = reuse {
            self.free_rooms.retain(|&r| r != key.room);
            return Some(key);
        }
        let room = self.take_room()?;
        let slot = &mut self.rooms[room.0 as usize - 1];
        slot.gen = Generation(slot.gen.0 + 1);
        Some(RoomKey {
            room,
            gen: slot.gen,
        })
    }

    /// Send one attempt of a request to a pair of halves in a new room (in `reuse`'s,
    /// see [`Router::open_room`]); `false` when the room table is full.
    pub(super) fn start_attempt(
        &mut self,
        a: Attempt,
        reuse: Option<RoomKey>,
        env: &mut dyn Control,
    ) -> bool {
        let Some(key) = self.open_room(reuse) else {
            return false;
        };
        let pick = self.next_pair as usize;
        self.next_pair = self.next_pair.wrapping_add(1);
        let prefill = self.prefills[pick % self.prefills.len()];
        let decode = self.decodes[pick % self.decodes.len()];
        let retries = self.retries() || self.cfg.router.sequential();
        let sequential = self.cfg.router.sequential();
        let slot = &mut self.rooms[key.room.0 as usize - 1];
        let retry = retries.then(|| Retry {
            tenant: a.tenant,
            prompt: a.prompt.clone(),
        });
        slot.live = Some(RoomUse {
            req: a.req,
            client: a.client,
            prefill,
            decode,
            answers: Answers::default(),
            prefill_why: None,
            decode_why: None,
            max_new_tokens: a.max_new_tokens,
            tokens: Vec::new(),
            attempt: a.number,
            retry,
            abandoned: false,
            decode_started: !sequential,
            params: None,
        });
        self.by_req.insert(a.req, key);
        env.trace(TraceEvent::Routed {
            node: self.id,
            req: a.req,
            tenant: a.tenant,
            room: key,
            prefill,
            decode,
            prompt_len: a.prompt.len() as u64,
            max_new_tokens: a.max_new_tokens,
        });
        if !sequential {
            let (req, prompt, max_new_tokens) = (a.req, a.prompt.clone(), a.max_new_tokens);
            let start = Msg::DecodeStart {
                room: key,
                req,
                prompt,
                max_new_tokens,
                prefill,
            };
            env.send(decode, start);
        }
        env.send(
            prefill,
            Msg::PrefillStart {
                room: key,
                req: a.req,
                prompt: a.prompt,
                decode,
            },
        );
        env.set_timer(Timer::Request(key), self.cfg.timeouts.request_ns);
        true
    }

    fn on_cancel(&mut self, req: RequestId, env: &mut dyn Control) {
        let Some(&key) = self.by_req.get(&req) else {
            return;
        };
        let one_half = self.cfg.bugs.has(Bug::RouterCancelsOneHalf);
        let Some(u) = self.slot(key) else { return };
        if u.answers.client {
            return;
        }
        u.answers.client = true;
        let (client, prefill, decode) = (u.client, u.prefill, u.decode);
        let (p_open, d_open) = u.open();
        self.respond(
            env,
            client,
            req,
            Some(key),
            Answer::error(Status::CLIENT_CLOSED, None),
        );
        if p_open {
            env.send(prefill, Msg::Abort { room: key });
        }
        // mini_lb before #29017 aborted prefill only and left decode waiting.
        if d_open && !one_half {
            env.send(decode, Msg::Abort { room: key });
        }
    }

    /// The next attempt of the request `key` serves, if it has one left.
    pub(super) fn next_attempt(&self, key: RoomKey) -> Option<Attempt> {
        let slot = self.rooms.get((key.room.0 as usize).checked_sub(1)?)?;
        let u = slot.live.as_ref()?;
        let r = u.retry.as_ref()?;
        (u.attempt < self.max_attempts()).then(|| Attempt {
            client: u.client,
            req: u.req,
            tenant: r.tenant,
            prompt: r.prompt.clone(),
            max_new_tokens: u.max_new_tokens,
            number: u.attempt + 1,
        })
    }

    /// Give up the attempt in `key` (answered `status`) and start `next`; a full room
    /// table answers the client 503.
    pub(super) fn retry(
        &mut self,
        key: RoomKey,
        status: Status,
        next: Attempt,
        env: &mut dyn Control,
    ) {
        env.trace(TraceEvent::RouterRetried {
            node: self.id,
            req: next.req,
            room: key,
            status,
            attempt: next.number,
        });
        if self.by_req.get(&next.req) == Some(&key) {
            self.by_req.remove(&next.req);
        }
        let (client, req) = (next.client, next.req);
        // The replay: the room drawn once for the request, kept for every attempt.
        let reuse = self.cfg.bugs.has(Bug::RetryReusesRoom).then_some(key);
        if !self.start_attempt(next, reuse, env) {
            let answer = Answer::error(Status::UNAVAILABLE, Some(Why::NoRoom));
            self.respond(env, client, req, Some(key), answer);
        }
    }

    pub(super) fn clear(&mut self, key: RoomKey, env: &mut dyn Control) {
        let idx = key.room.0 as usize - 1;
        if let Some(u) = self.rooms[idx].live.take() {
            // An abandoned attempt's request may be served by a newer one.
            if self.by_req.get(&u.req) == Some(&key) {
                self.by_req.remove(&u.req);
            }
        }
        self.free_rooms.push(key.room);
        env.cancel_timer(Timer::Request(key));
        env.trace(TraceEvent::RoomCleared {
            node: self.id,
            room: key,
        });
    }

    /// After the request timeout: keep asking both halves to abort until they answered
    /// (an abort may have been lost; a closed connection is noticed, however late), and
    /// set the request timer again.
    pub(super) fn keep_asking(&mut self, key: RoomKey, env: &mut dyn Control) {
        let request_ns = self.cfg.timeouts.request_ns;
        let Some(u) = self.slot(key) else { return };
        let (prefill, decode) = (u.prefill, u.decode);
        let (p_open, d_open) = u.open();
        if p_open {
            env.send(prefill, Msg::Abort { room: key });
        }
        if d_open {
            env.send(decode, Msg::Abort { room: key });
        }
        env.set_timer(Timer::Request(key), request_ns);
    }
}
