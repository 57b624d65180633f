//! One cell of the matrix: a configuration against a hazard on a transport under a
//! router policy, run on its seeds and counted (leaks, violations, detections). The
//! whole matrix and its judgements are [`super::results`]'s.

use crate::isolation::hazard::{Hazard, LEAKS};
use crate::LabError;
use kvsim_engine::config::{Defenses, RouterPolicy};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::world::KvTransport;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::{run_plan, Backend};

/// One cell: a configuration against a hazard, on a transport, under a router policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub transport: KvTransport,
    pub config: &'static str,
    pub router: RouterPolicy,
    pub hazard: Hazard,
    pub seeds: u64,
    /// Seeds on which something leaked ([`LEAKS`] violated).
    pub leaked: u64,
    /// Seeds on which any invariant was violated.
    pub violated: u64,
    /// Every invariant violated on some seed, sorted.
    pub invariants: Vec<Invariant>,
    /// Every invariant a defense detected (stopped) on some seed, sorted.
    pub detected: Vec<Invariant>,
}

/// Run one configuration against one hazard on seeds `0..seeds`, on the default
/// (one-sided) transport under the careful router.
pub fn cell(
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(
        KvTransport::default(),
        RouterPolicy::Careful,
        config,
        d,
        hazard,
        seeds,
    )
}

/// [`cell`] on `transport`.
pub fn cell_on(
    transport: KvTransport,
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(transport, RouterPolicy::Careful, config, d, hazard, seeds)
}

/// [`cell`] under `router`.
pub fn cell_under(
    config: &'static str,
    d: Defenses,
    router: RouterPolicy,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(KvTransport::default(), router, config, d, hazard, seeds)
}

/// [`cell`] on `transport` under `router`.
pub fn cell_in(
    transport: KvTransport,
    router: RouterPolicy,
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    let (_, mut sc) = hazard.scenario()?;
    sc.engine.defenses = d;
    sc.engine.router = router;
    sc.routers = vec![router];
    sc.engine.transport = transport;
    // A defense that is off cannot be asked to pass its start-up rule.
    sc.engine.allow_unsafe_pool = sc.engine.allow_unsafe_pool || !d.preflight;
    let mut c = Cell {
        transport,
        config,
        router,
        hazard,
        seeds,
        leaked: 0,
        violated: 0,
        invariants: Vec::new(),
        detected: Vec::new(),
    };
    for seed in 0..seeds {
        let plan = Plan::build(&sc, seed, Some(hazard.bugs()), &Reduction::default())?;
        let out = run_plan(&plan, Backend::Symbolic, false);
        let broken = out.broken();
        c.leaked += u64::from(broken.iter().any(|i| LEAKS.contains(i)));
        c.violated += u64::from(!broken.is_empty());
        for i in broken {
            if !c.invariants.contains(&i) {
                c.invariants.push(i);
            }
        }
        for i in out.detected() {
            if !c.detected.contains(&i) {
                c.detected.push(i);
            }
        }
    }
    c.invariants.sort();
    c.detected.sort();
    Ok(c)
}
