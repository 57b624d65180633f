//! A router policy: the decisions that differ between routers, as a type each policy
//! implements ([`Policy`]), and the one place that picks the implementation for the
//! configured [`RouterPolicy`]. Adding a policy is a variant of `RouterPolicy`, a
//! module with its `impl Policy`, and one arm in each dispatch below.

use super::careful::Careful;
use super::sglang::SglangRouter;
use super::state::Router;
use crate::config::RouterPolicy;
use crate::env::Outbox;
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

    /// A free room for a new attempt, taken out of `free` (the router's seeded
    /// generator `rng` is the policy's to draw from).
    fn take_room(free: &mut Vec<RoomId>, rng: &mut u64) -> Option<RoomId>;

    /// `side` of the room use `key` answered `status` (for the reason `why`).
    fn on_half<K>(
        r: &mut Router,
        key: RoomKey,
        answer: (Status, Option<Why>),
        side: Side,
        env: &mut Outbox<K>,
    );

    /// The request timer of `key` fired.
    fn on_request_timeout<K>(r: &mut Router, key: RoomKey, env: &mut Outbox<K>);
}

/// A policy's facts, for the drivers and the matrices that vary the policy.
impl RouterPolicy {
    /// The most attempts of one request (1: no retry).
    pub fn max_attempts(self) -> u32 {
        match self {
            RouterPolicy::Careful => Careful::MAX_ATTEMPTS,
            RouterPolicy::SglangRouter => SglangRouter::MAX_ATTEMPTS,
        }
    }

    /// Can defense 6 (the router cancels both halves) exist under this policy?
    pub fn cancels_other_half(self) -> bool {
        match self {
            RouterPolicy::Careful => Careful::CANCELS_OTHER_HALF,
            RouterPolicy::SglangRouter => SglangRouter::CANCELS_OTHER_HALF,
        }
    }
}

/// The configured policy's answer to each decision: the one dispatch.
impl Router {
    pub(super) fn max_attempts(&self) -> u32 {
        self.cfg.router.max_attempts()
    }

    /// Does an attempt keep what a new attempt of its request needs?
    pub(super) fn retries(&self) -> bool {
        self.max_attempts() > 1
    }

    pub(super) fn take_room(&mut self) -> Option<RoomId> {
        let (free, rng) = (&mut self.free_rooms, &mut self.rng);
        match self.cfg.router {
            RouterPolicy::Careful => Careful::take_room(free, rng),
            RouterPolicy::SglangRouter => SglangRouter::take_room(free, rng),
        }
    }

    pub(super) fn on_half<K>(
        &mut self,
        key: RoomKey,
        (status, why): (Status, Option<Why>),
        side: Side,
        env: &mut Outbox<K>,
    ) {
        let answer = (status, why);
        match self.cfg.router {
            RouterPolicy::Careful => Careful::on_half(self, key, answer, side, env),
            RouterPolicy::SglangRouter => SglangRouter::on_half(self, key, answer, side, env),
        }
    }

    pub(super) fn on_request_timeout<K>(&mut self, key: RoomKey, env: &mut Outbox<K>) {
        match self.cfg.router {
            RouterPolicy::Careful => Careful::on_request_timeout(self, key, env),
            RouterPolicy::SglangRouter => SglangRouter::on_request_timeout(self, key, env),
        }
    }
}
