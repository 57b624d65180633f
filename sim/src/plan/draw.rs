//! The draws that make a plan from a scenario and a seed: fault levels, topology,
//! router, timeouts, workload, cancels, partitions, crashes, stalls, the heal and
//! the deadline. Each draw reads its own random stream. Not the plan type itself.

use crate::plan::fault::{derived_cleanup_bound_ns, CrashPlan, FaultKind, NetParams, Partition};
use crate::plan::reduction::Reduction;
use crate::rng::{self, between, between32, chance, log_between, Component};
use crate::scenario::{
    Cancel, CancelAt, CancelHow, FaultSpec, PlannedRequest, ReqPhase, Scenario, ScenarioError,
    SwarmSpec, WorkloadSpec,
};
use crate::stall::{self, ClockRates, PausePlan};
use kvsim_engine::config::{EngineConfig, Protocol, RouterPolicy};
use kvsim_engine::ids::{NodeId, RequestId, TenantId};
use rand::RngExt;
use std::collections::BTreeSet;

/// The drawn fault levels of one plan: which kinds are on and how hard.
pub(super) struct Levels(pub(super) Vec<(FaultKind, u32)>);

impl Levels {
    /// The level of `k`, if it is on.
    pub(super) fn of(&self, k: FaultKind) -> Option<u32> {
        self.0.iter().find(|(x, _)| *x == k).map(|(_, l)| *l)
    }

    /// `max` scaled by the level of `k` (0 when it is off).
    fn scale(&self, max: u64, k: FaultKind) -> u64 {
        self.of(k)
            .map_or(0, |l| max.saturating_mul(u64::from(l)) / 1000)
    }

    pub(super) fn scale32(&self, max: u32, k: FaultKind) -> u32 {
        self.scale(u64::from(max), k) as u32
    }
}

/// Whether the scenario gives fault kind `k` anything to inject.
fn configured(fs: &FaultSpec, k: FaultKind) -> bool {
    match k {
        FaultKind::Delay => fs.delay.permille > 0 && fs.delay.max_ms > 0,
        FaultKind::Loss => fs.loss_permille > 0,
        FaultKind::Duplicate => fs.duplicate_permille > 0,
        FaultKind::Reorder => fs.reorder_jitter_us > 0,
        FaultKind::Partition => fs.partition.count > 0 && fs.partition.max_ms > 0,
        FaultKind::SlowWrite => fs.slow_write.permille > 0 && fs.slow_write.max_ms > 0,
        FaultKind::LateWrite => fs.late_write.permille > 0 && fs.late_write.max_ms > 0,
        FaultKind::WriteFail => fs.write_fail_permille > 0,
        FaultKind::Crash => fs.crash.count > 0 && fs.crash.max_ms > 0,
        FaultKind::Cancel => fs.cancel_permille > 0,
        FaultKind::ShortTimeouts => fs.short_timeouts_min_ms > 0,
        FaultKind::CorruptWrite => fs.corrupt_write_permille > 0,
        FaultKind::MisdirectWrite => fs.misdirect_write_permille > 0,
        FaultKind::TornWrite => fs.torn_write_permille > 0,
        FaultKind::SlowWriter => fs.slow_writer_ms > 0,
        FaultKind::StaleReplay => fs.stale_replay_permille > 0,
        FaultKind::StaleDuplicateWrite => fs.stale_duplicate_write_permille > 0,
        FaultKind::Pause => fs.pause.count > 0 && fs.pause.max_ms > 0,
        FaultKind::ClockSkew => fs.clock_skew_permille > 0,
        FaultKind::ClientRoom => fs.client_room_permille > 0,
    }
}

/// The router policy and its seed: two draws, always.
pub(super) fn draw_router(sc: &Scenario, seed: u64, engine: &mut EngineConfig) {
    let mut r = rng::stream(seed, Component::Router);
    let pick = r.random_range(0..1024u32) as usize;
    engine.router_seed = r.random::<u64>();
    // A swarm draws the routers of SGLang's family (its nodes are SGLang's).
    let sglang = RouterPolicy::of(Protocol::Sglang);
    let routers: &[RouterPolicy] = match (&sc.swarm, sc.routers.is_empty()) {
        (_, false) => &sc.routers,
        (Some(_), true) => &sglang,
        (None, true) => &[],
    };
    if !routers.is_empty() {
        engine.router = routers[pick % routers.len()];
    }
}

