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

use crate::rng::{self, between, between32, chance, log_between, Component};
use crate::scenario::{
    Cancel, CancelAt, CancelHow, FaultSpec, PlannedRequest, ReqPhase, Scenario, ScenarioError,
    SwarmSpec, WorkloadSpec,
};
use crate::stall::{self, ClockRates, PausePlan};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::{EngineConfig, RouterPolicy};
use kvsim_engine::ids::{NodeId, RequestId, TenantId};
use rand::RngExt;
use std::collections::BTreeSet;
use std::fmt::{self, Write};
use strum::{EnumCount, VariantArray};

/// A kind of fault a run may inject.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::EnumCount,
    strum::VariantArray,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum FaultKind {
    /// Control messages held back.
    Delay,
    /// Control messages lost.
    Loss,
    /// Control messages delivered twice.
    Duplicate,
    /// Control messages overtaking each other (latency jitter).
    Reorder,
    /// A prefill and a decode node cut off from each other for a window.
    Partition,
    /// KV writes that take longer.
    SlowWrite,
    /// KV writes that land very late, after aborts and timeouts.
    LateWrite,
    /// KV writes that fail (one among several in flight).
    WriteFail,
    /// Prefill or decode nodes that crash and restart.
    Crash,
    /// Clients that abort or disconnect at a drawn phase of their request.
    Cancel,
    /// Engine timeouts drawn short enough to fire in the middle of work.
    ShortTimeouts,
    /// KV writes landing with a corrupted page (a data fault).
    CorruptWrite,
    /// KV writes with a page landing at another page of the node (a data fault).
    MisdirectWrite,
    /// KV writes whose last page lands in part (a data fault).
    TornWrite,
    /// A prefill node whose every write lands later than any timeout.
    SlowWriter,
    /// Control messages of a room number's previous use redelivered at its reuse.
    StaleReplay,
    StaleDuplicateWrite,
    /// Prefill or decode processes frozen for a window (GC, swap, SIGSTOP).
    Pause,
    /// Each node's clock at its own rate, so timeouts last longer or shorter.
    ClockSkew,
}

impl FaultKind {
    /// Every kind, in the order the swarm draws them. Append only: the order fixes
    /// which numbers of the `FaultLevels` stream each kind gets.
    pub const ALL: [FaultKind; FaultKind::COUNT] = kvsim_engine::every(FaultKind::VARIANTS);

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// `ALL[NEWER..]` are the newer kinds (the data faults, the slow writer, the stale
    /// replays), which a plan's description names only when they are on: most
    /// scenarios never have them.
    const NEWER: usize = 11;

    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s.trim())
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The network's fault rates for one run (all zero: a FIFO link with fixed latency).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetParams {
    pub latency_ns: u64,
    pub jitter_ns: u64,
    pub delay_permille: u32,
    pub delay_max_ns: u64,
    pub loss_permille: u32,
    pub duplicate_permille: u32,
    pub stale_replay_permille: u32,
    pub slow_write_permille: u32,
    pub slow_write_max_ns: u64,
    pub late_write_permille: u32,
    pub late_write_max_ns: u64,
    pub write_fail_permille: u32,
    pub corrupt_write_permille: u32,
    pub misdirect_write_permille: u32,
    pub torn_write_permille: u32,
    pub stale_duplicate_write_permille: u32,
}

