//! The one place that picks a router policy's implementation (its `impl Policy`, the
//! trait in `rules.rs`) for the configured [`RouterPolicy`]. Adding a policy is a
//! variant of `RouterPolicy`, a module with its `impl Policy`, and one arm in each
//! dispatch below.

use super::careful::Careful;
use super::rules::Policy;
use super::sglang::SglangRouter;
use super::state::Router;
use super::vllm::VllmRouter;
use crate::config::RouterPolicy;
use crate::env::Control;
use crate::ids::{RoomId, RoomKey};
use crate::msg::{Status, Why};
use crate::trace::Side;

/// A policy's facts, for the drivers and the matrices that vary the policy.
impl RouterPolicy {
    /// The most attempts of one request (1: no retry).
    pub fn max_attempts(self) -> u32 {
        match self {
            RouterPolicy::Careful => Careful::MAX_ATTEMPTS,
            RouterPolicy::SglangRouter => SglangRouter::MAX_ATTEMPTS,
            RouterPolicy::VllmRouter => VllmRouter::MAX_ATTEMPTS,
        }
    }

    /// Can defense 6 (the router cancels both halves) exist under this policy?
    pub fn cancels_other_half(self) -> bool {
        match self {
            RouterPolicy::Careful => Careful::CANCELS_OTHER_HALF,
            RouterPolicy::SglangRouter => SglangRouter::CANCELS_OTHER_HALF,
            RouterPolicy::VllmRouter => VllmRouter::CANCELS_OTHER_HALF,
        }
    }

    /// Does decode start only after prefill's 200, with its `kv_transfer_params`?
    pub fn sequential(self) -> bool {
        match self {
            RouterPolicy::Careful => Careful::SEQUENTIAL,
            RouterPolicy::SglangRouter => SglangRouter::SEQUENTIAL,
            RouterPolicy::VllmRouter => VllmRouter::SEQUENTIAL,
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
            RouterPolicy::VllmRouter => VllmRouter::take_room(free, rng),
        }
    }

    pub(super) fn on_half(
        &mut self,
        key: RoomKey,
        (status, why): (Status, Option<Why>),
        side: Side,
        env: &mut dyn Control,
    ) {
        let answer = (status, why);
        match self.cfg.router {
            RouterPolicy::Careful => Careful::on_half(self, key, answer, side, env),
            RouterPolicy::SglangRouter => SglangRouter::on_half(self, key, answer, side, env),
            RouterPolicy::VllmRouter => VllmRouter::on_half(self, key, answer, side, env),
        }
    }

    pub(super) fn on_request_timeout(&mut self, key: RoomKey, env: &mut dyn Control) {
        match self.cfg.router {
            RouterPolicy::Careful => Careful::on_request_timeout(self, key, env),
            RouterPolicy::SglangRouter => SglangRouter::on_request_timeout(self, key, env),
            RouterPolicy::VllmRouter => VllmRouter::on_request_timeout(self, key, env),
        }
    }
}
