//! Scenario files: topology, engine config, workload and network, as TOML.
//!
//! A scenario is data, not code: every field is named in the file, unknown fields are
//! refused, and a value that breaks a stated relation is an error naming the field.
//! Loading never panics on a bad file.

use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::{RequestId, TenantId, Token};
use serde::{Deserialize, Serialize};
use std::path::Path;

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

/// A point in a request's life at which its client may give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReqPhase {
    /// Prefill admitted its half (a sender exists).
    PrefillAdmitted,
    /// Decode reserved its pages and announced them.
    DecodeReserved,
    /// Prefill issued its first KV write.
    KvSent,
    /// A KV write landed in decode's pool.
    KvLanded,
    /// Decode accepted the transfer.
    TransferAccepted,
    /// Decode ran step `n` of the reply.
    Decoding(u32),
    /// Prefill gave its terminal answer.
    PrefillAnswered,
    /// The client already has its answer (a disconnect after the fact).
    Answered,
}

impl ReqPhase {
    /// The phases a drawn cancel picks from (`Decoding` with its step drawn).
    pub const ALL: [ReqPhase; 8] = [
        ReqPhase::PrefillAdmitted,
        ReqPhase::DecodeReserved,
        ReqPhase::KvSent,
        ReqPhase::KvLanded,
        ReqPhase::TransferAccepted,
        ReqPhase::Decoding(0),
        ReqPhase::PrefillAnswered,
        ReqPhase::Answered,
    ];

    /// Parse a scenario name: `prefill-admitted`, `decode-reserved`, `kv-sent`,
    /// `kv-landed`, `transfer-accepted`, `decoding` or `decoding:N`, `prefill-answered`,
    /// `answered`.
    pub fn parse(s: &str) -> Option<ReqPhase> {
        let s = s.trim();
        if let Some(n) = s.strip_prefix("decoding:") {
            return n.parse().ok().map(ReqPhase::Decoding);
        }
        Some(match s {
            "prefill-admitted" => ReqPhase::PrefillAdmitted,
            "decode-reserved" => ReqPhase::DecodeReserved,
            "kv-sent" => ReqPhase::KvSent,
            "kv-landed" => ReqPhase::KvLanded,
            "transfer-accepted" => ReqPhase::TransferAccepted,
            "decoding" => ReqPhase::Decoding(0),
            "prefill-answered" => ReqPhase::PrefillAnswered,
            "answered" => ReqPhase::Answered,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ReqPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReqPhase::PrefillAdmitted => f.write_str("prefill-admitted"),
            ReqPhase::DecodeReserved => f.write_str("decode-reserved"),
            ReqPhase::KvSent => f.write_str("kv-sent"),
            ReqPhase::KvLanded => f.write_str("kv-landed"),
            ReqPhase::TransferAccepted => f.write_str("transfer-accepted"),
            ReqPhase::Decoding(n) => write!(f, "decoding:{n}"),
            ReqPhase::PrefillAnswered => f.write_str("prefill-answered"),
            ReqPhase::Answered => f.write_str("answered"),
        }
    }
}

/// How a client gives up on a request (part of the trace schema).
pub use kvsim_oracle::schema::CancelHow;

/// When a client gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelAt {
    /// This long after submitting.
    AfterNs(u64),
    /// When the request reaches `phase`, `delay_ns` later.
    Phase { phase: ReqPhase, delay_ns: u64 },
}

/// A planned client abort or disconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub how: CancelHow,
    pub at: CancelAt,
}

impl std::fmt::Display for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.how {
            CancelHow::Abort => "abort",
            CancelHow::Disconnect => "disconnect",
        };
        match self.at {
            CancelAt::AfterNs(ns) => write!(f, "{how} {}us after submit", ns / 1_000),
            CancelAt::Phase { phase, delay_ns } => {
                write!(f, "{how} {}us after {phase}", delay_ns / 1_000)
            }
        }
    }
}

/// One concrete request of a run, with its canary prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    pub at_ns: u64,
    pub cancel: Option<Cancel>,
}