/// The bound within which, after the router answered a request, every half it started
/// has answered and let the room's pages go (freed or quarantined), derived from the
/// run's timeouts and network (docs/DETECTION.md, "Bounded cleanup (L6)"):
/// - a control message's longest trip `m` = latency + reorder jitter + the longest
///   injected delay; a KV write's `w` = latency + jitter + the longest slow or late
///   write + the slow writer's lateness;
/// - a start message may still reach a half up to `m` after the answer, and the abort
///   may be lost: a half that hears nothing more ends on its own timer, at the latest
///   the longest of `bootstrap`, `waiting` and the router's `request` timer (which asks
///   the open halves to abort again), then finishes the compute it started (one
///   forward, at most `max_new_tokens_limit` decode steps);
/// - prefill keeps its source pages until its last write completes (`w`, then `m` for
///   the completion's trip).
///
/// So `2m + max(bootstrap, waiting, request) + forward + steps + w`. Quarantine counts
/// as let go: a drain ack may take longer (defense 3 waits for it, and a node that
/// never gets one stops loudly).
pub fn derived_cleanup_bound_ns(
    engine: &kvsim_engine::config::EngineConfig,
    net: &NetParams,
    slow_writer_ns: u64,
) -> u64 {
    let t = &engine.timeouts;
    let l = &engine.latencies;
    let m = net
        .latency_ns
        .saturating_add(net.jitter_ns)
        .saturating_add(net.delay_max_ns);
    let w = net
        .latency_ns
        .saturating_add(net.jitter_ns)
        .saturating_add(net.slow_write_max_ns.max(net.late_write_max_ns))
        .saturating_add(slow_writer_ns);
    let timer = t.bootstrap_ns.max(t.waiting_ns).max(t.request_ns);
    let steps = l
        .decode_step_ns
        .saturating_mul(u64::from(engine.max_new_tokens_limit));
    m.saturating_mul(2)
        .saturating_add(timer)
        .saturating_add(l.prefill_forward_ns)
        .saturating_add(steps)
        .saturating_add(w)
}

/// A window in which a prefill and a decode node cannot reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub prefill: NodeId,
    pub decode: NodeId,
    pub from_ns: u64,
    pub until_ns: u64,
}

/// A node crash and its restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub node: NodeId,
    pub at_ns: u64,
    pub restart_ns: u64,
}

/// A smaller run carved out of a seed's plan: the shrinker's output, and what
/// `--reduce` replays. Empty means the plan as drawn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reduction {
    /// Keep only these requests (by id); `None` keeps all.
    pub keep: Option<Vec<RequestId>>,
    /// Fault kinds turned off.
    pub off: BTreeSet<FaultKind>,
    /// Heal the faults this early (never later than drawn).
    pub safety_ns: Option<u64>,
}

impl Reduction {
    pub fn is_empty(&self) -> bool {
        self.keep.is_none() && self.off.is_empty() && self.safety_ns.is_none()
    }

    /// Parse `keep=0,3,7;off=loss,crash;safety-ms=1200` (any part may be left out).
    pub fn parse(spec: &str) -> Result<Reduction, ScenarioError> {
        let bad = |reason: String| ScenarioError::Invalid {
            field: "--reduce".into(),
            reason,
        };
        let mut r = Reduction::default();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, val) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            match key.trim() {
                "keep" => {
                    let mut ids = Vec::new();
                    for x in val.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                        let n: u64 = x
                            .trim_start_matches("req")
                            .parse()
                            .map_err(|_| bad(format!("`{x}` is not a request number")))?;
                        ids.push(RequestId(n));
                    }
                    ids.sort();
                    ids.dedup();
                    r.keep = Some(ids);
                }
                "off" => {
                    for x in val.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                        let k = FaultKind::parse(x).ok_or_else(|| {
                            bad(format!(
                                "unknown fault kind `{x}` (known: {})",
                                FaultKind::ALL.map(FaultKind::name).join(", ")
                            ))
                        })?;
                        r.off.insert(k);
                    }
                }
                "safety-ms" => {
                    let ms: u64 = val
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("`{val}` is not a number of milliseconds")))?;
                    r.safety_ns = Some(ms.saturating_mul(1_000_000));
                }
                other => {
                    return Err(bad(format!(
                        "unknown key `{other}` (known: keep, off, safety-ms)"
                    )))
                }
            }
        }
        Ok(r)
    }
}

