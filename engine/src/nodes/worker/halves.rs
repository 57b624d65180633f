//! A worker front's halves: a half started (with the pairing traced where decode's
//! half starts), aborted when its client goes away, and answered from what the node
//! sends the router. Not when a room is cleared (`epochs.rs`).

use super::state::{Clearing, FrontEffect, FrontInput, Half, HalfEv, WorkerFront, EARLY_DONE};
use crate::config::Protocol;
use crate::ids::{RequestId, RoomKey, TenantId};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;
use crate::trace::TraceEvent;

impl WorkerFront {
    /// Handle one input; the effects go to `out` in the order issued.
    pub fn handle(&mut self, input: FrontInput, out: &mut Vec<FrontEffect>) {
        match input {
            FrontInput::Start {
                room,
                msg,
                max_new_tokens,
                prefill_epoch,
                intake_open,
            } => self.start(room, msg, (max_new_tokens, prefill_epoch), intake_open, out),
            FrontInput::Abort { room } => self.abort(room, out),
            FrontInput::Peer { from, msg } => self.on_peer(from, msg, out),
            FrontInput::WaitOver { room } => self.wait_over(room, out),
            FrontInput::Early { room, status, why } => self.prefill_done(room, status, why, out),
        }
    }

    /// The router asked for the half of `room` with `msg`: refused 503 with the
    /// node's intake closed (the node never sees it; a prefill half's decode hears of
    /// it). Otherwise, under SGLang's protocol, held for the pairing: decode's front
    /// registers the room at its prefill's bootstrap, prefill's waits (at most its
    /// bound) for that registration, unless it came first. vLLM's halves start at once.
    fn start(
        &mut self,
        room: RoomKey,
        mut msg: Msg,
        (max_new_tokens, prefill_epoch): (u32, Option<u32>),
        intake_open: bool,
        out: &mut Vec<FrontEffect>,
    ) {
        if self.has_half(room) {
            // A copy of a start: the node judges a copy of one it has; a held one waits.
            if self.halves.contains_key(&room) {
                out.push(FrontEffect::ToNode(msg));
            }
            return;
        }
        match &mut msg {
            Msg::PrefillStart { .. } | Msg::DecodeStart { .. } | Msg::PullStart { .. }
                if intake_open => {}
            _ => {
                let ev = self.done(Status::UNAVAILABLE, None, self.side(), Vec::new());
                out.push(FrontEffect::Answer { room, ev });
                if self.role != Role::Decode {
                    self.ended_unrun(room, Status::UNAVAILABLE, out);
                }
                return;
            }
        }
        if self.protocol == Protocol::Vllm {
            return self.begin(room, msg, max_new_tokens, prefill_epoch, out);
        }
        match &mut msg {
            Msg::DecodeStart { prefill, .. } => {
                let to = *prefill;
                self.held.insert(room, (msg, max_new_tokens));
                out.push(FrontEffect::Send {
                    to,
                    msg: Msg::Register { room },
                });
            }
            Msg::PrefillStart { decode, .. } => match self.registered.remove(&room) {
                Some(d) => {
                    *decode = d;
                    self.begin(room, msg, max_new_tokens, None, out);
                }
                None => {
                    self.held.insert(room, (msg, max_new_tokens));
                    let after_ns = self.wait_ns;
                    out.push(FrontEffect::Wait { room, after_ns });
                }
            },
            _ => {}
        }
    }

