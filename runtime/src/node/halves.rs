//! Worker mode's halves in a node's loop: a half the worker front starts or aborts,
//! what the half sends the router (to the worker front's half instead), and, on a
//! decode node, when a room whose halves are both terminal is cleared (traced as the
//! engine router traces it, for the audit). Not the loop's other inputs
//! ([`NodeLoop::handle`]) nor the worker front itself ([`crate::worker`]).

use crate::node::io::{Half, Io, EARLY_DONE};
use crate::node::node_loop::NodeLoop;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::seam::NodeRuntime;
use kvsim_engine::env::Input;
use kvsim_engine::gpu::Gpu;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, TenantId, Token};
use kvsim_engine::msg::{Msg, Status};
use kvsim_engine::node::Node;
use kvsim_engine::trace::TraceEvent;
use kvsim_oracle::schema::{CancelHow, Record};

impl<K: Clone, R: NodeRuntime<Kv = K>> Io<R> {
    /// A half's message to the router, in worker mode: to the worker front's half. A
    /// decode half's finish is the client's answer (SGLang's router returns decode's):
    /// traced as the engine router traces its response, so the audit closes the room.
    pub(super) fn for_half(&mut self, msg: Msg) {
        match msg {
            Msg::TokenOut { room, index, token } => {
                if let Some(h) = self.halves.get_mut(&room) {
                    if index as usize == h.tokens.len() {
                        h.tokens.push(token);
                    }
                    h.sink.send(ReplyEv::Token { index, token });
                }
            }
            Msg::PrefillFinished { room, status, why } => {
                if let Some(mut h) = self.halves.remove(&room) {
                    h.sink.send(ReplyEv::Done(Reply {
                        req: room.gen.0,
                        status: status.0,
                        tokens: Vec::new(),
                        reason: why.map(|w| w.to_string()),
                    }));
                }
            }
            Msg::DecodeFinished { room, status, why } => {
                self.half_done(room, 1);
                if let Some(mut h) = self.halves.remove(&room) {
                    self.answered(room, status, h.tokens.clone());
                    h.sink.send(ReplyEv::Done(Reply {
                        req: room.gen.0,
                        status: status.0,
                        tokens: h.tokens,
                        reason: why.map(|w| w.to_string()),
                    }));
                }
            }
            _ => {}
        }
    }

    /// A half of a worker-mode decode room is terminal (`bit` 1: decode's, 2:
    /// prefill's): with both, the room is cleared.
    fn half_done(&mut self, room: RoomKey, bit: u8) {
        let Some(node) = self.worker_router else {
            return;
        };
        let Some((done, _)) = self.clearing.get_mut(&room) else {
            return;
        };
        *done |= bit;
        if *done == 3 {
            self.clearing.remove(&room);
            self.trace(|| Record::Engine(TraceEvent::RoomCleared { node, room }));
        }
    }

    /// Worker mode, decode: prefill node `prefill`'s bootstrap answered as incarnation
    /// `epoch`. A later incarnation means the process of every earlier one was killed
    /// (a restart in process keeps the process's worker front and its first epoch),
    /// and its halves died with it: the restarted node's trace begins with the `crash`
    /// that forgets them, and no word of their end can come (the dead process would
    /// have sent it). So the prefill half of every room registered at an earlier
    /// incarnation is terminal; a room whose decode half is terminal too is cleared.
    fn prefill_incarnation(&mut self, prefill: NodeId, epoch: u32) {
        let known = self.prefill_epochs.entry(prefill).or_insert(epoch);
        if epoch <= *known {
            return;
        }
        *known = epoch;
        let dead: Vec<RoomKey> = self
            .clearing
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|(p, e)| p == prefill && e < epoch))
            .map(|(room, _)| *room)
            .collect();
        for room in dead {
            self.half_done(room, 2);
        }
    }

    /// Trace the answer a worker-mode decode half gave its client.
    fn answered(&mut self, room: RoomKey, status: Status, tokens: Vec<Token>) {
        let Some(node) = self.worker_router else {
            return;
        };
        self.trace(|| {
            Record::Engine(TraceEvent::RouterResponse {
                node,
                req: RequestId(room.gen.0),
                room: Some(room),
                status,
                tokens,
            })
        });
    }
}

