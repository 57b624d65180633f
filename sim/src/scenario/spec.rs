//! The scenario file's shape: [`Scenario`] and its sections (workload, faults,
//! swarm, phases, topology, network, limits, explicit requests), their defaults,
//! [`ScenarioError`], and the size limits a scenario is held to. Data only: parsing
//! and checking a scenario live in `load` and `validate`.

use kvsim_engine::config::EngineConfig;
use serde::{Deserialize, Serialize};

/// A whole scenario file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A short name, used in reports and replay commands.
    pub name: String,
    /// What the scenario re-creates, in a sentence or two.
    #[serde(default)]
    pub description: String,
    /// The default seed (a command line `--seed` overrides it).
    #[serde(default)]
    pub seed: u64,
    /// The engine configuration shared by all nodes (defenses, bug switches, limits).
    #[serde(default)]
    pub engine: EngineConfig,
    /// The nodes (ignored when `[swarm]` draws them).
    #[serde(default)]
    pub topology: Topology,
    #[serde(default)]
    pub network: NetworkConfig,
    /// Explicit requests, in the order listed.
    #[serde(default)]
    pub requests: Vec<RequestSpec>,
    /// A generated workload, drawn per seed (after the explicit requests).
    #[serde(default)]
    pub workload: Option<WorkloadSpec>,
    /// The faults a run may inject, each at most this hard.
    #[serde(default)]
    pub faults: FaultSpec,
    /// Present: every seed draws which fault kinds are on and how hard, the topology,
    /// pool sizes, engine limits and the workload mix (swarm testing).
    #[serde(default)]
    pub swarm: Option<SwarmSpec>,
    /// The safety phase (faults on) and the liveness bound (faults healed).
    #[serde(default)]
    pub phases: Phases,
    /// Limits on a run.
    #[serde(default)]
    pub run: RunLimits,
    /// The router policies the seeds are drawn among (each seed draws one from its own
    /// stream). Empty: `engine.router` as written, or, under `[swarm]`, every policy.
    #[serde(default)]
    pub routers: Vec<kvsim_engine::RouterPolicy>,
    /// The protocol paths the scenario exists to reach (names of
    /// [`crate::reach::ReachPath`], `kvsim list paths`): a sweep that runs every seed
    /// of its range fails when no seed reached one of them.
    #[serde(default)]
    pub reach: Vec<String>,
    /// `[faults]` settings laid over the file's from the command line (`--faults`),
    /// in order, as written: a replay command repeats them.
    #[serde(skip)]
    pub fault_overlay: Vec<String>,
}

/// A workload generated per seed (`[workload]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Requests per run.
    pub requests: u32,
    /// Most tenants (a swarm draws 1 to this many).
    pub tenants: u32,
    /// Prompt lengths of requests that fit, in tokens (drawn log-uniformly).
    #[serde(deserialize_with = "pair")]
    pub prompt_len: [u64; 2],
    /// Tokens each request asks to generate.
    #[serde(deserialize_with = "pair")]
    pub max_new_tokens: [u32; 2],
    /// Most per-mille of requests whose prompt does not fit some node (a swarm draws
    /// 0 to this; without a swarm, exactly this).
    pub over_length_permille: u32,
    /// Requests are submitted over this window, in milliseconds of simulated time (a
    /// swarm draws a window between a tenth of this and this, log-uniformly).
    pub arrival_ms: u64,
    /// Most requests submitted at the same instant (a burst).
    pub burst: u32,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            requests: 64,
            tenants: 4,
            prompt_len: [1, 512],
            max_new_tokens: [1, 16],
            over_length_permille: 0,
            arrival_ms: 10_000,
            burst: 4,
        }
    }
}

/// A fault that strikes a share of messages or writes, delaying it by up to `max_ms`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TailSpec {
    pub permille: u32,
    pub max_ms: u64,
}

/// A fault that strikes up to `count` times, each lasting up to `max_ms`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowSpec {
    pub count: u32,
    pub max_ms: u64,
}

