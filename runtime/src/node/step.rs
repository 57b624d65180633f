//! How one input steps the runtime's node: the node type a loop runs
//! ([`RuntimeNode`]), its compute on the node's device thread where it has one, and the
//! pacing of a scheduler pass that ran no device work ([`IDLE_PASS_NS`]). Not the loop
//! around it (`NodeLoop`) nor how the effects are carried out (`Io`).

use crate::device::DeviceThread;
use crate::gpu::SharedGpu;
use kvsim_engine::compute::{Done, Job};
use kvsim_engine::env::{Effect, Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::Gpu;
use kvsim_engine::kv::SharedRecord;
use kvsim_engine::node::Node;
use kvsim_engine::world;

/// The node a loop runs: the engine's own [`Node`], its state machines unchanged. Its
/// memory is shared with the decode node's transfer thread, and the decode node decides
/// with the shared record that thread gates landings with.
pub type RuntimeNode<G> = Node<SharedGpu<G>, SharedRecord>;

/// The node as [`world::step`] drives it in the runtime: its compute runs on its device
/// thread where it has one, and the loop waits for it.
pub(super) struct OnDevice<'a, G: Gpu> {
    pub(super) node: &'a mut RuntimeNode<G>,
    pub(super) device: Option<&'a DeviceThread>,
    /// The jobs this step ran.
    pub(super) jobs: u32,
}

/// The least time between two scheduler passes when the first ran no device work
/// (it only polled transfers in flight): under `kvsim serve --compute device` a pass
/// is re-armed at once, and a poll that found nothing to run would otherwise spin a
/// core the node's own transfer and link threads need. A timer fires at or after its
/// deadline in every driver; the runtime lets this one fire a little later.
pub const IDLE_PASS_NS: u64 = 100_000;

/// A pass that ran no device work re-arms its next pass no sooner than
/// [`IDLE_PASS_NS`].
pub(super) fn pace_idle_pass<M, T, W>(effects: &mut [Effect<M, T, W>]) {
    for e in effects.iter_mut() {
        if let Effect::Timer(TimerOp::Set {
            timer: Timer::Compute,
            after_ns,
        }) = e
        {
            *after_ns = (*after_ns).max(IDLE_PASS_NS);
            debug_assert!(*after_ns >= IDLE_PASS_NS);
        }
    }
}

impl<G: Gpu> world::Stepper<G::Kv> for OnDevice<'_, G> {
    fn handle(&mut self, input: Input, out: &mut Outbox<G::Kv>) {
        self.node.handle(input, out);
    }
    fn compute(&mut self, job: Job) -> Done {
        self.jobs += 1;
        match self.device {
            Some(d) => d.run(job),
            None => world::Stepper::compute(self.node, job),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler pass that ran no device work re-arms its next pass no sooner than
    /// the floor; every other timer, and a pass armed later than the floor, is as the
    /// node asked.
    #[test]
    fn an_idle_pass_re_arms_no_sooner_than_the_floor() {
        let room = kvsim_engine::ids::RoomKey::new(1, 1);
        let set = |timer, after_ns| Effect::<()>::Timer(TimerOp::Set { timer, after_ns });
        let mut effects = vec![set(Timer::Compute, 0), set(Timer::WaitingForKv(room), 0)];
        pace_idle_pass(&mut effects);
        let delays: Vec<u64> = effects
            .iter()
            .map(|e| match e {
                Effect::Timer(TimerOp::Set { after_ns, .. }) => *after_ns,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(delays, [IDLE_PASS_NS, 0]);
        let mut later = vec![set(Timer::Compute, 5 * IDLE_PASS_NS)];
        pace_idle_pass(&mut later);
        assert!(matches!(
            later[0],
            Effect::Timer(TimerOp::Set { after_ns, .. }) if after_ns == 5 * IDLE_PASS_NS
        ));
    }
}
