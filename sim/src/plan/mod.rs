//! `Plan`: everything one run is made of, drawn from a scenario and a seed.
//!
//! A scenario is a family of runs; a plan is one member of it, fully concrete: the
//! topology and pool sizes, the engine limits and timeouts, the network's fault rates,
//! the partition windows and crashes with their times, every request with its arrival
//! and its client's cancel, and the phase boundaries. Under `[swarm]` each seed draws
//! all of these (which fault kinds are on and how hard, zero included); without it
//! the scenario's values are used as written and every fault it lists is fully on.
//!
//! Each part is drawn from its own seed stream ([`crate::rng`]) with a fixed number of
//! draws, so a [`Reduction`] (fewer requests, fault kinds off, a shorter safety phase)
//! changes exactly what it names and nothing else: the shrinker relies on it.
//! A plan is a pure function of (scenario, seed, bug switches, reduction).

mod build;
mod describe;
mod draw;
mod fault;
mod reduction;

pub use build::{Deployment, Plan};
pub use describe::ms;
pub use fault::{derived_cleanup_bound_ns, CrashPlan, FaultKind, NetParams, Partition};
pub use reduction::Reduction;