/// `[faults]`: the most each fault kind may be turned up. Absent or zero means off.
///
/// The fault model is RDMA's: KV writes and their completions ride a reliable
/// connection, so a write may be slow, land late or fail (then it is not applied and
/// its sender gets exactly one failed completion), but it is never lost silently or
/// duplicated. Control messages may be delayed, lost, duplicated and reordered. The
/// client link is the test harness and is never faulted.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSpec {
    /// Control messages held back for up to `max_ms`.
    pub delay: TailSpec,
    /// Per-mille of control messages lost.
    pub loss_permille: u32,
    /// Per-mille of control messages delivered twice.
    pub duplicate_permille: u32,
    /// Per-mille chance, when a reused room number's new use is routed and again when
    /// decode quarantines it, that the control messages of the number's previous use
    /// (up to 8, kept as they were sent) are delivered again: stale duplicates aimed
    /// at the moments generation-blind handling gets wrong.
    pub stale_replay_permille: u32,
    /// Per-mille chance, when a room use is routed, that a client of SGLang's worker
    /// API supplies the same `bootstrap_room` for a request of its own: a start pair
    /// for that room use, from another request with a prompt of the same length,
    /// reaches both halves just after the router's (issue 37, class 2).
    pub client_room_permille: u32,
    /// Every control message gets up to this much extra latency, so messages overtake
    /// each other (reordering), in microseconds.
    pub reorder_jitter_us: u64,
    /// Windows in which a prefill and a decode node cannot reach each other: control
    /// messages between them are dropped and KV writes across them fail.
    pub partition: WindowSpec,
    /// KV writes that take up to `max_ms` longer.
    pub slow_write: TailSpec,
    /// KV writes that land very late (after aborts and timeouts), up to `max_ms`.
    pub late_write: TailSpec,
    /// Per-mille of KV writes that fail (one failed write among several in flight).
    pub write_fail_permille: u32,
    /// A prefill node (drawn per seed) that stays alive but is slower than every
    /// timeout: during the safety phase every KV write it posts lands this many
    /// milliseconds late (and still lands). Set it above decode's waiting timeout plus
    /// its drain-retry budget, and decode times out, asks for the drain until its
    /// budget runs out and gives up loudly while the writes are still coming.
    pub slow_writer_ms: u64,
    /// Per-mille of KV writes that land with one page's payload corrupted (one slot's
    /// token changed), the completion still saying success.
    pub corrupt_write_permille: u32,
    /// Per-mille of KV writes with one page landing at another page of the same node.
    pub misdirect_write_permille: u32,
    /// Per-mille of KV writes whose last page lands only its leading half of slots.
    pub torn_write_permille: u32,
    /// Per-mille of KV writes after which a stale duplicate of an earlier write to
    /// the same node (preferably to one of the same pages) lands again, up to 100 ms
    /// later, with its old id, tags and payload, and no second completion.
    pub stale_duplicate_write_permille: u32,
    /// Prefill or decode nodes that crash and restart after up to `max_ms`.
    pub crash: WindowSpec,
    /// Per-mille of requests whose client aborts or disconnects, at a drawn phase.
    pub cancel_permille: u32,
    /// The phases a drawn cancel may pick (names as in [`ReqPhase::parse`]); empty:
    /// every phase, plus a share of cancels at a drawn time after submission.
    ///
    /// [`ReqPhase::parse`]: crate::scenario::ReqPhase::parse
    pub cancel_phases: Vec<String>,
    /// Draw every engine timeout short (down to this many milliseconds) so that
    /// timeouts fire in the middle of transfers. 0 keeps the configured timeouts.
    pub short_timeouts_min_ms: u64,
    /// Prefill or decode processes frozen (a GC pause, a long kernel, swap, SIGSTOP),
    /// up to `count` times, each for up to `max_ms`: nothing in the node runs, its
    /// timers fire late (at the wake), and control messages and KV write completions
    /// for it wait in its receive queues; KV writes into its memory still land on a
    /// one-sided transport (the NIC needs no process) and wait on a two-sided one (the
    /// receiver's thread copies them). The other nodes' clocks run on.
    pub pause: WindowSpec,
    /// Each node's clock (router, prefill and decode) runs at a rate drawn up to this
    /// many per mille fast or slow, so each node's timeouts last longer or shorter
    /// than configured, each by its own factor. Offsets between clocks need no fault:
    /// the engine compares no timestamps across nodes (every timeout is a duration
    /// timer the node set itself), so an offset cannot change what it does. At most
    /// 900.
    pub clock_skew_permille: u32,
}