impl fmt::Display for Reduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(keep) = &self.keep {
            let ids: Vec<String> = keep.iter().map(|r| r.0.to_string()).collect();
            parts.push(format!("keep={}", ids.join(",")));
        }
        if !self.off.is_empty() {
            let off: Vec<&str> = self.off.iter().map(|k| k.name()).collect();
            parts.push(format!("off={}", off.join(",")));
        }
        if let Some(ns) = self.safety_ns {
            parts.push(format!("safety-ms={}", ns / 1_000_000));
        }
        f.write_str(&parts.join(";"))
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
    /// when it states none, [`derived_cleanup_bound_ns`] of the seed's timeouts and
    /// network. Always set: L6 is judged in every run.
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

/// The drawn fault levels of one plan: which kinds are on and how hard.
struct Levels(Vec<(FaultKind, u32)>);

impl Levels {
    /// The level of `k`, if it is on.
    fn of(&self, k: FaultKind) -> Option<u32> {
        self.0.iter().find(|(x, _)| *x == k).map(|(_, l)| *l)
    }

    /// `max` scaled by the level of `k` (0 when it is off).
    fn scale(&self, max: u64, k: FaultKind) -> u64 {
        self.of(k)
            .map_or(0, |l| max.saturating_mul(u64::from(l)) / 1000)
    }

    fn scale32(&self, max: u32, k: FaultKind) -> u32 {
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
    }
}

/// The router policy and its seed: two draws, always.
fn draw_router(sc: &Scenario, seed: u64, engine: &mut EngineConfig) {
    let mut r = rng::stream(seed, Component::Router);
    let pick = r.random_range(0..1024u32) as usize;
    engine.router_seed = r.random::<u64>();
    let routers: &[RouterPolicy] = match (&sc.swarm, sc.routers.is_empty()) {
        (_, false) => &sc.routers,
        (Some(_), true) => &RouterPolicy::ALL,
        (None, true) => &[],
    };
    if !routers.is_empty() {
        engine.router = routers[pick % routers.len()];
    }
}

