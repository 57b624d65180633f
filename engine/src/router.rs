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
//! Invariant: every request the router accepted gets exactly one `Response`; a room is
//! reused only after both halves reported a terminal status for it.

use crate::bugs::Bug;
use crate::counters::Counters;
use crate::env::{Env, Input, Timer};
use crate::ids::{Generation, NodeId, RequestId, RoomId, RoomKey, TenantId, Token};
use crate::invariant::{Invariant, Violation};
use crate::msg::{Msg, Status};
use crate::shared_cfg::Cfg;
use crate::trace::TraceEvent;
use std::collections::BTreeMap;

/// One use of a room.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RoomUse {
    req: RequestId,
    client: NodeId,
    prefill: NodeId,
    decode: NodeId,
    answered: bool,
    prefill_status: Option<Status>,
    decode_status: Option<Status>,
    /// The reply length the request asked for: a 200 with fewer tokens (the tail of
    /// the stream still in flight, or lost) is an error, never a shorter reply.
    max_new_tokens: u32,
    tokens: Vec<Option<Token>>,
}

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
    counters: Counters,
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
        Router {
            id,
            cfg,
            prefills,
            decodes,
            rooms,
            free_rooms,
            by_req: BTreeMap::new(),
            next_pair: 0,
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
                if let Err(reason) = self.check_peer(from, &msg) {
                    let id = self.id;
                    self.counters
                        .refuse_peer(env, id, from, msg.room(), msg.kind(), reason);
                    return;
                }
                self.on_message(from, msg, env)
            }
            Input::Timer(Timer::Request(room)) => self.on_request_timeout(room, env),
            Input::Timer(_) => {}
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
                Msg::PrefillFinished { room, status } => self.on_half(room, status, true, env),
                Msg::DecodeFinished { room, status } => self.on_half(room, status, false, env),
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
        status: Status,
        tokens: Vec<Token>,
    ) {
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
            self.respond(env, client, req, None, Status::BAD_REQUEST, Vec::new());
            return;
        }
        let Some(room) = self.free_rooms.pop() else {
            self.respond(env, client, req, None, Status::UNAVAILABLE, Vec::new());
            return;
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
        slot.live = Some(RoomUse {
            req,
            client,
            prefill,
            decode,
            answered: false,
            prefill_status: None,
            decode_status: None,
            max_new_tokens,
            tokens: Vec::new(),
        });
        self.by_req.insert(req, key);
        env.trace(TraceEvent::Routed {
            node: self.id,
            req,
            tenant,
            room: key,
            prefill,
            decode,
            prompt_len: prompt.len() as u64,
            max_new_tokens,
        });
        env.send(
            decode,
            Msg::DecodeStart {
                room: key,
                req,
                prompt: prompt.clone(),
                max_new_tokens,
                prefill,
            },
        );
        env.send(
            prefill,
            Msg::PrefillStart {
                room: key,
                req,
                prompt,
                decode,
            },
        );
        env.set_timer(Timer::Request(key), self.cfg.timeouts.request_ns);
    }

    fn on_cancel<K, E: Env<K>>(&mut self, req: RequestId, env: &mut E) {
        let Some(&key) = self.by_req.get(&req) else {
            return;
        };
        let one_half = self.cfg.bugs.has(Bug::RouterCancelsOneHalf);
        let Some(u) = self.slot(key) else { return };
        if u.answered {
            return;
        }
        u.answered = true;
        let (client, prefill, decode) = (u.client, u.prefill, u.decode);
        let (p_open, d_open) = (u.prefill_status.is_none(), u.decode_status.is_none());
        self.respond(
            env,
            client,
            req,
            Some(key),
            Status::CLIENT_CLOSED,
            Vec::new(),
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
        prefill_half: bool,
        env: &mut E,
    ) {
        let propagate =
            self.cfg.defenses.router_cancels_both && !self.cfg.bugs.has(Bug::RouterCancelsOneHalf);
        let Some(u) = self.slot(key) else { return };
        let mine = if prefill_half {
            &mut u.prefill_status
        } else {
            &mut u.decode_status
        };
        if mine.is_some() {
            return; // duplicate
        }
        *mine = Some(status);
        let mut answer = None;
        if !u.answered && (!status.is_ok() || !prefill_half) {
            u.answered = true;
            let tokens = if status.is_ok() {
                // A gap in the stream (a token message still in flight) is an error,
                // never a silently shorter reply.
                if u.tokens.iter().all(Option::is_some) {
                    u.tokens.iter().map(|t| t.unwrap_or(0)).collect()
                } else {
                    Vec::new()
                }
            } else {
                Vec::new()
            };
            let complete =
                tokens.len() == u.tokens.len() && tokens.len() == u.max_new_tokens as usize;
            let status = if status.is_ok() && !complete {
                Status::INTERNAL
            } else {
                status
            };
            answer = Some((u.client, u.req, status, tokens));
        }
        let other_open = if prefill_half {
            u.decode_status.is_none()
        } else {
            u.prefill_status.is_none()
        };
        let other = if prefill_half { u.decode } else { u.prefill };
        let both_done = u.prefill_status.is_some() && u.decode_status.is_some();
        if let Some((client, req, st, tokens)) = answer {
            self.respond(env, client, req, Some(key), st, tokens);
        }
        let failed = !status.is_ok() || self.cfg.bugs.has(Bug::AbortAfterSuccess);
        if failed && other_open && propagate {
            env.send(other, Msg::Abort { room: key });
        }
        if both_done {
            self.clear(key, env);
        }
    }

    fn on_request_timeout<K, E: Env<K>>(&mut self, key: RoomKey, env: &mut E) {
        let request_ns = self.cfg.timeouts.request_ns;
        let Some(u) = self.slot(key) else { return };
        let first = !u.answered;
        u.answered = true;
        let (client, req, prefill, decode) = (u.client, u.req, u.prefill, u.decode);
        let (p_open, d_open) = (u.prefill_status.is_none(), u.decode_status.is_none());
        if first {
            self.respond(env, client, req, Some(key), Status::INTERNAL, Vec::new());
        }
        // Keep asking until both halves have answered: an abort may have been lost.
        if p_open {
            env.send(prefill, Msg::Abort { room: key });
        }
        if d_open {
            env.send(decode, Msg::Abort { room: key });
        }
        env.set_timer(Timer::Request(key), request_ns);
    }

    fn clear<K, E: Env<K>>(&mut self, key: RoomKey, env: &mut E) {
        let idx = key.room.0 as usize - 1;
        if let Some(u) = self.rooms[idx].live.take() {
            self.by_req.remove(&u.req);
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
        if live + self.free_rooms.len() != self.rooms.len() || self.by_req.len() != live {
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
            answered: u.answered,
            prefill_status: u.prefill_status,
            decode_status: u.decode_status,
            tokens: u.tokens.clone(),
        })
    }

    /// The live room use serving a request.
    pub fn room_of(&self, req: RequestId) -> Option<RoomKey> {
        self.by_req.get(&req).copied()
    }
}