/// `[swarm]`: what each seed draws besides the faults. Ranges are inclusive.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwarmSpec {
    #[serde(deserialize_with = "pair")]
    pub prefill_nodes: [u32; 2],
    #[serde(deserialize_with = "pair")]
    pub decode_nodes: [u32; 2],
    /// Pool size of each node, in pages, when it holds the context.
    #[serde(deserialize_with = "pair")]
    pub pool_pages: [u32; 2],
    /// Per-mille of nodes drawn with a pool smaller than the context (the GLM-5.3
    /// configuration; the run then sets `allow_unsafe_pool`).
    pub pool_below_context_permille: u32,
    /// The smallest such pool, in pages.
    pub small_pool_pages_min: u32,
    #[serde(deserialize_with = "pair")]
    pub chunk_pages: [u32; 2],
    #[serde(deserialize_with = "pair")]
    pub max_inflight_chunks: [u32; 2],
    #[serde(deserialize_with = "pair")]
    pub max_rooms: [u32; 2],
    #[serde(deserialize_with = "pair")]
    pub max_batch: [u32; 2],
}

impl Default for SwarmSpec {
    fn default() -> Self {
        SwarmSpec {
            prefill_nodes: [1, 2],
            decode_nodes: [1, 2],
            pool_pages: [64, 256],
            pool_below_context_permille: 0,
            small_pool_pages_min: 8,
            chunk_pages: [1, 8],
            max_inflight_chunks: [1, 4],
            max_rooms: [4, 64],
            max_batch: [1, 16],
        }
    }
}

/// `[phases]`: a safety phase with faults on, then a liveness phase with faults
/// healed in which everything must drain within `liveness_ms`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Phases {
    /// Faults heal (partitions end, crashed nodes restart, no new message or write
    /// faults) this long into the run. 0: at the last submission.
    pub safety_ms: u64,
    /// After healing, every request must be answered and every room, quarantine and
    /// pool drained within this much simulated time. 0: only `run.max_time_ms` bounds it.
    pub liveness_ms: u64,
}

/// Nodes and their pool sizes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Pool size in pages of each prefill node (one entry per node).
    pub prefill_pool_pages: Vec<u32>,
    /// Pool size in pages of each decode node (one entry per node).
    pub decode_pool_pages: Vec<u32>,
    /// Worker mode: each prefill and decode node sits behind its SGLang worker
    /// front, which the router (policy `sglang-router`) reaches it through
    /// (`Topology::build_behind_fronts`). Off by default.
    #[serde(default)]
    pub worker_mode: bool,
}

/// The network between nodes: FIFO per link with a fixed latency.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    pub latency_us: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig { latency_us: 50 }
    }
}

/// Bounds on one run (a limit on everything).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunLimits {
    /// Most events one run may process before it is declared stuck.
    pub max_events: u64,
    /// Simulated time after which the run is declared stuck, in milliseconds.
    pub max_time_ms: u64,
    /// Bounded cleanup (L6): after a request's terminal answer, every node must stop
    /// work for it and free or quarantine its pages within this many milliseconds of
    /// simulated time. 0: not checked.
    pub cleanup_bound_ms: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_events: 5_000_000,
            max_time_ms: 600_000,
            cleanup_bound_ms: 0,
        }
    }
}