impl<G: Gpu, R: NodeRuntime<Kv = G::Kv>> NodeLoop<G, R> {
    /// Worker mode, decode: prefill's half of `room` is terminal with `status`. The room
    /// clears once decode's half is too; a failed prefill half ends decode's half with
    /// prefill's status (the client hears prefill's error, as the router's first-error
    /// answer, and decode's half is aborted, as the router aborts it) where the
    /// router's cancel-both defense is on.
    fn prefill_done(&mut self, room: RoomKey, status: Status, reason: Option<String>) {
        self.io.half_done(room, 2);
        let Some(router) = self.io.worker_router else {
            return;
        };
        if !self.io.worker_cancels_both || status.is_ok() {
            return;
        }
        let Some(mut h) = self.io.halves.remove(&room) else {
            return;
        };
        self.io.answered(room, status, Vec::new());
        h.sink.send(ReplyEv::Done(Reply {
            req: room.gen.0,
            status: status.0,
            tokens: Vec::new(),
            reason: reason.map(|r| format!("prefill: {r}")),
        }));
        self.dispatch(Input::Message {
            from: router,
            msg: Msg::Abort { room },
        });
    }

    /// Worker mode, decode: prefill's word that its half of `room` is done (kept for a
    /// moment when decode's half has not started yet).
    pub(super) fn peer_half_done(&mut self, room: RoomKey, status: Status, reason: Option<String>) {
        if !self.io.clearing.contains_key(&room) {
            if self.io.early_done.len() >= EARLY_DONE {
                self.io.early_done.pop_front();
            }
            self.io.early_done.push_back((room, status, reason));
            return;
        }
        self.prefill_done(room, status, reason);
    }

    /// Worker mode: start a half the worker front was given (`NodeEvent::StartHalf`).
    pub(super) fn start_half(
        &mut self,
        room: RoomKey,
        msg: Msg,
        max_new_tokens: u32,
        mut reply: ReplySink,
        prefill_epoch: Option<u32>,
    ) {
        let Some(router) = self.io.worker_router.filter(|_| self.intake_open) else {
            reply.send(ReplyEv::Done(Reply {
                req: room.gen.0,
                status: Status::UNAVAILABLE.0,
                tokens: Vec::new(),
                reason: None,
            }));
            return;
        };
        // The pairing the router made, as the engine router traces it, so the audit
        // knows each room's halves without a router trace. Decode's node traces it (the
        // client's answer is decode's): a room whose decode half never started is no
        // room to the audit.
        if let Msg::DecodeStart {
            req,
            prompt,
            prefill,
            ..
        } = &msg
        {
            let (req, len, prefill, decode) = (*req, prompt.len(), *prefill, self.io.id);
            self.io.trace(|| {
                Record::Engine(TraceEvent::Routed {
                    node: router,
                    req,
                    tenant: TenantId(0),
                    room,
                    prefill,
                    decode,
                    prompt_len: len as u64,
                    max_new_tokens,
                })
            });
            let at = prefill_epoch.map(|e| (prefill, e));
            self.io.clearing.insert(room, (0, at));
            if let Some(e) = prefill_epoch {
                self.io.prefill_incarnation(prefill, e);
                // Registered at an incarnation already known dead: its half is over.
                if self.io.prefill_epochs.get(&prefill).is_some_and(|k| *k > e) {
                    self.io.half_done(room, 2);
                }
            }
        }
        let half = Half {
            sink: reply,
            tokens: Vec::new(),
        };
        self.io.halves.insert(room, half);
        self.dispatch(Input::Message { from: router, msg });
        let early = self.io.early_done.iter().position(|(r, _, _)| *r == room);
        if let Some((_, st, why)) = early.and_then(|i| self.io.early_done.remove(i)) {
            self.prefill_done(room, st, why);
        }
    }

    /// Worker mode: the worker front's client of `room` went away (`NodeEvent::AbortHalf`).
    pub(super) fn abort_half(&mut self, room: RoomKey) {
        let Some(router) = self.io.worker_router else {
            return;
        };
        if !self.io.halves.contains_key(&room) {
            return;
        }
        // A prefill half keeps its answer's sink until the half is terminal (its finish
        // still tells decode); a decode half's client is answered now.
        if matches!(self.node, Node::Decode(_)) {
            self.io.halves.remove(&room);
            // The client's answer is decode's: it went away.
            let req = RequestId(room.gen.0);
            self.io.trace(|| Record::ClientCancel {
                req,
                how: CancelHow::Disconnect,
                plan: "the router closed its connection to this worker".into(),
            });
            self.io.answered(room, Status::CLIENT_CLOSED, Vec::new());
        }
        self.dispatch(Input::Message {
            from: router,
            msg: Msg::Abort { room },
        });
    }
}
