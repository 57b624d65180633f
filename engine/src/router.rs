//! `Router`: pairs each client request with one prefill and one decode node.
//!
//! Like SGLang's mini_lb it assigns a bootstrap room and sends the same request to
//! both halves concurrently, then answers the client once: with the first error
//! either half reports, or with decode's tokens when decode finishes. Unlike mini_lb
//! before #29017 it cancels both halves on any abort, disconnect or failure
//! (defense 6). It owns no pages and does no I/O: inputs arrive through
//! [`Router::handle`], effects leave through the [`Env`].
//!
//! Room numbers come from a bounded table and are reused LIFO; each reuse bumps the
//! room's generation, so a late message for an earlier use is recognisably stale.
//!
//! Two policies ([`RouterPolicy`]): the careful one above, and `sglang-router`, the
//! observable behaviour of SGLang's gateway 0.3.2 (`src/routers/http/pd_router.rs`,
//! `src/core/retry.rs` of sgl-project/sglang): no cancel of the other half, up to
//! five attempts on a retryable status, each in a new room drawn at random from the
//! free rooms with the router's own seeded generator (the real router draws a random
//! room in 0..2^63; a table keeps the nodes' per-room memory bounded), decode's answer
//! or prefill's error. An attempt the router gave up (its request timeout closed the
//! connections) stays in the table, abandoned, until both its halves answered.
//!
//! Invariant: every request the router accepted gets exactly one `Response`; a room is
//! reused only after both halves reported a terminal status for it.

use crate::bugs::Bug;
use crate::config::RouterPolicy;
use crate::counters::Counters;
use crate::env::{Env, Input, Timer};
use crate::ids::{Generation, NodeId, RequestId, RoomId, RoomKey, TenantId, Token};
use crate::invariant::{Invariant, Violation};
use crate::msg::{Msg, Status, Why};
use crate::shared_cfg::Cfg;
use crate::trace::{Side, TraceEvent};
use std::collections::BTreeMap;

/// One use of a room.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RoomUse {
    req: RequestId,
    client: NodeId,
    prefill: NodeId,
    decode: NodeId,
    answers: Answers,
    /// `sglang-router`: each half's reason for its error, as it reported it, kept
    /// until both halves answered. The careful router answers the first error at once,
    /// and keeps decode's reason only while that error waits for prefill's answer
    /// ([`waits_for_its_cause`]).
    prefill_why: Option<Why>,
    decode_why: Option<Why>,
    /// The reply length the request asked for: a 200 with fewer tokens (the tail of
    /// the stream still in flight, or lost) is an error, never a shorter reply.
    max_new_tokens: u32,
    tokens: Vec<Option<Token>>,
    /// `sglang-router`: which attempt of the request this is (1 to 5), and what a
    /// retry needs to send the request again.
    attempt: u32,
    retry: Option<Retry>,
    /// `sglang-router`: the router gave this attempt up (its timeout closed the
    /// connections); no answer of it reaches the client.
    abandoned: bool,
}

/// Where a room use's answers stand: each half's terminal status once reported, and
/// whether the client has had its one answer. One value, read and changed together.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
struct Answers {
    /// The client has had its one answer.
    client: bool,
    prefill: Option<Status>,
    decode: Option<Status>,
}

impl Answers {
    /// Record `side`'s terminal status; `false` for a duplicate (the first one stays).
    fn record(&mut self, side: Side, status: Status) -> bool {
        let mine = match side {
            Side::Prefill => &mut self.prefill,
            Side::Decode => &mut self.decode,
        };
        if mine.is_some() {
            return false;
        }
        *mine = Some(status);
        debug_assert!(self.reported(side));
        true
    }

    /// Has `side` reported its terminal status?
    fn reported(&self, side: Side) -> bool {
        match side {
            Side::Prefill => self.prefill.is_some(),
            Side::Decode => self.decode.is_some(),
        }
    }

    /// Which halves have not reported yet: `(prefill, decode)`.
    fn open(&self) -> (bool, bool) {
        (self.prefill.is_none(), self.decode.is_none())
    }
}