/// The pool sizes of the prefill and decode nodes, as written or drawn by the swarm
/// with the engine limits it draws; each pool passes the engine's preflight.
fn draw_topology(
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
fn draw_levels(sc: &Scenario, seed: u64, reduction: &Reduction) -> Levels {
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
fn draw_timeouts(fs: &FaultSpec, seed: u64, level: u32, engine: &mut EngineConfig) {
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
fn draw_cancels(fs: &FaultSpec, seed: u64, share: u32, requests: &mut [PlannedRequest]) {
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
fn draw_slow_writer(fs: &FaultSpec, seed: u64, np: u16, levels: &Levels) -> (NodeId, u64) {
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
fn draw_partitions(
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
fn draw_crashes(
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
fn node_ids(np: u16, nd: u16) -> (Vec<NodeId>, Vec<NodeId>) {
    (
        (1..=np).map(NodeId).collect(),
        (np + 1..=np + nd).map(NodeId).collect(),
    )
}

/// The bounded-cleanup bound (L6): the scenario's, or the one derived from the
/// seed's timeouts and network, stretched by the slowest clock and lengthened by
/// every pause.
fn cleanup_bound(
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
fn draw_stalls(
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
fn net_params(sc: &Scenario, lv: &Levels) -> NetParams {
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
fn workload(
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
fn heal_at_ns(sc: &Scenario, reduction: &Reduction, requests: &[PlannedRequest]) -> u64 {
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
fn deadline_ns(sc: &Scenario, heal_at: u64, requests: &[PlannedRequest]) -> u64 {
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
fn keep_requests(
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

impl Plan {
    /// Draw the plan of `seed` from `sc`, with `bugs` replacing the scenario's bug
    /// switches when given, then apply `reduction`.
    pub fn build(
        sc: &Scenario,
        seed: u64,
        bugs: Option<BugSet>,
        reduction: &Reduction,
    ) -> Result<Plan, ScenarioError> {
        sc.validate()?;
        let mut engine = sc.engine.clone();
        if let Some(b) = bugs {
            engine.bugs = b;
        }
        draw_router(sc, seed, &mut engine);
        let (prefill_pools, decode_pools) = draw_topology(sc, seed, &mut engine)?;
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

    /// The draw, as the few lines a failure report starts with.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let what = if self.swarm { "swarm draw" } else { "plan" };
        let _ = writeln!(out, "{what} for seed {} of {}:", self.seed, self.scenario);
        self.describe_topology(&mut out);
        self.describe_engine(&mut out);
        self.describe_workload(&mut out);
        self.describe_faults(&mut out);
        self.describe_phases(&mut out);
        if !self.reduction.is_empty() {
            let _ = writeln!(out, "  reduced:  {}", self.reduction);
        }
        out
    }

    /// The `topology:` line: the pools, a `*` on those below the context.
    fn describe_topology(&self, out: &mut String) {
        let e = &self.engine;
        let ps = u64::from(e.page_size);
        let pools = |ids: Vec<NodeId>, pools: &[u32]| -> String {
            ids.iter()
                .zip(pools)
                .map(|(id, p)| {
                    let small = u64::from(*p) * ps < e.context_len;
                    format!("{id} {p}p{}", if small { "*" } else { "" })
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "  topology: {} prefill ({}), {} decode ({}); page {} tokens, context {} tokens{}",
            self.prefill_pools.len(),
            pools(self.prefill_ids(), &self.prefill_pools),
            self.decode_pools.len(),
            pools(self.decode_ids(), &self.decode_pools),
            e.page_size,
            e.context_len,
            if e.allow_unsafe_pool {
                " (* pool below the context: the unsafe configuration, on purpose)"
            } else {
                ""
            }
        );
    }

    /// The `engine:` line: the router, the limits, the timeouts and the bug switches.
    fn describe_engine(&self, out: &mut String) {
        let e = &self.engine;
        let t = &e.timeouts;
        let _ = writeln!(
            out,
            "  engine:   {}chunk {} pages, {} writes in flight, {} rooms, batch {}; timeouts bootstrap {}, waiting {}, request {}, drain retry {} x{}; bugs {}",
            match e.router {
                RouterPolicy::Careful => String::new(),
                other => format!("router {}; ", other.name()),
            },
            e.chunk_pages,
            e.max_inflight_chunks,
            e.max_rooms,
            e.max_batch,
            ms(t.bootstrap_ns),
            ms(t.waiting_ns),
            ms(t.request_ns),
            ms(t.drain_retry_ns),
            t.drain_retries,
            e.bugs
        );
    }

    /// The `workload:` line: how many requests, their sizes, over-length and cancels.
    fn describe_workload(&self, out: &mut String) {
        let e = &self.engine;
        let ps = u64::from(e.page_size);
        let over = self
            .requests
            .iter()
            .filter(|r| {
                let need = r.prompt_len;
                self.prefill_pools
                    .iter()
                    .chain(&self.decode_pools)
                    .any(|&p| need > e.context_len.min(u64::from(p) * ps))
            })
            .count();
        let cancels = |how: CancelHow| {
            self.requests
                .iter()
                .filter(|r| r.cancel.is_some_and(|c| c.how == how))
                .count()
        };
        let (plo, phi) = self.requests.iter().fold((u64::MAX, 0), |(lo, hi), r| {
            (lo.min(r.prompt_len), hi.max(r.prompt_len))
        });
        let last = self.requests.iter().map(|r| r.at_ns).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  workload: {} requests from {} tenants over {}; prompts {}..{} tokens; {} over-length; {} client aborts, {} disconnects",
            self.requests.len(),
            self.tenants,
            ms(last),
            if plo == u64::MAX { 0 } else { plo },
            phi,
            over,
            cancels(CancelHow::Abort),
            cancels(CancelHow::Disconnect)
        );
    }

    /// The `faults:` line, then one line per partition window and crash.
    fn describe_faults(&self, out: &mut String) {
        let mut faults = Vec::new();
        for k in FaultKind::ALL {
            match self.level(k) {
                Some(level) => faults.push(self.fault_text(k, level)),
                None if !FaultKind::ALL[FaultKind::NEWER..].contains(&k) => {
                    faults.push(format!("{k} off"))
                }
                None => {}
            }
        }
        let _ = writeln!(out, "  faults:   {}", faults.join(", "));
        for p in &self.partitions {
            let _ = writeln!(
                out,
                "            partition {} | {} from {} to {}",
                p.prefill,
                p.decode,
                ms(p.from_ns),
                ms(p.until_ns)
            );
        }
        for c in &self.crashes {
            let _ = writeln!(
                out,
                "            crash {} at {}, restart at {}",
                c.node,
                ms(c.at_ns),
                ms(c.restart_ns)
            );
        }
        for p in &self.pauses {
            let when = if p.on_transfer {
                "at its first transfer step after"
            } else {
                "at"
            };
            let _ = writeln!(
                out,
                "            pause {} {when} {}, for {}",
                p.node,
                ms(p.at_ns),
                ms(p.len_ns)
            );
        }
    }

    /// One fault kind that is on, with its drawn rates.
    fn fault_text(&self, k: FaultKind, level: u32) -> String {
        let n = &self.net;
        match k {
            FaultKind::Delay => {
                format!("delay {}‰ up to {}", n.delay_permille, ms(n.delay_max_ns))
            }
            FaultKind::Loss => format!("loss {}‰", n.loss_permille),
            FaultKind::Duplicate => format!("duplicate {}‰", n.duplicate_permille),
            FaultKind::Reorder => format!("reorder jitter {}", ms(n.jitter_ns)),
            FaultKind::Partition => format!("partition x{}", self.partitions.len()),
            FaultKind::SlowWrite => format!(
                "slow-write {}‰ up to {}",
                n.slow_write_permille,
                ms(n.slow_write_max_ns)
            ),
            FaultKind::LateWrite => format!(
                "late-write {}‰ up to {}",
                n.late_write_permille,
                ms(n.late_write_max_ns)
            ),
            FaultKind::WriteFail => format!("write-fail {}‰", n.write_fail_permille),
            FaultKind::Crash => format!("crash x{}", self.crashes.len()),
            FaultKind::Cancel => format!("cancel level {level}‰"),
            FaultKind::ShortTimeouts => format!("short-timeouts level {level}‰"),
            FaultKind::CorruptWrite => format!("corrupt-write {}‰", n.corrupt_write_permille),
            FaultKind::MisdirectWrite => {
                format!("misdirect-write {}‰", n.misdirect_write_permille)
            }
            FaultKind::TornWrite => format!("torn-write {}‰", n.torn_write_permille),
            FaultKind::StaleReplay => format!("stale-replay {}‰", n.stale_replay_permille),
            FaultKind::StaleDuplicateWrite => format!(
                "stale-duplicate-write {}‰",
                n.stale_duplicate_write_permille
            ),
            FaultKind::Pause => format!("pause x{}", self.pauses.len()),
            FaultKind::ClockSkew => match self.clocks.describe() {
                s if s.is_empty() => "clock-skew (every clock true)".into(),
                s => format!("clock-skew {s}"),
            },
            FaultKind::SlowWriter => match self.slow_writer {
                Some((node, ns)) => format!("slow-writer {node} +{}", ms(ns)),
                None => "slow-writer off".into(),
            },
        }
    }

    /// The `phases:` line: when faults heal and when everything must have drained.
    fn describe_phases(&self, out: &mut String) {
        match self.heal_at_ns {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "  phases:   safety (faults on) until {}, then liveness: everything drained by {}",
                    ms(h),
                    ms(self.deadline_ns)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  phases:   no faults; everything drained by {}",
                    ms(self.deadline_ns)
                );
            }
        }
    }
}

/// Nanoseconds as a short human duration.
pub fn ms(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!(
            "{}.{:03}s",
            ns / 1_000_000_000,
            (ns % 1_000_000_000) / 1_000_000
        )
    } else if ns >= 1_000_000 {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns / 1_000)
    }
}