/// The pool sizes of the prefill and decode nodes, as written or drawn by the swarm
/// with the engine limits it draws; each pool passes the engine's preflight.
pub(super) fn draw_topology(
    sc: &Scenario,
    seed: u64,
    engine: &mut EngineConfig,
) -> Result<(Vec<u32>, Vec<u32>), ScenarioError> {
    let (prefill_pools, decode_pools) = match &sc.swarm {
        None => (
            sc.topology.prefill_pool_pages.clone(),
            sc.topology.decode_pool_pages.clone(),
        ),
        Some(sw) => draw_swarm_topology(sw, seed, engine),
    };
    for (i, &p) in prefill_pools.iter().enumerate() {
        engine.preflight(&format!("prefill node #{i}"), p)?;
    }
    for (i, &p) in decode_pools.iter().enumerate() {
        engine.preflight(&format!("decode node #{i}"), p)?;
    }
    Ok((prefill_pools, decode_pools))
}

fn draw_swarm_topology(
    sw: &SwarmSpec,
    seed: u64,
    engine: &mut EngineConfig,
) -> (Vec<u32>, Vec<u32>) {
    let mut t = rng::stream(seed, Component::Topology);
    let np = between32(&mut t, sw.prefill_nodes);
    let nd = between32(&mut t, sw.decode_nodes);
    let context_pages = engine.pages_for(engine.context_len);
    let pool = |t: &mut rng::Rng| {
        let small = chance(t, sw.pool_below_context_permille);
        let normal = between32(t, sw.pool_pages);
        let below = between(
            t,
            u64::from(sw.small_pool_pages_min),
            context_pages.saturating_sub(1),
        ) as u32;
        if small && u64::from(below) < context_pages {
            below.max(1)
        } else {
            normal
        }
    };
    let p: Vec<u32> = (0..np).map(|_| pool(&mut t)).collect();
    let d: Vec<u32> = (0..nd).map(|_| pool(&mut t)).collect();
    engine.chunk_pages = between32(&mut t, sw.chunk_pages);
    engine.max_inflight_chunks = between32(&mut t, sw.max_inflight_chunks);
    engine.max_rooms = between32(&mut t, sw.max_rooms);
    engine.max_batch = between32(&mut t, sw.max_batch);
    let ps = u64::from(engine.page_size);
    if p.iter()
        .chain(&d)
        .any(|&x| u64::from(x) * ps < engine.context_len)
    {
        // The drawn configuration is the unsafe one on purpose.
        engine.allow_unsafe_pool = true;
    }
    (p, d)
}

/// Which fault kinds are on, and how hard: two draws per kind, always.
pub(super) fn draw_levels(sc: &Scenario, seed: u64, reduction: &Reduction) -> Levels {
    let mut lv = rng::stream(seed, Component::FaultLevels);
    let mut levels = Vec::new();
    for k in FaultKind::ALL {
        let on = lv.random_bool(0.5);
        let level = between(&mut lv, 0, 1000) as u32;
        let on = if sc.swarm.is_some() { on } else { true };
        let level = if sc.swarm.is_some() { level } else { 1000 };
        if on && configured(&sc.faults, k) && !reduction.off.contains(&k) {
            levels.push((k, level));
        }
    }
    Levels(levels)
}

