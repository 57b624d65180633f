//! One step of a node, for every driver: the node handles an input, then every compute
//! it asked for is carried out on its device and the completion handled, in the same
//! step. The simulator, the model checker, the hand-stepped driver and the hardware
//! runtime all step a node through [`step`]; what they do with the step's effects
//! afterwards is [`crate::world::apply`]'s.

use crate::compute::{Done, Job};
use crate::env::{Effect, Input, Outbox};

/// A node as [`step`] drives it: its one door, and the device that runs its jobs (its
/// own memory in the simulator, the model checker and the harness; the node's device
/// thread in the hardware runtime).
pub trait Stepper<K> {
    /// The node's `handle`.
    fn handle(&mut self, input: Input, out: &mut Outbox<K>);
    /// Carry out `job` on the node's device and say what it did.
    fn compute(&mut self, job: Job) -> Done;
}

/// One step of a node, for every driver: `node` handles `input`, then every compute it
/// asks for is carried out and its completion handled, in the same step, until it asks
/// for none. A node asks for a compute only as its last effect, and the completion's
/// effects follow the step's in `out`, so the driver applies the whole step in the
/// order the node issued it, and no `Compute` is left in `out`
/// (docs/DECISIONS.md, "Compute as an effect").
pub fn step<K, N: Stepper<K>>(node: &mut N, input: Input, out: &mut Outbox<K>) {
    node.handle(input, out);
    while let Some(Effect::Compute(_)) = out.effects.last() {
        let Some(Effect::Compute(job)) = out.effects.pop() else {
            unreachable!("the last effect is a compute");
        };
        let done = node.compute(job);
        node.handle(Input::Computed(done), out);
    }
    // O(effects in the outbox) on every step: debug only.
    debug_assert!(
        !out.effects.iter().any(|e| matches!(e, Effect::Compute(_))),
        "a node asks for a compute only as its last effect"
    );
}
