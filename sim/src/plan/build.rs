//! [`Plan`]: everything one run does, drawn from a scenario and a seed, and the
//! accessors the simulator reads. The per-part draws live in `draw`; the
//! human-readable description in `describe`.

use crate::plan::draw::{
    cleanup_bound, deadline_ns, draw_cancels, draw_crashes, draw_levels, draw_partitions,
    draw_router, draw_slow_writer, draw_stalls, draw_timeouts, draw_topology, heal_at_ns,
    keep_requests, net_params, node_ids, workload,
};
use crate::plan::fault::{CrashPlan, FaultKind, NetParams, Partition};
use crate::plan::reduction::Reduction;
use crate::scenario::{PlannedRequest, Scenario, ScenarioError};
use crate::stall::{ClockRates, PausePlan};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::NodeId;

/// What a scenario deploys for one seed, and nothing of a run: the engine (the drawn
/// router and topology limits, the run's bug switches) and each node's pool, with no
/// workload and no fault drawn. `kvsim serve` deploys it (real faults are the fault
/// bed's, not the simulator's draws), so the server links no fault drawing;
/// [`Plan::build`] starts from it.
#[derive(Clone, Debug)]
pub struct Deployment {
    pub scenario: String,
    pub seed: u64,
    pub engine: EngineConfig,
    pub prefill_pools: Vec<u32>,
    pub decode_pools: Vec<u32>,
    /// Each prefill and decode node behind its worker front (`topology.worker_mode`).
    pub worker_mode: bool,
}

impl Deployment {
    /// Draw the deployment of `seed` from `sc`, with `bugs` replacing the scenario's
    /// bug switches when given. The engine is not validated here: a run validates it
    /// once its timeouts are drawn ([`Plan::build`]), a server before it starts.
    pub fn draw(sc: &Scenario, seed: u64, bugs: Option<BugSet>) -> Result<Self, ScenarioError> {
        sc.validate()?;
        let mut engine = sc.engine.clone();
        if let Some(b) = bugs {
            engine.bugs = b;
        }
        draw_router(sc, seed, &mut engine);
        let (prefill_pools, decode_pools) = draw_topology(sc, seed, &mut engine)?;
        Ok(Deployment {
            scenario: sc.name.clone(),
            seed,
            engine,
            prefill_pools,
            decode_pools,
            worker_mode: sc.topology.worker_mode,
        })
    }
}

/// One concrete run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub scenario: String,
    pub seed: u64,
    /// The engine config with the drawn limits and timeouts and the run's bug switches.
    pub engine: EngineConfig,
    pub prefill_pools: Vec<u32>,
    pub decode_pools: Vec<u32>,
    /// Each prefill and decode node behind its worker front (`topology.worker_mode`).
    pub worker_mode: bool,
    pub net: NetParams,
    pub partitions: Vec<Partition>,
    /// The slow writer: a prefill node and how late each of its writes lands during
    /// the safety phase.
    pub slow_writer: Option<(NodeId, u64)>,
    pub crashes: Vec<CrashPlan>,
    /// Nodes frozen for a window, in time order ([`crate::stall`]).
    pub pauses: Vec<PausePlan>,
    /// Each node's clock rate (empty: every clock true).
    pub clocks: ClockRates,
    pub requests: Vec<PlannedRequest>,
    /// When faults heal; `None` for a fault-free scenario.
    pub heal_at_ns: Option<u64>,
    /// Everything must have drained by this instant.
    pub deadline_ns: u64,
    /// The bounded-cleanup bound (L6): the scenario's `run.cleanup_bound_ms`, or,
    /// when it states none,
    /// [`derived_cleanup_bound_ns`](crate::plan::derived_cleanup_bound_ns) of the
    /// seed's timeouts and network. Always set: L6 is judged in every run.
    pub cleanup_bound_ns: Option<u64>,
    pub max_events: u64,
    /// The fault kinds that are on, with their level (per mille of the scenario's
    /// maximum; 0 is on but harmless).
    pub levels: Vec<(FaultKind, u32)>,
    /// Drawn by a swarm (rather than taken as written).
    pub swarm: bool,
    pub tenants: u32,
    pub reduction: Reduction,
    /// The scenario's `--faults` overlays ([`Scenario::overlay_faults`]).
    pub fault_overlay: Vec<String>,
}

