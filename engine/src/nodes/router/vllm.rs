//! `vllm-router`'s policy ([`RouterPolicy::VllmRouter`](crate::config::RouterPolicy)),
//! as vllm-router 0.1.17 (PyPI) behaves with `--vllm-pd-disaggregation`, measured
//! black-box (issue 36): strictly sequential, prefill first (one token, its reply's
//! `kv_transfer_params` kept: `Msg::KvParams`), then decode with those params copied
//! verbatim (`Msg::PullStart`); no retries; a prefill 5xx (or a timeout) answers the
//! client 500 and decode is never contacted, a prefill 4xx passes through; decode's
//! answer passes through and prefill is never told; no abort or release is ever sent
//! to a worker, except that a client disconnect (`flow.rs`, `on_cancel`) or the
//! request timeout closes the one open upstream connection, which that node sees as
//! an abort. Defense 6 does not exist under it.

use super::rules::Policy;
use super::state::{reply, Answer, Router};
use crate::env::Control;
use crate::ids::{PageTag, RoomId, RoomKey};
use crate::msg::{Msg, Status, Why};
use crate::trace::Side;

/// vLLM's router.
pub(super) struct VllmRouter;

impl Policy for VllmRouter {
    const CANCELS_OTHER_HALF: bool = false;
    const SEQUENTIAL: bool = true;
    const MAX_ATTEMPTS: u32 = 1;

    /// The last freed room (vllm-router has no rooms; any free one serves).
    fn take_room(free: &mut Vec<RoomId>, _rng: &mut u64) -> Option<RoomId> {
        free.pop()
    }

    fn on_half(
        r: &mut Router,
        key: RoomKey,
        (status, why): (Status, Option<Why>),
        side: Side,
        env: &mut dyn Control,
    ) {
        let Some(u) = r.slot(key) else { return };
        if !u.answers.record(side, status) {
            return; // duplicate
        }
        if side == Side::Prefill && status.is_ok() && !u.answers.client {
            return r.start_decode(key, env);
        }
        let first = !u.answers.client;
        u.answers.client = true;
        let answer = match side {
            // A prefill 5xx (or anything not a 4xx) is the router's own 500.
            Side::Prefill if (400..500).contains(&status.0) => Answer::error(status, why),
            Side::Prefill => Answer::error(Status::INTERNAL, why),
            Side::Decode if status.is_ok() => reply(u, status, None),
            Side::Decode => Answer::error(status, why),
        };
        let (client, req) = (u.client, u.req);
        if first {
            r.respond(env, client, req, Some(key), answer);
        }
        r.clear(key, env);
    }

    /// The HTTP request times out: the client gets 500 (the stream is cut), and the
    /// one open upstream connection is closed (that node aborts its half), asked
    /// again until it answered.
    fn on_request_timeout(r: &mut Router, key: RoomKey, env: &mut dyn Control) {
        let Some(u) = r.slot(key) else { return };
        let first = !u.answers.client;
        u.answers.client = true;
        let (client, req) = (u.client, u.req);
        let open = u.open();
        if first {
            let answer = Answer::error(Status::INTERNAL, Some(Why::Timeout));
            r.respond(env, client, req, Some(key), answer);
        }
        match open {
            // Prefill answered, decode never started: nothing is open.
            (false, false) => r.clear(key, env),
            _ => r.keep_asking(key, env),
        }
    }
}

impl Router {
    /// Prefill's reply's `kv_transfer_params` for `key` (from its prefill: the peer
    /// check): kept, and decode started if prefill's 200 is already here.
    pub(super) fn on_params(&mut self, key: RoomKey, src: Vec<PageTag>, env: &mut dyn Control) {
        let Some(u) = self.slot(key) else { return };
        if u.params.is_none() {
            u.params = Some(src);
        }
        self.start_decode(key, env);
    }

    /// Send decode its start with prefill's params, once both prefill's 200 and its
    /// params are here (they are one HTTP reply; here two messages, in either order),
    /// unless the client already has its answer.
    fn start_decode(&mut self, key: RoomKey, env: &mut dyn Control) {
        let Some(u) = self.slot(key) else { return };
        let ready = u.answers.prefill.is_some_and(Status::is_ok) && !u.decode_started;
        let (Some(src), Some(retry), true) = (u.params.clone(), u.retry.as_ref(), ready) else {
            return;
        };
        if u.answers.client {
            return;
        }
        u.decode_started = true;
        let start = Msg::PullStart {
            room: key,
            req: u.req,
            prompt: retry.prompt.clone(),
            max_new_tokens: u.max_new_tokens,
            prefill: u.prefill,
            src,
        };
        env.send(u.decode, start);
    }
}