    /// The pairing of `room` is done: its half goes to the node. Decode's half traces
    /// the pairing as the engine router traces it, so the audit knows each room's
    /// halves with no router trace (the client's answer is decode's: a room whose
    /// decode half never started is no room to the audit), and registers the room for
    /// clearing with `prefill_epoch`, the incarnation of the prefill node whose
    /// bootstrap took the registration. Prefill's word of its half's end, come early,
    /// is handed back once the start was delivered.
    pub(super) fn begin(
        &mut self,
        room: RoomKey,
        msg: Msg,
        max_new_tokens: u32,
        prefill_epoch: Option<u32>,
        out: &mut Vec<FrontEffect>,
    ) {
        // Prefill's word of its half's end goes to its decode's front under SGLang's
        // protocol only (vllm-router starts decode once prefill answered).
        let sglang = self.protocol == Protocol::Sglang;
        let (req, peer) = match &msg {
            Msg::PrefillStart { req, decode, .. } => (*req, Some(*decode).filter(|_| sglang)),
            Msg::DecodeStart { req, .. } | Msg::PullStart { req, .. } => (*req, None),
            _ => return,
        };
        // A decode half (SGLang's, or vLLM's pull, whose prefill half already
        // answered 200: vllm-router starts decode only then).
        let pairing = match &msg {
            Msg::DecodeStart {
                prompt, prefill, ..
            } => Some((prompt.len(), *prefill, false)),
            Msg::PullStart {
                prompt, prefill, ..
            } => Some((prompt.len(), *prefill, true)),
            _ => None,
        };
        if let Some((prompt_len, prefill, prefill_ended)) = pairing {
            out.push(FrontEffect::Trace(TraceEvent::Routed {
                node: self.router,
                req,
                tenant: TenantId(0),
                room,
                prefill,
                decode: self.node,
                prompt_len: prompt_len as u64,
                max_new_tokens,
            }));
            self.register(room, prefill, prefill_epoch, out);
            if prefill_ended {
                self.half_done(room, Side::Prefill, out);
            }
        }
        self.halves.insert(room, Half::new(req, peer));
        out.push(FrontEffect::ToNode(msg));
        let early = self.early_done.iter().position(|(r, _, _)| *r == room);
        if let Some((_, status, why)) = early.and_then(|i| self.early_done.remove(i)) {
            out.push(FrontEffect::Then(FrontInput::Early { room, status, why }));
        }
    }

    /// The half's client went away: the half is aborted, as the router aborts it. A
    /// prefill half keeps its answer until it is terminal (its finish still tells
    /// decode); a decode half's client is answered now (it went away). A room with no
    /// half here (never started, answered, or the process that had it is gone) has
    /// only its client's channel to close.
    fn abort(&mut self, room: RoomKey, out: &mut Vec<FrontEffect>) {
        if self.held.remove(&room).is_some() {
            // Not at the node yet: its client's channel closes; a prefill half's
            // decode hears that it ended.
            out.push(FrontEffect::Close { room });
            if self.role != Role::Decode {
                self.ended_unrun(room, Status::CLIENT_CLOSED, out);
            }
            return;
        }
        if !self.halves.contains_key(&room) {
            out.push(FrontEffect::Close { room });
            return;
        }
        if self.role == Role::Decode {
            if let Some(h) = self.halves.remove(&room) {
                out.push(FrontEffect::Close { room });
                out.push(FrontEffect::ClientGone { req: h.req });
                self.answered(room, h.req, Status::CLIENT_CLOSED, Vec::new(), out);
            }
        }
        out.push(FrontEffect::ToNode(Msg::Abort { room }));
    }

