//! The policy of SGLang's gateway, `sglang-router` 0.3.2
//! ([`RouterPolicy::SglangRouter`](crate::config::RouterPolicy); its
//! `src/routers/http/pd_router.rs` and `src/core/retry.rs`): the router waits for both
//! halves and never cancels one; the answer is decode's, or prefill's error when only
//! prefill failed; 408, 429, 500, 502, 503 and 504 are retried, up to five attempts in
//! all, each in a new room drawn at random from the free rooms with the router's own
//! seeded generator; a request timeout closes both connections (each node aborts its
//! half) and is retried as a 502, the abandoned attempt staying in the table until
//! both its halves answered.

use super::rules::Policy;
use super::state::{reply, Answer, Router};
use crate::env::Control;
use crate::ids::{RoomId, RoomKey};
use crate::msg::{Status, Why};
use crate::trace::Side;

/// The most attempts `sglang-router` makes for one request (`max_retries` 5, counted
/// as attempts in all by `RetryExecutor::execute_response_with_retry`).
pub const SGLANG_MAX_ATTEMPTS: u32 = 5;

/// splitmix64: one step of the router's seeded generator.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SGLang's gateway.
pub(super) struct SglangRouter;

impl Policy for SglangRouter {
    const CANCELS_OTHER_HALF: bool = false;
    const SEQUENTIAL: bool = false;
    const MAX_ATTEMPTS: u32 = SGLANG_MAX_ATTEMPTS;

    /// A room drawn at random from the free rooms: a new random room every attempt.
    fn take_room(free: &mut Vec<RoomId>, rng: &mut u64) -> Option<RoomId> {
        if free.is_empty() {
            return None;
        }
        let i = splitmix(rng) % free.len() as u64;
        Some(free.remove(i as usize))
    }

    /// Wait for both halves, never cancel one; then answer with decode's reply
    /// (prefill's error when only prefill failed), or retry a retryable status in a new
    /// room while attempts are left.
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
        let next = r
            .next_attempt(key)
            .filter(|_| decided && status.is_retryable());
        // The answer names its room, so it goes out before the room is cleared.
        if decided && next.is_none() {
            r.respond(env, client, req, Some(key), answer);
        }
        r.clear(key, env);
        if let Some(a) = next {
            r.retry(key, status, a, env);
        }
    }

    /// The attempt's HTTP requests time out, which closes both connections (each node
    /// aborts its half) and is retried as a 502; the attempt stays, abandoned, until
    /// both halves answered.
    fn on_request_timeout(r: &mut Router, key: RoomKey, env: &mut dyn Control) {
        let Some(u) = r.slot(key) else { return };
        let give_up = !u.answers.client && !u.abandoned;
        if give_up {
            u.abandoned = true;
        } else {
            u.answers.client = true;
        }
        let (client, req) = (u.client, u.req);
        r.keep_asking(key, env);
        if give_up {
            match r.next_attempt(key) {
                Some(a) => r.retry(key, Status::BAD_GATEWAY, a, env),
                None => {
                    r.by_req.remove(&req);
                    let answer = Answer::error(Status::BAD_GATEWAY, Some(Why::Timeout));
                    r.respond(env, client, req, Some(key), answer);
                }
            }
        }
    }
}