/// The largest scenario file [`Scenario::load`] reads, in bytes (the largest shipped
/// scenario is a few kilobytes).
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// The most requests a run may hold: canary tokens carry the request number in 16 bits.
pub use kvsim_oracle::canary::MAX_REQUESTS;

impl PlannedRequest {
    /// The canary prompt: token `i` names this request and its position, so any token
    /// echoed back identifies whose prompt it came from (`kvsim_oracle::canary`).
    pub fn prompt(&self) -> Vec<Token> {
        kvsim_oracle::canary::prompt(self.req, self.prompt_len)
    }
}

/// The cancel an explicit request asks for (`cancel_after_us` or `cancel_on`).
fn explicit_cancel(r: &RequestSpec) -> Option<Cancel> {
    if let Some(phase) = r.cancel_on.as_deref().and_then(ReqPhase::parse) {
        return Some(Cancel {
            how: CancelHow::Disconnect,
            at: CancelAt::Phase {
                phase,
                delay_ns: r.cancel_delay_us.saturating_mul(1_000),
            },
        });
    }
    r.cancel_after_us.map(|c| Cancel {
        how: CancelHow::Disconnect,
        at: CancelAt::AfterNs(c.saturating_mul(1_000)),
    })
}

/// Which request's prompt a token came from (`None` for placeholder tokens).
pub use kvsim_oracle::canary::owner as canary_owner;

