//! What a router policy decides, as a trait each policy's type implements
//! (`careful.rs`, `sglang.rs`); `policy.rs` dispatches to the configured one.

use super::state::Router;
use crate::env::Control;
use crate::ids::{RoomId, RoomKey};
use crate::msg::{Status, Why};
use crate::trace::Side;

/// What a router policy decides. The router's core (`flow.rs`) keeps the room table,
/// the request index, the peer check and the client's one answer; a policy says which
/// room an attempt takes, whether a request may be attempted again, what a half's
/// answer does (answer the client, cancel the other half, retry) and what the request
/// timeout does.
pub(super) trait Policy {
    /// The most attempts of one request (1: no retry).
    const MAX_ATTEMPTS: u32;
    /// Does a failed half make the router cancel the other (defense 6, when the
    /// defense is on)? A policy without it has no such defense to turn on.
    const CANCELS_OTHER_HALF: bool;
    /// Does decode start only after prefill answered 200, with prefill's
    /// `kv_transfer_params` (`vllm-router`)? Otherwise both halves start at once.
    const SEQUENTIAL: bool;

    /// A free room for a new attempt, taken out of `free` (the router's seeded
    /// generator `rng` is the policy's to draw from).
    fn take_room(free: &mut Vec<RoomId>, rng: &mut u64) -> Option<RoomId>;

    /// `side` of the room use `key` answered `status` (for the reason `why`).
    fn on_half(
        r: &mut Router,
        key: RoomKey,
        answer: (Status, Option<Why>),
        side: Side,
        env: &mut dyn Control,
    );

    /// The request timer of `key` fired.
    fn on_request_timeout(r: &mut Router, key: RoomKey, env: &mut dyn Control);
}