/// Timeouts: each shortened with probability `level`, log-uniformly down to the
/// minimum. The drain-retry budget (retries x interval) is kept, so a short
/// interval means more retries, not an earlier fatal stop.
pub(super) fn draw_timeouts(fs: &FaultSpec, seed: u64, level: u32, engine: &mut EngineConfig) {
    let mut t = rng::stream(seed, Component::Timeouts);
    let min = fs.short_timeouts_min_ms.saturating_mul(1_000_000);
    let to = &mut engine.timeouts;
    let budget = to
        .drain_retry_ns
        .saturating_mul(u64::from(to.drain_retries));
    for v in [
        &mut to.bootstrap_ns,
        &mut to.waiting_ns,
        &mut to.request_ns,
        &mut to.drain_retry_ns,
    ] {
        let short = chance(&mut t, level);
        let drawn = log_between(&mut t, min.min(*v), *v);
        if short {
            *v = drawn.max(1);
        }
    }
    // Within the config's bound, so that every drawn plan validates.
    to.drain_retries = u32::try_from(budget.div_ceil(to.drain_retry_ns))
        .unwrap_or(u32::MAX)
        .min(kvsim_engine::config::MAX_DRAIN_RETRIES)
        .max(to.drain_retries);
}

/// The generated workload, appended to `requests`; returns its number of tenants.
fn draw_workload(
    w: &WorkloadSpec,
    swarm: bool,
    seed: u64,
    engine: &EngineConfig,
    pools: (&[u32], &[u32]),
    requests: &mut Vec<PlannedRequest>,
) -> u32 {
    let mut r = rng::stream(seed, Component::Workload);
    let t_drawn = between(&mut r, 1, u64::from(w.tenants)) as u32;
    let ol_drawn = between(&mut r, 0, u64::from(w.over_length_permille)) as u32;
    let burst_drawn = between(&mut r, 1, u64::from(w.burst)) as u32;
    // Dense seeds stress contention (pools, rooms); sparse ones stretch timers.
    let window_drawn = log_between(&mut r, (w.arrival_ms / 10).max(1), w.arrival_ms.max(1));
    let n_tenants = if swarm { t_drawn } else { w.tenants };
    let over_length = if swarm {
        ol_drawn
    } else {
        w.over_length_permille
    };
    let burst = if swarm { burst_drawn } else { w.burst };
    // Admission limits per node: an over-length prompt exceeds the smallest
    // one and at most a quarter more than the largest, so it is rejected by
    // some nodes and, with asymmetric pools, accepted by others (the
    // incident's shape).
    let ps = u64::from(engine.page_size);
    let limits: Vec<u64> = pools
        .0
        .iter()
        .chain(pools.1)
        .map(|&p| engine.context_len.min(u64::from(p) * ps))
        .collect();
    let lo = limits.iter().copied().min().unwrap_or(1);
    let hi = limits.iter().copied().max().unwrap_or(1);
    let window = if swarm { window_drawn } else { w.arrival_ms }.saturating_mul(1_000_000);
    // Bursts average (1 + burst) / 2 requests: spread their starts over the window.
    // Times are bounded by `Scenario::validate`; the arithmetic saturates all the same.
    let gap_max = window.saturating_mul(1 + u64::from(burst)) / u64::from(w.requests.max(1));
    let mut at = 0u64;
    let mut left_in_burst = 0u32;
    let first = requests.len() as u64;
    for i in 0..u64::from(w.requests) {
        // Same number of draws per request whatever the outcome.
        let gap = between(&mut r, 0, gap_max);
        let size = between(&mut r, 1, u64::from(burst)) as u32;
        let tenant = between(&mut r, 1, u64::from(n_tenants)) as u32;
        let fit = log_between(&mut r, w.prompt_len[0], w.prompt_len[1]);
        let over = chance(&mut r, over_length);
        let long = between(&mut r, lo + 1, (hi + hi / 4).max(lo + 1)).min(1 << 24);
        let new_tokens = between32(&mut r, w.max_new_tokens);
        if left_in_burst == 0 {
            at = at.saturating_add(gap).min(window);
            left_in_burst = size;
        }
        left_in_burst -= 1;
        requests.push(PlannedRequest {
            req: RequestId(first + i),
            tenant: TenantId(tenant),
            prompt_len: if over { long } else { fit },
            max_new_tokens: new_tokens,
            at_ns: at,
            cancel: None,
        });
    }
    n_tenants
}