/// One request (or `repeat` identical ones) of the workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    pub tenant: u32,
    pub prompt_len: u64,
    #[serde(default = "default_new_tokens")]
    pub max_new_tokens: u32,
    /// Submit time, in microseconds of simulated time.
    #[serde(default)]
    pub at_us: u64,
    /// Submit this many copies, `every_us` apart.
    #[serde(default = "one")]
    pub repeat: u32,
    #[serde(default)]
    pub every_us: u64,
    /// The client disconnects this long after submitting (none if absent).
    #[serde(default)]
    pub cancel_after_us: Option<u64>,
    /// The client disconnects when the request reaches this phase (see
    /// [`ReqPhase::parse`]), `cancel_delay_us` later.
    ///
    /// [`ReqPhase::parse`]: crate::scenario::ReqPhase::parse
    #[serde(default)]
    pub cancel_on: Option<String>,
    #[serde(default)]
    pub cancel_delay_us: u64,
}

/// A `[low, high]` range: exactly two values (a fixed-size array would silently
/// ignore a third).
fn pair<'de, D, T>(d: D) -> Result<[T; 2], D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v: Vec<T> = Vec::deserialize(d)?;
    let len = v.len();
    <[T; 2]>::try_from(v).map_err(|_| {
        serde::de::Error::custom(format!("expected exactly 2 values [low, high], got {len}"))
    })
}

fn default_new_tokens() -> u32 {
    16
}
fn one() -> u32 {
    1
}

/// A scenario that cannot be loaded or run, naming the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    #[error("cannot read scenario {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario {path}: {message}")]
    Parse { path: String, message: String },
    #[error("scenario {path} is larger than {limit} bytes, the most a scenario file may hold")]
    TooLarge { path: String, limit: u64 },
    #[error("scenario field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    // Not a `source`: the message already holds the config error, and a source would
    // print it a second time in an error chain.
    #[error("scenario field `engine`: {0}")]
    Engine(kvsim_engine::config::ConfigError),
    #[error(
        "the scenario needs about {mib} MiB of KV memory ({pages} pages of {page_size} tokens \
         over its nodes, {backend} backend); the budget is {budget_mib} MiB per run: shrink \
         the pools, `page_size` or the node counts"
    )]
    TooMuchMemory {
        mib: u64,
        pages: u64,
        page_size: u32,
        backend: &'static str,
        budget_mib: u64,
    },
    #[error(
        "the scenario asks for about {tokens} prompt and generated tokens per run ({requests} \
         requests), more than the budget of {budget} tokens per run (minutes of work or more, \
         with no output meanwhile); pass --allow-expensive to run it anyway"
    )]
    Expensive {
        tokens: u64,
        requests: u64,
        budget: u64,
    },
}

impl From<kvsim_engine::config::ConfigError> for ScenarioError {
    fn from(e: kvsim_engine::config::ConfigError) -> Self {
        ScenarioError::Engine(e)
    }
}

/// The longest simulated time any duration of a scenario may name, in milliseconds
/// (30 days). Every sum of such times a run computes then stays far inside a `u64` of
/// nanoseconds, so no time arithmetic can overflow.
pub const MAX_TIME_MS: u64 = 30 * 24 * 3600 * 1000;

/// The most KV memory one run may allocate, in bytes, over all its nodes.
pub const MAX_KV_BYTES: u64 = 4 << 30;

/// The most prompt plus generated tokens one run may ask for before it needs
/// `--allow-expensive` (about a minute of work at the simulator's speed).
pub const COST_BUDGET_TOKENS: u64 = 1 << 27;

/// The bytes of KV memory a node's pool of one page takes: symbolic (a token and its
/// provenance per slot) or host (f32 keys and values per slot), plus the allocator's
/// record for the page.
pub fn kv_bytes_per_page(page_size: u32, host: bool) -> u64 {
    let ps = u64::from(page_size);
    let per_slot = if host {
        4 * (ps.next_power_of_two() + 32)
    } else {
        4
    };
    ps * per_slot + 96
}
