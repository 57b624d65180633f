//! The faults a plan can hold: the [`FaultKind`]s, the network's parameters
//! ([`NetParams`]), partitions and crashes as scheduled, and the cleanup bound the
//! engine's timeouts imply. Data only: drawing them from a seed is `draw`'s.

use kvsim_engine::config::Protocol;
use kvsim_engine::ids::NodeId;
use std::fmt;
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
    /// A client that supplies a live room use's `bootstrap_room` for its own request
    /// (SGLang's worker API takes the field from the request body; issue 37, class 2):
    /// a start pair for that room use from another request.
    ClientRoom,
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
    pub(super) const NEWER: usize = 11;

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
    pub client_room_permille: u32,
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
    // vLLM's prefill keeps an unread room's pages for its lease after answering.
    let timer = match engine.router.protocol() {
        Protocol::Vllm => timer.max(t.lease_ns),
        Protocol::Sglang => timer,
    };
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
