//! A colliding room: what reaches the halves when somebody other than the router's own
//! attempt names a room use that is live (issue 37, class 2). SGLang takes
//! `bootstrap_room` from the request body (SGLang #40125; Mooncake #1400), so a client
//! of the worker API may supply a room a live request holds, and a second gateway
//! drawing rooms from the same space may draw one; either way a start pair for the
//! live room use, for a request of its own, reaches both halves from the router's
//! address (the worker front delivers a client's start as the router's). The
//! simulator (`client_room_permille`) and the model checker (`colliding_rooms`) both
//! send exactly these two messages; whether and when is theirs to decide.

use crate::ids::{NodeId, RequestId, RoomKey, Token};
use crate::msg::Msg;

/// The first request id of a party that supplies a live room use's room: far above any
/// workload's, so it never names a request the router routed.
pub const COLLIDING_REQ: u64 = 1 << 48;

/// The prompt of a colliding request: `len` tokens, none of them a canary token of a
/// routed request's prompt.
pub fn colliding_prompt(len: u64) -> Vec<Token> {
    (0..len as u32).map(|i| 7 + 3 * i).collect()
}

/// The start pair request `req` (prompt `prompt`, `max_new_tokens`) sends for the live
/// room use `room`, whose halves are `prefill` and `decode`: decode's first, then
/// prefill's, each with its destination.
pub fn colliding_starts(
    room: RoomKey,
    (prefill, decode): (NodeId, NodeId),
    req: RequestId,
    prompt: Vec<Token>,
    max_new_tokens: u32,
) -> [(NodeId, Msg); 2] {
    [
        (
            decode,
            Msg::DecodeStart {
                room,
                req,
                prompt: prompt.clone(),
                max_new_tokens,
                prefill,
            },
        ),
        (
            prefill,
            Msg::PrefillStart {
                room,
                req,
                prompt,
                decode,
            },
        ),
    ]
}
