//! kvsim-sim: deterministic drivers for the kvsim engine.
//!
//! [`world::World`] runs a [`scenario::Scenario`] through the engine's own nodes on a
//! virtual clock, with the [`oracle::Oracle`] checking the invariants of DESIGN.md
//! section 4 after every event. [`run_scenario`] is the one entry point the CLI and the
//! tests use.

pub mod oracle;
pub mod report;
pub mod scenario;
pub mod world;

use kvsim_engine::bugs::BugSet;
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu};
use kvsim_engine::ids::RequestId;
use kvsim_engine::invariant::Invariant;
use oracle::{Finding, Leak};
use scenario::{PlannedRequest, Scenario, ScenarioError};
use std::collections::BTreeMap;
use world::{ClientReply, TraceLine, World};

/// Which KV backend a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Backend {
    /// Tokens plus provenance: fast, and the white-box S3 oracle can read it.
    Symbolic,
    /// Real f32 echo attention on the CPU (black-box canary check only).
    Host,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub scenario: String,
    pub seed: u64,
    pub bugs: BugSet,
    pub requests: Vec<PlannedRequest>,
    pub replies: BTreeMap<RequestId, Vec<ClientReply>>,
    pub findings: Vec<Finding>,
    pub leaks: Vec<Leak>,
    pub events: u64,
    pub sim_ns: u64,
    pub trace: Vec<TraceLine>,
}

impl RunOutcome {
    pub fn clean(&self) -> bool {
        self.findings.is_empty()
    }
    pub fn broken(&self) -> Vec<Invariant> {
        report::distinct(&self.findings)
    }
}

/// Options of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: Option<u64>,
    /// Replace the scenario's bug switches.
    pub bugs: Option<BugSet>,
    pub backend: Backend,
    pub trace: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: None,
            bugs: None,
            backend: Backend::Symbolic,
            trace: false,
        }
    }
}

fn run_with<G: Gpu>(
    sc: &Scenario,
    make: impl Fn(u32, u32) -> G,
    trace: bool,
    seed: u64,
) -> Result<RunOutcome, ScenarioError> {
    let requests = sc.planned_requests();
    let mut w = World::new(sc, requests.clone(), make, trace)?;
    w.run();
    Ok(RunOutcome {
        scenario: sc.name.clone(),
        seed,
        bugs: sc.engine.bugs,
        requests,
        replies: w.replies().clone(),
        findings: w.oracle().findings().to_vec(),
        leaks: w.oracle().leaks.clone(),
        events: w.events(),
        sim_ns: w.now_ns(),
        trace: w.take_log(),
    })
}

/// Run one scenario end to end and check it.
pub fn run_scenario(sc: &Scenario, opts: &RunOptions) -> Result<RunOutcome, ScenarioError> {
    let mut sc = sc.clone();
    if let Some(b) = opts.bugs {
        sc.engine.bugs = b;
    }
    let seed = opts.seed.unwrap_or(sc.seed);
    sc.seed = seed;
    match opts.backend {
        Backend::Symbolic => run_with(&sc, SymbolicGpu::new, opts.trace, seed),
        Backend::Host => run_with(&sc, HostGpu::new, opts.trace, seed),
    }
}