impl Plan {
    /// Draw the plan of `seed` from `sc`, with `bugs` replacing the scenario's bug
    /// switches when given, then apply `reduction`.
    pub fn build(
        sc: &Scenario,
        seed: u64,
        bugs: Option<BugSet>,
        reduction: &Reduction,
    ) -> Result<Plan, ScenarioError> {
        let Deployment {
            mut engine,
            prefill_pools,
            decode_pools,
            worker_mode,
            ..
        } = Deployment::draw(sc, seed, bugs)?;
        let np = prefill_pools.len() as u16;
        let (prefill_ids, decode_ids) = node_ids(np, decode_pools.len() as u16);
        let fs = &sc.faults;
        let levels = draw_levels(sc, seed, reduction);
        if let Some(l) = levels.of(FaultKind::ShortTimeouts) {
            draw_timeouts(fs, seed, l, &mut engine);
        }

        let pools = (&prefill_pools[..], &decode_pools[..]);
        let (mut requests, tenants) = workload(sc, seed, &engine, pools);
        let heal_at = heal_at_ns(sc, reduction, &requests);

        if levels.of(FaultKind::Cancel).is_some() {
            let share = levels.scale32(fs.cancel_permille, FaultKind::Cancel);
            draw_cancels(fs, seed, share, &mut requests);
        }
        let slow_writer = levels
            .of(FaultKind::SlowWriter)
            .map(|_| draw_slow_writer(fs, seed, np, &levels));
        let partitions = draw_partitions(fs, seed, (&prefill_ids, &decode_ids), heal_at, &levels);
        let all: Vec<NodeId> = prefill_ids.iter().chain(&decode_ids).copied().collect();
        let crashes = draw_crashes(fs, seed, &all, heal_at, &levels);
        let (pauses, clocks) = draw_stalls(fs, seed, &all, heal_at, &levels);
        let net = net_params(sc, &levels);
        if let Some(keep) = &reduction.keep {
            keep_requests(keep, seed, &mut requests)?;
        }

        let deadline_ns = deadline_ns(sc, heal_at, &requests);
        engine.validate()?;
        let stalls = (&pauses[..], &clocks);
        let cleanup_bound_ns = cleanup_bound(sc, &engine, &net, slow_writer, stalls);
        Ok(Plan {
            scenario: sc.name.clone(),
            seed,
            engine,
            prefill_pools,
            decode_pools,
            worker_mode,
            net,
            partitions,
            slow_writer,
            crashes,
            pauses,
            clocks,
            requests,
            heal_at_ns: (!levels.0.is_empty()).then_some(heal_at),
            deadline_ns,
            cleanup_bound_ns: Some(cleanup_bound_ns),
            max_events: sc.run.max_events,
            levels: levels.0,
            swarm: sc.swarm.is_some(),
            tenants,
            reduction: reduction.clone(),
            fault_overlay: sc.fault_overlay.clone(),
        })
    }

    pub fn prefill_ids(&self) -> Vec<NodeId> {
        (1..=self.prefill_pools.len() as u16).map(NodeId).collect()
    }

    pub fn decode_ids(&self) -> Vec<NodeId> {
        let np = self.prefill_pools.len() as u16;
        (np + 1..=np + self.decode_pools.len() as u16)
            .map(NodeId)
            .collect()
    }

    /// The level of a fault kind, if it is on.
    pub fn level(&self, k: FaultKind) -> Option<u32> {
        self.levels.iter().find(|(x, _)| *x == k).map(|(_, l)| *l)
    }
}