/// Client cancels: one fixed set of draws per request, `share` per mille hit.
pub(super) fn draw_cancels(fs: &FaultSpec, seed: u64, share: u32, requests: &mut [PlannedRequest]) {
    let mut c = rng::stream(seed, Component::Cancels);
    // A scenario may restrict the phases; the draw picks among those by index.
    let allowed: Vec<ReqPhase> = fs
        .cancel_phases
        .iter()
        .filter_map(|p| ReqPhase::parse(p))
        .collect();
    let phase_of = |i: usize| -> Option<ReqPhase> {
        (!allowed.is_empty()).then(|| allowed[i % allowed.len()])
    };
    for r in requests.iter_mut() {
        let hit = chance(&mut c, share);
        let abort = c.random_bool(0.5);
        let timed = chance(&mut c, 250);
        let after = log_between(&mut c, 1_000, 2_000_000_000);
        let phase_i = between(&mut c, 0, ReqPhase::ALL.len() as u64 - 1) as usize;
        let step = between(&mut c, 0, u64::from(r.max_new_tokens.saturating_sub(1)));
        let immediate = c.random_bool(0.5);
        let delay = log_between(&mut c, 1_000, 50_000_000);
        if !hit || r.cancel.is_some() {
            continue;
        }
        let phase = match (phase_of(phase_i), ReqPhase::ALL[phase_i]) {
            (Some(p), _) => p,
            (None, ReqPhase::Decoding(_)) => ReqPhase::Decoding(step as u32),
            (None, p) => p,
        };
        let timed = timed && fs.cancel_phases.is_empty();
        r.cancel = Some(Cancel {
            how: if abort {
                CancelHow::Abort
            } else {
                CancelHow::Disconnect
            },
            at: if timed {
                CancelAt::AfterNs(after)
            } else {
                CancelAt::Phase {
                    phase,
                    delay_ns: if immediate { 0 } else { delay },
                }
            },
        });
    }
}

/// The slow writer: one prefill node among `np`, its delay scaled by its level.
pub(super) fn draw_slow_writer(
    fs: &FaultSpec,
    seed: u64,
    np: u16,
    levels: &Levels,
) -> (NodeId, u64) {
    let mut r = rng::stream(seed, Component::SlowWriter);
    let i = between(&mut r, 0, u64::from(np) - 1) as u16;
    let late = levels.scale(
        fs.slow_writer_ms.saturating_mul(1_000_000),
        FaultKind::SlowWriter,
    );
    (NodeId(1 + i), late.max(1))
}

/// Partition windows between a prefill and a decode node, inside the safety phase
/// (`heal_at`); none when the kind is off.
pub(super) fn draw_partitions(
    fs: &FaultSpec,
    seed: u64,
    ids: (&[NodeId], &[NodeId]),
    heal_at: u64,
    levels: &Levels,
) -> Vec<Partition> {
    if levels.of(FaultKind::Partition).is_none() {
        return Vec::new();
    }
    let (prefill_ids, decode_ids) = ids;
    let safety = heal_at.max(1);
    let mut p = rng::stream(seed, Component::Partitions);
    let count = between(&mut p, 1, u64::from(fs.partition.count));
    let max = levels
        .scale(
            fs.partition.max_ms.saturating_mul(1_000_000),
            FaultKind::Partition,
        )
        .max(1_000_000);
    let mut partitions = Vec::new();
    for _ in 0..count {
        let pi = between(&mut p, 0, prefill_ids.len() as u64 - 1) as usize;
        let di = between(&mut p, 0, decode_ids.len() as u64 - 1) as usize;
        let from = between(&mut p, 0, safety - 1);
        let len = log_between(&mut p, 1_000_000, max);
        partitions.push(Partition {
            prefill: prefill_ids[pi],
            decode: decode_ids[di],
            from_ns: from,
            until_ns: from.saturating_add(len).min(heal_at),
        });
    }
    partitions.retain(|p| p.from_ns < heal_at);
    partitions
}