impl Scenario {
    /// Parse a scenario from TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let sc: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        sc.validate()?;
        Ok(sc)
    }

    /// Load a scenario file of at most [`MAX_SCENARIO_BYTES`]: a larger file (or a
    /// device such as `/dev/zero`) is refused after that many bytes, not read to its end.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        use std::io::Read;
        let read = |source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::open(path).map_err(read)?;
        let mut buf = Vec::new();
        f.take(MAX_SCENARIO_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(read)?;
        if buf.len() as u64 > MAX_SCENARIO_BYTES {
            return Err(ScenarioError::TooLarge {
                path: path.display().to_string(),
                limit: MAX_SCENARIO_BYTES,
            });
        }
        let text = String::from_utf8(buf).map_err(|_| ScenarioError::Parse {
            path: path.display().to_string(),
            message: "not UTF-8 text".into(),
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Lay `spec`, TOML key/value lines of `[faults]` (`pause = { count = 2, max_ms =
    /// 300 }`, `clock_skew_permille = 200`), over the scenario's faults: each key
    /// replaces the file's value. An unknown key or a bad value is refused by name,
    /// and the result must validate as a file would.
    pub fn overlay_faults(&mut self, spec: &str) -> Result<(), ScenarioError> {
        let parse = |e: String| ScenarioError::Parse {
            path: format!("--faults `{spec}`"),
            message: e,
        };
        let over: toml::Table = toml::from_str(spec).map_err(|e| parse(e.to_string()))?;
        let mut table = toml::Table::try_from(&self.faults).map_err(|e| parse(e.to_string()))?;
        table.extend(over);
        self.faults = table
            .try_into()
            .map_err(|e: toml::de::Error| parse(e.to_string()))?;
        self.fault_overlay.push(spec.to_string());
        self.validate()
    }

    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Every duration of the scenario, named as in the file, in its file unit, with
    /// the factor that turns it into milliseconds over 1000 (1 for microseconds).
    fn durations(&self) -> Vec<(String, u64, u64)> {
        let f = &self.faults;
        let mut v = vec![
            ("network.latency_us".to_string(), self.network.latency_us, 1),
            ("faults.delay.max_ms".into(), f.delay.max_ms, 1000),
            ("faults.reorder_jitter_us".into(), f.reorder_jitter_us, 1),
            ("faults.partition.max_ms".into(), f.partition.max_ms, 1000),
            ("faults.slow_write.max_ms".into(), f.slow_write.max_ms, 1000),
            ("faults.late_write.max_ms".into(), f.late_write.max_ms, 1000),
            ("faults.crash.max_ms".into(), f.crash.max_ms, 1000),
            ("faults.pause.max_ms".into(), f.pause.max_ms, 1000),
            (
                "faults.short_timeouts_min_ms".into(),
                f.short_timeouts_min_ms,
                1000,
            ),
            ("phases.safety_ms".into(), self.phases.safety_ms, 1000),
            ("phases.liveness_ms".into(), self.phases.liveness_ms, 1000),
            ("run.max_time_ms".into(), self.run.max_time_ms, 1000),
            (
                "run.cleanup_bound_ms".into(),
                self.run.cleanup_bound_ms,
                1000,
            ),
        ];
        if let Some(w) = &self.workload {
            v.push(("workload.arrival_ms".into(), w.arrival_ms, 1000));
        }
        for (i, r) in self.requests.iter().enumerate() {
            v.push((format!("requests[{i}].at_us"), r.at_us, 1));
            v.push((format!("requests[{i}].every_us"), r.every_us, 1));
            v.push((
                format!("requests[{i}].cancel_delay_us"),
                r.cancel_delay_us,
                1,
            ));
            if let Some(c) = r.cancel_after_us {
                v.push((format!("requests[{i}].cancel_after_us"), c, 1));
            }
        }
        v
    }

    /// The pages of KV memory a run of this scenario may allocate at most, over all
    /// its nodes (under a swarm: the largest draw).
    pub fn max_pool_pages(&self) -> u64 {
        match &self.swarm {
            None => self
                .topology
                .prefill_pool_pages
                .iter()
                .chain(&self.topology.decode_pool_pages)
                .map(|&p| u64::from(p) + 1)
                .sum(),
            Some(sw) => {
                let nodes = u64::from(sw.prefill_nodes[1]) + u64::from(sw.decode_nodes[1]);
                let mut largest = u64::from(sw.pool_pages[1]);
                if sw.pool_below_context_permille > 0 {
                    let context_pages = self.engine.pages_for(self.engine.context_len);
                    largest = largest.max(context_pages.saturating_sub(1));
                }
                nodes.saturating_mul(largest.saturating_add(1))
            }
        }
    }

    /// Refuse a scenario whose KV pools would not fit [`MAX_KV_BYTES`] on the given
    /// backend (`host`: real f32 arithmetic, far larger per page).
    pub fn check_memory(&self, host: bool) -> Result<(), ScenarioError> {
        let pages = self.max_pool_pages();
        let bytes = pages.saturating_mul(kv_bytes_per_page(self.engine.page_size, host));
        if bytes > MAX_KV_BYTES {
            return Err(ScenarioError::TooMuchMemory {
                mib: bytes >> 20,
                pages,
                page_size: self.engine.page_size,
                backend: if host { "host" } else { "symbolic" },
                budget_mib: MAX_KV_BYTES >> 20,
            });
        }
        Ok(())
    }

    /// An upper bound on the prompt and generated tokens of one run, and its requests.
    pub fn cost_estimate(&self) -> (u64, u64) {
        let mut tokens = 0u64;
        let mut requests = 0u64;
        for r in &self.requests {
            let each = r.prompt_len.saturating_add(u64::from(r.max_new_tokens));
            tokens = tokens.saturating_add(each.saturating_mul(u64::from(r.repeat)));
            requests = requests.saturating_add(u64::from(r.repeat));
        }
        if let Some(w) = &self.workload {
            // An over-length prompt is at most a quarter over the largest pool or context.
            let over = if w.over_length_permille > 0 {
                (1u64 << 24).min(self.engine.context_len.saturating_mul(5) / 4)
            } else {
                0
            };
            let each = w.prompt_len[1]
                .max(over)
                .saturating_add(u64::from(w.max_new_tokens[1]));
            tokens = tokens.saturating_add(each.saturating_mul(u64::from(w.requests)));
            requests = requests.saturating_add(u64::from(w.requests));
        }
        (tokens, requests)
    }

    /// Refuse a scenario whose [`Scenario::cost_estimate`] exceeds
    /// [`COST_BUDGET_TOKENS`] (the CLI's `--allow-expensive` skips this check).
    pub fn check_cost(&self) -> Result<(), ScenarioError> {
        let (tokens, requests) = self.cost_estimate();
        if tokens > COST_BUDGET_TOKENS {
            return Err(ScenarioError::Expensive {
                tokens,
                requests,
                budget: COST_BUDGET_TOKENS,
            });
        }
        Ok(())
    }

    /// Check every relation the engine config does not cover.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.engine.validate()?;
        self.validate_durations()?;
        self.validate_routers()?;
        self.validate_reach()?;
        if self.run.max_time_ms == 0 {
            return Err(Self::invalid(
                "run.max_time_ms",
                "must be at least 1: a run with no time checks nothing",
            ));
        }
        self.validate_topology()?;
        self.validate_requests()?;
        if let Some(w) = &self.workload {
            self.validate_workload(w)?;
        }
        self.validate_faults()?;
        if let Some(sw) = &self.swarm {
            Self::validate_swarm(sw)?;
        }
        self.validate_total()?;
        if self.run.max_events == 0 {
            return Err(Self::invalid("run.max_events", "must be at least 1"));
        }
        self.check_memory(false)?;
        Ok(())
    }

    /// Every duration within the simulated time bound (30 days).
    fn validate_durations(&self) -> Result<(), ScenarioError> {
        for (field, v, per_ms) in self.durations() {
            let max = MAX_TIME_MS.saturating_mul(1000 / per_ms);
            if v > max {
                let unit = if per_ms == 1 { "us" } else { "ms" };
                return Err(Self::invalid(
                    field,
                    format!("{v}{unit}: at most {max}{unit} (30 days of simulated time)"),
                ));
            }
        }
        Ok(())
    }

    /// Each router policy listed once.
    fn validate_routers(&self) -> Result<(), ScenarioError> {
        let mut routers = self.routers.clone();
        routers.sort();
        routers.dedup();
        if routers.len() != self.routers.len() {
            return Err(Self::invalid(
                "routers",
                "lists a router policy twice (each seed draws one of them)",
            ));
        }
        Ok(())
    }

    /// `reach`: known path names, each listed once.
    fn validate_reach(&self) -> Result<(), ScenarioError> {
        for (i, name) in self.reach.iter().enumerate() {
            if crate::reach::ReachPath::parse(name).is_none() {
                return Err(Self::invalid(
                    format!("reach[{i}]"),
                    format!(
                        "unknown path `{name}` (known: {})",
                        crate::reach::ReachPath::names()
                    ),
                ));
            }
            if self.reach[..i].contains(name) {
                return Err(Self::invalid(
                    format!("reach[{i}]"),
                    format!("lists `{name}` twice"),
                ));
            }
        }
        Ok(())
    }

    /// The paths of `reach`, parsed (a validated scenario names only known ones).
    pub fn reach_paths(&self) -> Vec<crate::reach::ReachPath> {
        self.reach
            .iter()
            .filter_map(|n| crate::reach::ReachPath::parse(n))
            .collect()
    }

    /// `[topology]`: present exactly when there is no `[swarm]`, 1 to 64 nodes of
    /// each kind, each pool 1 to 2^24 pages.
    fn validate_topology(&self) -> Result<(), ScenarioError> {
        let t = &self.topology;
        if self.swarm.is_some()
            && (!t.prefill_pool_pages.is_empty() || !t.decode_pool_pages.is_empty())
        {
            return Err(Self::invalid(
                "topology",
                "a [swarm] draws the topology: remove [topology] or [swarm]",
            ));
        }
        if self.swarm.is_none() {
            if t.prefill_pool_pages.is_empty() || t.prefill_pool_pages.len() > 64 {
                return Err(Self::invalid(
                    "topology.prefill_pool_pages",
                    "needs 1 to 64 nodes",
                ));
            }
            if t.decode_pool_pages.is_empty() || t.decode_pool_pages.len() > 64 {
                return Err(Self::invalid(
                    "topology.decode_pool_pages",
                    "needs 1 to 64 nodes",
                ));
            }
            let named = t
                .prefill_pool_pages
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("topology.prefill_pool_pages[{i}]"), *p))
                .chain(
                    t.decode_pool_pages
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (format!("topology.decode_pool_pages[{i}]"), *p)),
                );
            for (field, p) in named {
                if p == 0 || p > 1 << 24 {
                    return Err(Self::invalid(
                        field,
                        format!("{p} pages: a pool has 1 to 16777216 pages"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `[[requests]]`: sizes, repeats, times within the bound, known cancel phases.
    fn validate_requests(&self) -> Result<(), ScenarioError> {
        for (i, r) in self.requests.iter().enumerate() {
            let f = |name: &str| format!("requests[{i}].{name}");
            if r.prompt_len == 0 || r.prompt_len > 1 << 24 {
                return Err(Self::invalid(
                    f("prompt_len"),
                    "must be 1 to 16777216 tokens",
                ));
            }
            if r.max_new_tokens == 0 {
                return Err(Self::invalid(f("max_new_tokens"), "must be at least 1"));
            }
            if r.repeat == 0 {
                return Err(Self::invalid(f("repeat"), "must be at least 1"));
            }
            // The last copy's submit time, and its cancel, stay inside the time bound.
            let last = u64::from(r.repeat - 1)
                .checked_mul(r.every_us)
                .and_then(|x| x.checked_add(r.at_us))
                .and_then(|x| x.checked_add(r.cancel_after_us.unwrap_or(0)))
                .and_then(|x| x.checked_add(r.cancel_delay_us))
                .filter(|&x| x <= MAX_TIME_MS * 1000);
            if last.is_none() {
                return Err(Self::invalid(
                    f("every_us"),
                    format!(
                        "at_us + (repeat - 1) * every_us + cancel delays must be at most {}us (30 days)",
                        MAX_TIME_MS * 1000
                    ),
                ));
            }
            if let Some(p) = &r.cancel_on {
                if ReqPhase::parse(p).is_none() {
                    return Err(Self::invalid(
                        f("cancel_on"),
                        format!("unknown phase `{p}` (known: prefill-admitted, decode-reserved, kv-sent, kv-landed, transfer-accepted, decoding[:N], prefill-answered, answered)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `[workload]`: ranges ordered and within the engine's limits.
    fn validate_workload(&self, w: &WorkloadSpec) -> Result<(), ScenarioError> {
        let f = |name: &str| format!("workload.{name}");
        if w.prompt_len[0] == 0 || w.prompt_len[0] > w.prompt_len[1] || w.prompt_len[1] > 1 << 24 {
            return Err(Self::invalid(
                f("prompt_len"),
                "needs 1 <= low <= high <= 16777216",
            ));
        }
        if w.max_new_tokens[0] == 0 || w.max_new_tokens[0] > w.max_new_tokens[1] {
            return Err(Self::invalid(f("max_new_tokens"), "needs 1 <= low <= high"));
        }
        if w.max_new_tokens[1] > self.engine.max_new_tokens_limit {
            return Err(Self::invalid(
                f("max_new_tokens"),
                format!(
                    "exceeds engine.max_new_tokens_limit ({})",
                    self.engine.max_new_tokens_limit
                ),
            ));
        }
        if w.tenants == 0 || w.tenants > 1 << 16 {
            return Err(Self::invalid(f("tenants"), "must be 1 to 65536"));
        }
        if w.burst == 0 || w.burst > MAX_REQUESTS as u32 {
            return Err(Self::invalid(
                f("burst"),
                format!("must be 1 to {MAX_REQUESTS}"),
            ));
        }
        if w.over_length_permille > 1000 {
            return Err(Self::invalid(f("over_length_permille"), "at most 1000"));
        }
        Ok(())
    }

    /// `[faults]`: rates per mille, known cancel phases, bounded counts.
    fn validate_faults(&self) -> Result<(), ScenarioError> {
        let fs = &self.faults;
        for (name, v) in [
            ("delay.permille", fs.delay.permille),
            ("loss_permille", fs.loss_permille),
            ("duplicate_permille", fs.duplicate_permille),
            ("stale_replay_permille", fs.stale_replay_permille),
            ("slow_write.permille", fs.slow_write.permille),
            ("late_write.permille", fs.late_write.permille),
            ("write_fail_permille", fs.write_fail_permille),
            ("corrupt_write_permille", fs.corrupt_write_permille),
            ("misdirect_write_permille", fs.misdirect_write_permille),
            ("torn_write_permille", fs.torn_write_permille),
            (
                "stale_duplicate_write_permille",
                fs.stale_duplicate_write_permille,
            ),
            ("cancel_permille", fs.cancel_permille),
        ] {
            if v > 1000 {
                return Err(Self::invalid(format!("faults.{name}"), "at most 1000"));
            }
        }
        for p in &fs.cancel_phases {
            if ReqPhase::parse(p).is_none() {
                return Err(Self::invalid(
                    "faults.cancel_phases",
                    format!("unknown phase `{p}`"),
                ));
            }
        }
        // A lost message is recovered by a retry; losing every one would only test
        // that nothing can be done.
        if fs.loss_permille > 500 {
            return Err(Self::invalid("faults.loss_permille", "at most 500"));
        }
        if fs.partition.count > 64 || fs.crash.count > 64 || fs.pause.count > 64 {
            return Err(Self::invalid(
                "faults",
                "at most 64 partitions, 64 crashes and 64 pauses",
            ));
        }
        // A clock at rate 0 never fires a timer: no timeout could end anything.
        if fs.clock_skew_permille > 900 {
            return Err(Self::invalid(
                "faults.clock_skew_permille",
                "at most 900 (a clock running at 10% of the true rate or faster)",
            ));
        }
        Ok(())
    }

    /// `[swarm]`: ranges ordered and within the engine's bounds.
    fn validate_swarm(sw: &SwarmSpec) -> Result<(), ScenarioError> {
        for (name, r) in [
            ("prefill_nodes", sw.prefill_nodes),
            ("decode_nodes", sw.decode_nodes),
            ("pool_pages", sw.pool_pages),
            ("chunk_pages", sw.chunk_pages),
            ("max_inflight_chunks", sw.max_inflight_chunks),
            ("max_rooms", sw.max_rooms),
            ("max_batch", sw.max_batch),
        ] {
            if r[0] == 0 || r[0] > r[1] {
                return Err(Self::invalid(
                    format!("swarm.{name}"),
                    "needs 1 <= low <= high",
                ));
            }
        }
        if sw.prefill_nodes[1] > 64 || sw.decode_nodes[1] > 64 {
            return Err(Self::invalid(
                "swarm",
                "at most 64 prefill and 64 decode nodes",
            ));
        }
        if sw.pool_pages[1] > 1 << 24 {
            return Err(Self::invalid("swarm.pool_pages", "at most 16777216 pages"));
        }
        use kvsim_engine::config::{MAX_CHUNK_PAGES, MAX_QUEUE, MAX_ROOMS};
        for (name, hi, max) in [
            ("max_rooms", sw.max_rooms[1], MAX_ROOMS),
            ("chunk_pages", sw.chunk_pages[1], MAX_CHUNK_PAGES),
            ("max_batch", sw.max_batch[1], MAX_QUEUE),
        ] {
            if hi > max {
                return Err(Self::invalid(
                    format!("swarm.{name}"),
                    format!("{hi}: at most {max} (the engine's bound)"),
                ));
            }
        }
        if sw.max_inflight_chunks[1] > 1024 {
            return Err(Self::invalid("swarm.max_inflight_chunks", "at most 1024"));
        }
        if sw.pool_below_context_permille > 1000 {
            return Err(Self::invalid(
                "swarm.pool_below_context_permille",
                "at most 1000",
            ));
        }
        if sw.small_pool_pages_min == 0 {
            return Err(Self::invalid(
                "swarm.small_pool_pages_min",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The scenario submits at least one request and at most [`MAX_REQUESTS`].
    fn validate_total(&self) -> Result<(), ScenarioError> {
        let explicit: usize = self.requests.iter().map(|r| r.repeat as usize).sum();
        let total = explicit + self.workload.as_ref().map_or(0, |w| w.requests as usize);
        if total == 0 {
            return Err(Self::invalid(
                "requests",
                "the scenario submits no request (no [[requests]] and no [workload] with requests > 0): a run would check nothing",
            ));
        }
        if total > MAX_REQUESTS {
            return Err(Self::invalid(
                "requests",
                format!("{total} requests; at most {MAX_REQUESTS}"),
            ));
        }
        Ok(())
    }

    /// The explicit workload as concrete requests, numbered in order.
    pub fn planned_requests(&self) -> Vec<PlannedRequest> {
        let mut out = Vec::new();
        for r in &self.requests {
            for k in 0..r.repeat {
                // Bounded by `validate`; saturating all the same.
                let at_ns = u64::from(k)
                    .saturating_mul(r.every_us)
                    .saturating_add(r.at_us)
                    .saturating_mul(1_000);
                out.push(PlannedRequest {
                    req: RequestId(out.len() as u64),
                    tenant: TenantId(r.tenant),
                    prompt_len: r.prompt_len,
                    max_new_tokens: r.max_new_tokens,
                    at_ns,
                    cancel: explicit_cancel(r),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "t"
[topology]
prefill_pool_pages = [16]
decode_pool_pages = [16]
[[requests]]
tenant = 1
prompt_len = 10
"#;

    #[test]
    fn minimal_parses_with_defaults() {
        let sc = Scenario::parse(MINIMAL, "t.toml").unwrap();
        assert_eq!(sc.requests[0].max_new_tokens, 16);
        assert_eq!(sc.planned_requests().len(), 1);
    }

    #[test]
    fn unknown_field_is_named() {
        let bad = MINIMAL.replace("prompt_len = 10", "prompt_len = 10\nprompt_lenght = 3");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("prompt_lenght"), "{err}");
    }

    #[test]
    fn missing_field_is_named() {
        let bad = MINIMAL.replace("decode_pool_pages = [16]", "");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("decode_pool_pages"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let bad = MINIMAL.replace("prompt_len = 10", "prompt_len = 0");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("requests[0].prompt_len"), "{err}");
        let bad = MINIMAL.replace("[topology]", "[engine]\nchunk_pages = 0\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("chunk_pages"), "{err}");
        let bad = MINIMAL.replace("[topology]", "[engine]\nbugs = [\"no-such\"]\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("no-such"), "{err}");
        // The transport: one-sided by default, two-sided on request, nothing else.
        assert_eq!(
            Scenario::parse(MINIMAL, "t.toml").unwrap().engine.transport,
            kvsim_engine::world::KvTransport::OneSided
        );
        let two = MINIMAL.replace(
            "[topology]",
            "[engine]\ntransport = \"two-sided\"\n[topology]",
        );
        assert_eq!(
            Scenario::parse(&two, "t.toml").unwrap().engine.transport,
            kvsim_engine::world::KvTransport::TwoSided
        );
        let bad = MINIMAL.replace("[topology]", "[engine]\ntransport = \"rdma\"\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("transport") && err.contains("one-sided") && err.contains("two-sided"),
            "{err}"
        );
        let bad = format!("{MINIMAL}[faults]\nstale_duplicate_write_permille = 1001\n");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("faults.stale_duplicate_write_permille") && err.contains("at most 1000"),
            "{err}"
        );
        let bad = format!("{MINIMAL}[faults]\nstale_duplicate_write_permille = -1\n");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("stale_duplicate_write_permille"), "{err}");
    }

    #[test]
    fn canary_tokens_name_their_request() {
        let r = PlannedRequest {
            req: RequestId(41),
            tenant: TenantId(1),
            prompt_len: 5,
            max_new_tokens: 1,
            at_ns: 0,
            cancel: None,
        };
        for t in r.prompt() {
            assert_eq!(canary_owner(t), Some(RequestId(41)));
        }
        assert_eq!(canary_owner(0), None);
    }
}
