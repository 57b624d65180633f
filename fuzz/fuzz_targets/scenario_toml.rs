//! Fuzz the scenario loader: any bytes give an error or a scenario that validates
//! and whose plan for a few seeds builds (or is refused with an error), with no panic
//! (arithmetic overflow included: the fuzz profile keeps overflow checks) and no
//! allocation over the bound of `bounded_alloc`.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOC: bounded_alloc::Bounded = bounded_alloc::Bounded;

use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::{Scenario, MAX_SCENARIO_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 > MAX_SCENARIO_BYTES {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sc) = Scenario::parse(text, "fuzz.toml") else {
        return;
    };
    // A parsed scenario is a valid one.
    assert!(sc.validate().is_ok());
    let _ = sc.cost_estimate();
    let _ = sc.check_cost();
    let _ = sc.check_memory(true);
    // Its plans build or are refused; explicit requests are listed, never more than
    // the stated maximum.
    for seed in [0, 1, u64::MAX] {
        if let Ok(plan) = Plan::build(&sc, seed, None, &Reduction::default()) {
            assert!(plan.requests.len() <= kvsim_sim::scenario::MAX_REQUESTS);
            let _ = plan.describe();
        }
    }
});