/// The careful router answers a request's first error, unless it is decode failing a
/// transfer prefill reported failed (`Why::TransferFailed`) while prefill has not
/// answered: that is a consequence, and prefill's answer, which follows as prefill
/// concludes (or the request timeout), is the cause the client gets (a prompt refused
/// at intake is a 400, not decode's 500). Prefill is not aborted meanwhile: an abort
/// would make its answer a 499.
fn waits_for_its_cause(u: &RoomUse, side: Side, status: Status, why: Option<Why>) -> bool {
    side == Side::Decode
        && !status.is_ok()
        && why == Some(Why::TransferFailed)
        && !u.answers.reported(Side::Prefill)
        && !u.answers.client
}

/// The other half.
fn other_side(side: Side) -> Side {
    match side {
        Side::Prefill => Side::Decode,
        Side::Decode => Side::Prefill,
    }
}

/// What a new attempt of a request needs (kept only under `sglang-router`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Retry {
    tenant: TenantId,
    prompt: Vec<Token>,
}

/// One attempt of a request, as the router sends it.
struct Attempt {
    client: NodeId,
    req: RequestId,
    tenant: TenantId,
    prompt: Vec<Token>,
    max_new_tokens: u32,
    /// 1 for the first attempt.
    number: u32,
}

/// The most attempts `sglang-router` makes for one request (`max_retries` 5, counted
/// as attempts in all by `RetryExecutor::execute_response_with_retry`).
pub const SGLANG_MAX_ATTEMPTS: u32 = 5;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RoomSlot {
    gen: Generation,
    live: Option<RoomUse>,
}

/// One live room use as the router sees it, for tests and drivers
/// ([`Router::room_state`]; read-only, the router never reads it back).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouterRoomState {
    pub req: RequestId,
    pub client: NodeId,
    pub prefill: NodeId,
    pub decode: NodeId,
    /// The client has had its one answer.
    pub answered: bool,
    /// The prefill half's terminal status, once reported.
    pub prefill_status: Option<Status>,
    /// The decode half's terminal status, once reported.
    pub decode_status: Option<Status>,
    /// Token slots received so far (`None`: a gap, still in flight).
    pub tokens: Vec<Option<Token>>,
}

/// The router state machine.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Router {
    id: NodeId,
    cfg: Cfg,
    prefills: Vec<NodeId>,
    decodes: Vec<NodeId>,
    rooms: Vec<RoomSlot>,
    /// Free room numbers; the last one is reused first.
    free_rooms: Vec<RoomId>,
    by_req: BTreeMap<RequestId, RoomKey>,
    /// Round-robin cursor over the prefill and decode lists.
    next_pair: u32,
    /// The state of the router's own generator (splitmix64, seeded by
    /// `router_seed`): the random room of each `sglang-router` attempt.
    rng: u64,
    counters: Counters,
}

/// splitmix64: one step of the router's seeded generator.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The client's one answer: its status, the reply's tokens (a 200) and the engine's
/// reason (an error, where the engine has one).
struct Answer {
    status: Status,
    tokens: Vec<Token>,
    why: Option<Why>,
}

impl Answer {
    fn error(status: Status, why: Option<Why>) -> Self {
        Answer {
            status,
            tokens: Vec::new(),
            why,
        }
    }
}

/// The client's answer when a half answers `status` (for the reason `why`): an error
/// as it is; a 200 with every token of the reply, or 500 when a token is missing (a gap
/// in the stream, or fewer than asked), never a silently shorter reply.
fn reply(u: &RoomUse, status: Status, why: Option<Why>) -> Answer {
    if !status.is_ok() {
        return Answer::error(status, why);
    }
    let tokens: Vec<Token> = if u.tokens.iter().all(Option::is_some) {
        u.tokens.iter().map(|t| t.unwrap_or(0)).collect()
    } else {
        Vec::new()
    };
    if tokens.len() == u.tokens.len() && tokens.len() == u.max_new_tokens as usize {
        Answer {
            status,
            tokens,
            why: None,
        }
    } else {
        Answer::error(Status::INTERNAL, None)
    }
}

