//! The careful router's policy ([`RouterPolicy::Careful`](crate::config::RouterPolicy)):
//! one attempt per request; the first error answers the client (unless it is decode
//! failing a transfer whose cause prefill has yet to report); any failure cancels the
//! other half (defense 6); a request timeout answers 500 and keeps asking both halves
//! to abort until they answered. Rooms are reused last-freed first.

use super::rules::Policy;
use super::state::{other_side, reply, Answer, RoomUse, Router};
use crate::bugs::Bug;
use crate::env::Control;
use crate::ids::{RoomId, RoomKey};
use crate::msg::{Msg, Status, Why};
use crate::trace::Side;

/// The careful router.
pub(super) struct Careful;

impl Policy for Careful {
    const CANCELS_OTHER_HALF: bool = true;
    const SEQUENTIAL: bool = false;
    const MAX_ATTEMPTS: u32 = 1;

    /// The last freed room.
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
        let propagate = Self::CANCELS_OTHER_HALF
            && r.cfg.defenses.router_cancels_both
            && !r.cfg.bugs.has(Bug::RouterCancelsOneHalf);
        let Some(u) = r.slot(key) else { return };
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
            r.respond(env, client, req, Some(key), a);
        }
        let failed = !status.is_ok() || r.cfg.bugs.has(Bug::AbortAfterSuccess);
        if failed && other_open && propagate {
            env.send(other, Msg::Abort { room: key });
        }
        if both_done {
            r.clear(key, env);
        }
    }

    /// Answer 500 once, then keep asking both halves to abort until they answered.
    fn on_request_timeout(r: &mut Router, key: RoomKey, env: &mut dyn Control) {
        let Some(u) = r.slot(key) else { return };
        let first = !u.answers.client && !u.abandoned;
        u.answers.client = true;
        let (client, req) = (u.client, u.req);
        if first {
            let answer = Answer::error(Status::INTERNAL, Some(Why::Timeout));
            r.respond(env, client, req, Some(key), answer);
        }
        r.keep_asking(key, env);
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