    /// A message the node sent its router: the front's half's answer. A decode half's
    /// finish is the client's answer (SGLang's router returns decode's): traced as the
    /// engine router traces its response, so the audit closes the room.
    pub fn from_node(&mut self, msg: Msg, out: &mut Vec<FrontEffect>) {
        match msg {
            Msg::TokenOut { room, index, token } => {
                if let Some(h) = self.halves.get_mut(&room) {
                    if index as usize == h.tokens.len() {
                        h.tokens.push(token);
                    }
                    let ev = HalfEv::Token { index, token };
                    out.push(FrontEffect::Answer { room, ev });
                }
            }
            // vLLM's prefill: its reply's `kv_transfer_params`, before its answer.
            Msg::KvParams { room, src, tokens } if self.halves.contains_key(&room) => {
                let ev = HalfEv::Params { src, tokens };
                out.push(FrontEffect::Answer { room, ev });
            }
            Msg::PrefillFinished { room, status, why } => {
                if let Some(h) = self.halves.remove(&room) {
                    let ev = self.done(status, why, Side::Prefill, Vec::new());
                    out.push(FrontEffect::Answer { room, ev });
                    if let Some(to) = h.peer {
                        let msg = Msg::PrefillDone { room, status, why };
                        out.push(FrontEffect::Send { to, msg });
                    }
                }
            }
            Msg::DecodeFinished { room, status, why } => {
                self.half_done(room, Side::Decode, out);
                if let Some(h) = self.halves.remove(&room) {
                    self.answered(room, h.req, status, h.tokens.clone(), out);
                    let ev = self.done(status, why, Side::Decode, h.tokens);
                    out.push(FrontEffect::Answer { room, ev });
                }
            }
            _ => {}
        }
    }

    /// Decode: prefill's word that its half of `room` is terminal, kept for a moment
    /// when decode's half has not started yet.
    pub(super) fn peer_done(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        out: &mut Vec<FrontEffect>,
    ) {
        if !self.clearing.contains_key(&room) {
            if self.early_done.len() >= EARLY_DONE {
                self.early_done.pop_front();
            }
            self.early_done.push_back((room, status, why));
            return;
        }
        self.prefill_done(room, status, why, out);
    }

    /// Decode: prefill's half of `room` is terminal with `status`. The room clears once
    /// decode's half is too; a failed prefill half ends decode's half with prefill's
    /// status (the client hears prefill's error, as the router's first-error answer,
    /// and decode's half is aborted, as the router aborts it) where the router's
    /// cancel-both defense is on.
    fn prefill_done(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        out: &mut Vec<FrontEffect>,
    ) {
        self.half_done(room, Side::Prefill, out);
        if !self.cancels_both || status.is_ok() {
            return;
        }
        let Some(h) = self.halves.remove(&room) else {
            return;
        };
        let node = self.node;
        out.push(FrontEffect::Trace(TraceEvent::FrontCancelled {
            node,
            room,
            status,
        }));
        self.answered(room, h.req, status, Vec::new(), out);
        let ev = self.done(status, why, Side::Prefill, Vec::new());
        out.push(FrontEffect::Answer { room, ev });
        out.push(FrontEffect::ToNode(Msg::Abort { room }));
    }

    /// Decode: register `room`, whose prefill is node `prefill`, for clearing, with
    /// the incarnation its bootstrap answered with, where it said.
    fn register(
        &mut self,
        room: RoomKey,
        prefill: crate::ids::NodeId,
        epoch: Option<u32>,
        out: &mut Vec<FrontEffect>,
    ) {
        let at = epoch.map(|e| (prefill, e));
        self.clearing.insert(
            room,
            Clearing {
                at,
                ..Clearing::default()
            },
        );
        if let Some(e) = epoch {
            self.prefill_incarnation(prefill, e, out);
            // Registered at an incarnation already known dead: its half is over.
            if self.prefill_epochs.get(&prefill).is_some_and(|k| *k > e) {
                self.half_done(room, Side::Prefill, out);
            }
        }
    }

    /// Trace the answer a decode half gave its client, as the engine router traces
    /// its response.
    fn answered(
        &self,
        room: RoomKey,
        req: RequestId,
        status: Status,
        tokens: Vec<crate::ids::Token>,
        out: &mut Vec<FrontEffect>,
    ) {
        out.push(FrontEffect::Trace(TraceEvent::RouterResponse {
            node: self.router,
            req,
            room: Some(room),
            status,
            tokens,
        }));
    }

    pub(super) fn done(
        &self,
        status: Status,
        why: Option<Why>,
        side: Side,
        tokens: Vec<crate::ids::Token>,
    ) -> HalfEv {
        HalfEv::Done {
            status,
            why,
            side,
            tokens,
        }
    }
}