impl Router {
    pub fn new(id: NodeId, cfg: Cfg, prefills: Vec<NodeId>, decodes: Vec<NodeId>) -> Self {
        assert!(
            !prefills.is_empty() && !decodes.is_empty(),
            "topology validated by the driver"
        );
        let rooms = (0..cfg.max_rooms)
            .map(|_| RoomSlot {
                gen: Generation(0),
                live: None,
            })
            .collect();
        // Room 0 would look like SGLang's "not ready" aux value; start at 1.
        let free_rooms = (1..=cfg.max_rooms).rev().map(RoomId).collect();
        let rng = cfg.router_seed;
        Router {
            id,
            cfg,
            prefills,
            decodes,
            rooms,
            free_rooms,
            by_req: BTreeMap::new(),
            next_pair: 0,
            rng,
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Peer identity: a half's status and tokens about a room are believed only from
    /// the node the room was sent to, and a cancel only from the client that submitted
    /// the request. Anything about a room this router does not have live moves nothing.
    fn check_peer<K>(&self, from: NodeId, msg: &Msg<K>) -> Result<(), String> {
        let live = |room: &RoomKey| {
            let slot = self.rooms.get((room.room.0 as usize).checked_sub(1)?)?;
            if slot.gen != room.gen {
                return None;
            }
            slot.live.as_ref()
        };
        match msg {
            Msg::PrefillFinished { room, .. } => match live(room) {
                Some(u) if u.prefill != from => {
                    Err(format!("{room}'s prefill node is {}", u.prefill))
                }
                _ => Ok(()),
            },
            Msg::DecodeFinished { room, .. } | Msg::TokenOut { room, .. } => match live(room) {
                Some(u) if u.decode != from => Err(format!("{room}'s decode node is {}", u.decode)),
                _ => Ok(()),
            },
            Msg::Cancel { req } => match self.by_req.get(req).and_then(live) {
                Some(u) if u.client != from => Err(format!("{req} was submitted by {}", u.client)),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Rooms currently in use.
    pub fn live_rooms(&self) -> usize {
        self.rooms.iter().filter(|r| r.live.is_some()).count()
    }

    /// Rooms of attempts the router gave up (`sglang-router`) whose halves have not
    /// both answered yet.
    pub fn abandoned_rooms(&self) -> usize {
        self.rooms
            .iter()
            .filter(|r| r.live.as_ref().is_some_and(|u| u.abandoned))
            .count()
    }

    fn slot(&mut self, key: RoomKey) -> Option<&mut RoomUse> {
        let slot = self.rooms.get_mut((key.room.0 as usize).checked_sub(1)?)?;
        if slot.gen != key.gen {
            return None;
        }
        slot.live.as_mut()
    }

    /// Handle one input. Drain order of effects: messages in the order sent.
    pub fn handle<K, E: Env<K>>(&mut self, input: Input<K>, env: &mut E) {
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

    fn on_message<K, E: Env<K>>(&mut self, from: NodeId, msg: Msg<K>, env: &mut E) {
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
                    self.on_half(room, status, why, Side::Prefill, env)
                }
                Msg::DecodeFinished { room, status, why } => {
                    self.on_half(room, status, why, Side::Decode, env)
                }
                Msg::TokenOut { room, index, token } => {
                    let limit = self.cfg.max_new_tokens_limit as usize;
                    if let Some(u) = self.slot(room) {
                        let i = index as usize;
                        if i < limit {
                            if u.tokens.len() <= i {
                                u.tokens.resize(i + 1, None);
                            }
                            u.tokens[i] = Some(token);
                        }
                    }
                }
                // Anything else is not for a router: ignore it rather than trust a peer.
                _ => {}
            }
        }
    }

    fn respond<K, E: Env<K>>(
        &self,
        env: &mut E,
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

    fn on_submit<K, E: Env<K>>(
        &mut self,
        client: NodeId,
        req: RequestId,
        tenant: TenantId,
        prompt: Vec<Token>,
        max_new_tokens: u32,
        env: &mut E,
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
        if !self.start_attempt(first, env) {
            let answer = Answer::error(Status::UNAVAILABLE, Some(Why::NoRoom));
            self.respond(env, client, req, None, answer);
        }
    }

    /// A free room for a new attempt: the last freed one (careful), or one drawn at
    /// random from the free rooms (`sglang-router`: a new random room every attempt).
    fn take_room(&mut self) -> Option<RoomId> {
        match self.cfg.router {
            RouterPolicy::Careful => self.free_rooms.pop(),
            RouterPolicy::SglangRouter => {
                if self.free_rooms.is_empty() {
                    return None;
                }
                let i = splitmix(&mut self.rng) % self.free_rooms.len() as u64;
                Some(self.free_rooms.remove(i as usize))
            }
        }
    }

    /// Send one attempt of a request to a pair of halves in a new room; `false` when
    /// the room table is full.
    fn start_attempt<K, E: Env<K>>(&mut self, a: Attempt, env: &mut E) -> bool {
        let Some(room) = self.take_room() else {
            return false;
        };
        let pick = self.next_pair as usize;
        self.next_pair = self.next_pair.wrapping_add(1);
        let prefill = self.prefills[pick % self.prefills.len()];
        let decode = self.decodes[pick % self.decodes.len()];
        let slot = &mut self.rooms[room.0 as usize - 1];
        slot.gen = Generation(slot.gen.0 + 1);
        let key = RoomKey {
            room,
            gen: slot.gen,
        };
        let retry = (self.cfg.router == RouterPolicy::SglangRouter).then(|| Retry {
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
        env.send(
            decode,
            Msg::DecodeStart {
                room: key,
                req: a.req,
                prompt: a.prompt.clone(),
                max_new_tokens: a.max_new_tokens,
                prefill,
            },
        );
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

    fn on_cancel<K, E: Env<K>>(&mut self, req: RequestId, env: &mut E) {
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
        let (p_open, d_open) = u.answers.open();
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

    fn on_half<K, E: Env<K>>(
        &mut self,
        key: RoomKey,
        status: Status,
        why: Option<Why>,
        side: Side,
        env: &mut E,
    ) {
        if self.cfg.router == RouterPolicy::SglangRouter {
            return self.sglang_on_half(key, status, why, side, env);
        }
        let propagate =
            self.cfg.defenses.router_cancels_both && !self.cfg.bugs.has(Bug::RouterCancelsOneHalf);
        let Some(u) = self.slot(key) else { return };
        if !u.answers.record(side, status) {
            return; // duplicate
        }
        if waits_for_its_cause(u, side, status, why) {
            u.decode_why = why;
            return;
        }
        let mut answer = None;
        if !u.answers.client && (!status.is_ok() || side == Side::Decode || !u.answers.open().1) {
            // Prefill's 200 after decode's deferred error answers with that error.
            let (status, why) = match (side, u.answers.decode) {
                (Side::Prefill, Some(d)) if status.is_ok() => (d, u.decode_why),
                _ => (status, why),
            };
            u.answers.client = true;
            answer = Some((u.client, u.req, reply(u, status, why)));
        }
        let other_open = !u.answers.reported(other_side(side));
        let other = match side {
            Side::Prefill => u.decode,
            Side::Decode => u.prefill,
        };
        let (p_open, d_open) = u.answers.open();
        let both_done = !p_open && !d_open;
        if let Some((client, req, a)) = answer {
            self.respond(env, client, req, Some(key), a);
        }
        let failed = !status.is_ok() || self.cfg.bugs.has(Bug::AbortAfterSuccess);
        if failed && other_open && propagate {
            env.send(other, Msg::Abort { room: key });
        }
        if both_done {
            self.clear(key, env);
        }
    }

    /// `sglang-router`: wait for both halves, never cancel one; then answer with
    /// decode's reply (prefill's error when only prefill failed), or retry a retryable
    /// status in a new room while attempts are left.
    fn sglang_on_half<K, E: Env<K>>(
        &mut self,
        key: RoomKey,
        status: Status,
        why: Option<Why>,
        side: Side,
        env: &mut E,
    ) {
        let Some(u) = self.slot(key) else { return };
        if !u.answers.record(side, status) {
            return; // duplicate
        }
        if !status.is_ok() {
            *(match side {
                Side::Prefill => &mut u.prefill_why,
                Side::Decode => &mut u.decode_why,
            }) = why;
        }
        let (Some(p), Some(d)) = (u.answers.prefill, u.answers.decode) else {
            return;
        };
        let decided = !u.answers.client && !u.abandoned;
        u.answers.client = true;
        let answer = match (p.is_ok(), d.is_ok()) {
            (_, false) => Answer::error(d, u.decode_why),
            (false, true) => Answer::error(p, u.prefill_why),
            (true, true) => reply(u, d, None),
        };
        let (client, req, status) = (u.client, u.req, answer.status);
        let next = self
            .next_attempt(key)
            .filter(|_| decided && status.is_retryable());
        // The answer names its room, so it goes out before the room is cleared.
        if decided && next.is_none() {
            self.respond(env, client, req, Some(key), answer);
        }
        self.clear(key, env);
        if let Some(a) = next {
            self.retry(key, status, a, env);
        }
    }

    /// The next attempt of the request `key` serves, if it has one left.
    fn next_attempt(&self, key: RoomKey) -> Option<Attempt> {
        let slot = self.rooms.get((key.room.0 as usize).checked_sub(1)?)?;
        let u = slot.live.as_ref()?;
        let r = u.retry.as_ref()?;
        (u.attempt < SGLANG_MAX_ATTEMPTS).then(|| Attempt {
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
    fn retry<K, E: Env<K>>(&mut self, key: RoomKey, status: Status, next: Attempt, env: &mut E) {
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
        if !self.start_attempt(next, env) {
            let answer = Answer::error(Status::UNAVAILABLE, Some(Why::NoRoom));
            self.respond(env, client, req, Some(key), answer);
        }
    }

    fn on_request_timeout<K, E: Env<K>>(&mut self, key: RoomKey, env: &mut E) {
        let request_ns = self.cfg.timeouts.request_ns;
        let sglang = self.cfg.router == RouterPolicy::SglangRouter;
        let Some(u) = self.slot(key) else { return };
        let first = !u.answers.client && !u.abandoned;
        // `sglang-router`: the attempt's HTTP requests time out, which closes both
        // connections (each node aborts its half) and is retried as a 502.
        let give_up = first && sglang;
        if give_up {
            u.abandoned = true;
        } else {
            u.answers.client = true;
        }
        let (client, req, prefill, decode) = (u.client, u.req, u.prefill, u.decode);
        let (p_open, d_open) = u.answers.open();
        if first && !sglang {
            let answer = Answer::error(Status::INTERNAL, Some(Why::Timeout));
            self.respond(env, client, req, Some(key), answer);
        }
        // Keep asking until both halves have answered: an abort may have been lost (a
        // closed connection is noticed, however late).
        if p_open {
            env.send(prefill, Msg::Abort { room: key });
        }
        if d_open {
            env.send(decode, Msg::Abort { room: key });
        }
        env.set_timer(Timer::Request(key), request_ns);
        if give_up {
            match self.next_attempt(key) {
                Some(a) => self.retry(key, Status::BAD_GATEWAY, a, env),
                None => {
                    self.by_req.remove(&req);
                    let answer = Answer::error(Status::BAD_GATEWAY, Some(Why::Timeout));
                    self.respond(env, client, req, Some(key), answer);
                }
            }
        }
    }

    fn clear<K, E: Env<K>>(&mut self, key: RoomKey, env: &mut E) {
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

    /// Room table and request index agree; free rooms are not live.
    pub fn invariants(&self) -> Result<(), Violation> {
        for &r in &self.free_rooms {
            if self.rooms[r.0 as usize - 1].live.is_some() {
                return Err(Violation::new(
                    Invariant::L2,
                    format!("{r} is both free and live"),
                ));
            }
        }
        let live = self.live_rooms();
        let indexed = self
            .rooms
            .iter()
            .filter(|r| r.live.as_ref().is_some_and(|u| !u.abandoned))
            .count();
        if live + self.free_rooms.len() != self.rooms.len() || self.by_req.len() != indexed {
            return Err(Violation::new(
                Invariant::L2,
                format!(
                    "router rooms: {live} live, {} free, {} indexed",
                    self.free_rooms.len(),
                    self.by_req.len()
                ),
            ));
        }
        Ok(())
    }

    /// The live use `room` names, `None` when the room is free or has moved on to a
    /// later generation.
    pub fn room_state(&self, room: RoomKey) -> Option<RouterRoomState> {
        let slot = self.rooms.get((room.room.0 as usize).checked_sub(1)?)?;
        if slot.gen != room.gen {
            return None;
        }
        let u = slot.live.as_ref()?;
        Some(RouterRoomState {
            req: u.req,
            client: u.client,
            prefill: u.prefill,
            decode: u.decode,
            answered: u.answers.client,
            prefill_status: u.answers.prefill,
            decode_status: u.answers.decode,
            tokens: u.tokens.clone(),
        })
    }

    /// The live room use serving a request.
    pub fn room_of(&self, req: RequestId) -> Option<RoomKey> {
        self.by_req.get(&req).copied()
    }
}

impl<K> crate::step::Stepper<K> for Router {
    fn handle(&mut self, input: Input<K>, out: &mut crate::env::Outbox<K>) {
        Router::handle(self, input, out);
    }
    fn compute(&mut self, job: crate::compute::Job) -> crate::compute::Done {
        unreachable!("the router has no device: {job:?}")
    }
}