/// Node crashes with their restarts, inside the safety phase (`heal_at`), in time
/// order; none when the kind is off.
pub(super) fn draw_crashes(
    fs: &FaultSpec,
    seed: u64,
    all: &[NodeId],
    heal_at: u64,
    levels: &Levels,
) -> Vec<CrashPlan> {
    if levels.of(FaultKind::Crash).is_none() {
        return Vec::new();
    }
    let safety = heal_at.max(1);
    let mut p = rng::stream(seed, Component::Crashes);
    let count = between(&mut p, 1, u64::from(fs.crash.count));
    let max = levels
        .scale(fs.crash.max_ms.saturating_mul(1_000_000), FaultKind::Crash)
        .max(1_000_000);
    let mut crashes = Vec::new();
    for _ in 0..count {
        let ni = between(&mut p, 0, all.len() as u64 - 1) as usize;
        let at = between(&mut p, 0, safety - 1);
        let down = log_between(&mut p, 1_000_000, max);
        if at < heal_at {
            crashes.push(CrashPlan {
                node: all[ni],
                at_ns: at,
                restart_ns: at.saturating_add(down).min(heal_at),
            });
        }
    }
    crashes.sort_by_key(|c| (c.at_ns, c.node));
    crashes
}

/// The prefill node ids (1..=np) and the decode node ids after them.
pub(super) fn node_ids(np: u16, nd: u16) -> (Vec<NodeId>, Vec<NodeId>) {
    (
        (1..=np).map(NodeId).collect(),
        (np + 1..=np + nd).map(NodeId).collect(),
    )
}

/// The bounded-cleanup bound (L6): the scenario's, or the one derived from the
/// seed's timeouts and network, stretched by the slowest clock and lengthened by
/// every pause.
pub(super) fn cleanup_bound(
    sc: &Scenario,
    engine: &EngineConfig,
    net: &NetParams,
    slow_writer: Option<(NodeId, u64)>,
    (pauses, clocks): (&[PausePlan], &ClockRates),
) -> u64 {
    if sc.run.cleanup_bound_ms > 0 {
        return sc.run.cleanup_bound_ms.saturating_mul(1_000_000);
    }
    let calm = derived_cleanup_bound_ns(engine, net, slow_writer.map_or(0, |(_, d)| d));
    clocks
        .slowest_ns(calm)
        .saturating_add(stall::paused_total_ns(pauses))
}

/// The pauses (prefill and decode nodes, inside the safety phase) and every node's
/// clock rate (router included); none when their kind is off.
pub(super) fn draw_stalls(
    fs: &FaultSpec,
    seed: u64,
    all: &[NodeId],
    heal_at: u64,
    levels: &Levels,
) -> (Vec<PausePlan>, ClockRates) {
    let pauses = match levels.of(FaultKind::Pause) {
        None => Vec::new(),
        Some(_) => {
            let max = levels.scale(fs.pause.max_ms.saturating_mul(1_000_000), FaultKind::Pause);
            stall::draw_pauses(fs, seed, all, heal_at, max)
        }
    };
    let clocks = match levels.of(FaultKind::ClockSkew) {
        None => ClockRates::default(),
        Some(_) => {
            let skew = levels.scale32(fs.clock_skew_permille, FaultKind::ClockSkew);
            // The router (node 0) and every prefill and decode node.
            ClockRates::draw(seed, all.len() + 1, skew)
        }
    };
    (pauses, clocks)
}

/// The network's fault rates: the scenario's, scaled by each kind's level.
pub(super) fn net_params(sc: &Scenario, lv: &Levels) -> NetParams {
    let fs = &sc.faults;
    NetParams {
        latency_ns: sc.network.latency_us.saturating_mul(1_000),
        jitter_ns: lv.scale(
            fs.reorder_jitter_us.saturating_mul(1_000),
            FaultKind::Reorder,
        ),
        delay_permille: lv.scale32(fs.delay.permille, FaultKind::Delay),
        delay_max_ns: fs.delay.max_ms.saturating_mul(1_000_000),
        loss_permille: lv.scale32(fs.loss_permille, FaultKind::Loss),
        duplicate_permille: lv.scale32(fs.duplicate_permille, FaultKind::Duplicate),
        stale_replay_permille: lv.scale32(fs.stale_replay_permille, FaultKind::StaleReplay),
        client_room_permille: lv.scale32(fs.client_room_permille, FaultKind::ClientRoom),
        slow_write_permille: lv.scale32(fs.slow_write.permille, FaultKind::SlowWrite),
        slow_write_max_ns: fs.slow_write.max_ms.saturating_mul(1_000_000),
        late_write_permille: lv.scale32(fs.late_write.permille, FaultKind::LateWrite),
        late_write_max_ns: fs.late_write.max_ms.saturating_mul(1_000_000),
        write_fail_permille: lv.scale32(fs.write_fail_permille, FaultKind::WriteFail),
        corrupt_write_permille: lv.scale32(fs.corrupt_write_permille, FaultKind::CorruptWrite),
        misdirect_write_permille: lv
            .scale32(fs.misdirect_write_permille, FaultKind::MisdirectWrite),
        torn_write_permille: lv.scale32(fs.torn_write_permille, FaultKind::TornWrite),
        stale_duplicate_write_permille: lv.scale32(
            fs.stale_duplicate_write_permille,
            FaultKind::StaleDuplicateWrite,
        ),
    }
}

/// The workload: the explicit requests first, then the generated ones; and how many
/// tenants send them.
pub(super) fn workload(
    sc: &Scenario,
    seed: u64,
    engine: &EngineConfig,
    pools: (&[u32], &[u32]),
) -> (Vec<PlannedRequest>, u32) {
    let mut requests = sc.planned_requests();
    let mut tenants = requests
        .iter()
        .map(|r| r.tenant.0)
        .collect::<BTreeSet<_>>()
        .len() as u32;
    if let Some(w) = &sc.workload {
        let drawn = draw_workload(w, sc.swarm.is_some(), seed, engine, pools, &mut requests);
        tenants = tenants.max(drawn);
    }
    (requests, tenants)
}

/// The safety phase ends (faults heal) at the configured time, or at the last
/// submission; a reduction may only bring it forward.
pub(super) fn heal_at_ns(sc: &Scenario, reduction: &Reduction, requests: &[PlannedRequest]) -> u64 {
    let last_arrival = requests.iter().map(|r| r.at_ns).max().unwrap_or(0);
    let drawn_heal = if sc.phases.safety_ms > 0 {
        sc.phases.safety_ms.saturating_mul(1_000_000)
    } else {
        last_arrival
    };
    match reduction.safety_ns {
        Some(s) => s.min(drawn_heal),
        None => drawn_heal,
    }
}

/// Everything must have drained by the end of the liveness phase after the heal and
/// the last kept request, within the run's time bound.
pub(super) fn deadline_ns(sc: &Scenario, heal_at: u64, requests: &[PlannedRequest]) -> u64 {
    let max_time_ns = sc.run.max_time_ms.saturating_mul(1_000_000);
    let last_kept = requests.iter().map(|r| r.at_ns).max().unwrap_or(0);
    if sc.phases.liveness_ms > 0 {
        heal_at
            .max(last_kept)
            .saturating_add(sc.phases.liveness_ms.saturating_mul(1_000_000))
            .min(max_time_ns)
    } else {
        max_time_ns
    }
}

/// Keep only the reduction's requests; a request the seed does not have, or an empty
/// list, is an error.
pub(super) fn keep_requests(
    keep: &[RequestId],
    seed: u64,
    requests: &mut Vec<PlannedRequest>,
) -> Result<(), ScenarioError> {
    // A request the seed does not have would be silently dropped, and a plan
    // with no request checks nothing.
    if let Some(missing) = keep.iter().find(|k| k.0 >= requests.len() as u64) {
        return Err(ScenarioError::Invalid {
            field: "--reduce".into(),
            reason: format!(
                "keep={}: seed {seed} has requests 0..{} only",
                missing.0,
                requests.len()
            ),
        });
    }
    if keep.is_empty() {
        return Err(ScenarioError::Invalid {
            field: "--reduce".into(),
            reason: "keep= lists no request: a run of no request checks nothing".into(),
        });
    }
    requests.retain(|r| keep.binary_search(&r.req).is_ok());
    Ok(())
}
