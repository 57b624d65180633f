//! Engine configuration: sizes, limits, timeouts, defenses and bug switches.
//!
//! A config is validated once, before any node starts; a config that breaks a stated
//! relation is a [`ConfigError`] naming the field, never a panic later. The pre-flight
//! rule (a pool must hold the advertised context) lives here too.

use crate::bugs::{Bug, BugSet};
use crate::ids::pages_for;
use serde::{Deserialize, Serialize};
use strum::{EnumCount, VariantArray};

/// The defenses (`docs/ARCHITECTURE.md`, "Defenses"). Each is on by default except
/// zero-on-free.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Defenses {
    /// 1. Reject a prompt longer than `min(context_len, pool)` at intake, before any
    ///    bootstrap, allocation or transfer, with its original error (400).
    pub admission_check: bool,
    /// 2. Decode verifies a completed transfer: tokens and pages written equal what it
    ///    reserved, and the checksum over its whole reservation matches.
    pub verify_on_completion: bool,
    /// 3. Deferred release: aborted pages stay quarantined until the writer acks that
    ///    its writes drained; prefill keeps source pages until its sends completed.
    pub deferred_release: bool,
    /// 4a. Page tags, checked at read time: every KV write stamps each page it lands in
    ///    with the tag its writer meant (the tag bytes travel with the write), and
    ///    decode compares every page's tag with the (room use, generation) it expects
    ///    before each step; a mismatch fails that request. Real on every transport.
    pub page_tags: bool,
    /// 4b. The landing gate: the receiver's software checks a KV write's destination
    ///    tags against its page record before any byte lands, and refuses a write into
    ///    a page that is stale, another room use's or already `Ready`. It exists only on
    ///    a two-sided transport ([`crate::transport::KvTransport`]); on one-sided RDMA no
    ///    receiver software sees a write before it lands, so the switch does nothing.
    pub landing_gate: bool,
    /// 5. Pre-flight: a node refuses to start when its pool cannot hold its context.
    pub preflight: bool,
    /// 6. The router cancels both halves of a pair on any abort or failure.
    pub router_cancels_both: bool,
    /// 7. Zero pages when they return to the free list (a cost comparison with tags).
    pub zero_on_free: bool,
}

impl Default for Defenses {
    fn default() -> Self {
        Defenses {
            admission_check: true,
            verify_on_completion: true,
            deferred_release: true,
            page_tags: true,
            landing_gate: true,
            preflight: true,
            router_cancels_both: true,
            zero_on_free: false,
        }
    }
}

impl Defenses {
    /// Every defense off (the incident's configuration, without its bug switches).
    pub fn none() -> Self {
        let d = Defenses {
            admission_check: false,
            verify_on_completion: false,
            deferred_release: false,
            page_tags: false,
            landing_gate: false,
            preflight: false,
            router_cancels_both: false,
            zero_on_free: false,
        };
        // Restates the literal above: debug only.
        debug_assert_ne!(d, Defenses::default());
        d
    }
}

/// How the router treats a request's two halves ([`crate::router`]).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum RouterPolicy {
    /// A careful operator's router: one attempt per request; any abort, disconnect or
    /// failure cancels both halves (defense 6); a request timeout answers 500 and keeps
    /// asking both halves to abort until they answered.
    #[default]
    Careful,
    /// The observable behaviour of SGLang's gateway, `sglang-router` 0.3.2 (its
    /// `src/routers/http/pd_router.rs` and `src/core/retry.rs`): the same request to
    /// both halves; a failed half never cancels the other (the router waits for it and
    /// drops its answer); 408, 429, 500, 502, 503 and 504 are retried, up to five
    /// attempts in all, each with a new random room while the earlier attempt's halves
    /// may still be working; a client disconnect closes both upstream connections (each
    /// node aborts its half); the answer is decode's, or prefill's error when only
    /// prefill failed. Defense 6 does not exist under it.
    SglangRouter,
    /// The observable behaviour of vLLM's router, `vllm-router` 0.1.17 with
    /// `--vllm-pd-disaggregation`, driving vLLM's NIXL connector's nodes (pull):
    /// strictly sequential, prefill first with one token, then decode with prefill's
    /// `kv_transfer_params`; no retries; a prefill failure answers the client 500 and
    /// decode is never contacted; a decode failure passes through and prefill is never
    /// told; no abort or release is ever sent to a worker, except that a client
    /// disconnect closes the one open upstream connection. Defense 6 does not exist
    /// under it (`nodes/router/vllm.rs`).
    VllmRouter,
}

/// The protocol a deployment's prefill and decode nodes speak: which node kinds
/// [`crate::world::Topology::build`] makes. It follows from the router policy
/// ([`RouterPolicy::protocol`]): each router drives the nodes of its own family.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// SGLang's disaggregation: both halves start at once, prefill pushes (RDMA WRITE)
    /// into the page list decode sends it, drain acks release an aborted room.
    Sglang,
    /// vLLM's NIXL connector, pull mode: prefill runs first and keeps its pages under
    /// a lease; decode reads them (RDMA READ) and its notification frees them.
    Vllm,
}

impl RouterPolicy {
    pub const ALL: [RouterPolicy; RouterPolicy::COUNT] =
        crate::enum_table::every(RouterPolicy::VARIANTS);

    /// The name a scenario and the CLI use.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The protocol of the nodes this router drives.
    pub fn protocol(self) -> Protocol {
        match self {
            RouterPolicy::Careful | RouterPolicy::SglangRouter => Protocol::Sglang,
            RouterPolicy::VllmRouter => Protocol::Vllm,
        }
    }

    /// The policies that drive `protocol`'s nodes, in declaration order (what a
    /// scenario's `routers` draws from and the isolation matrix runs under).
    pub fn of(protocol: Protocol) -> Vec<RouterPolicy> {
        RouterPolicy::ALL
            .into_iter()
            .filter(|r| r.protocol() == protocol)
            .collect()
    }
}

/// Timer lengths, in nanoseconds of whatever clock drives the engine. The model
/// checker ignores the lengths: any set timer may fire at any point.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Prefill: a room that never gets decode's page list is failed after this.
    pub bootstrap_ns: u64,
    /// Decode: a room whose KV never completes is failed after this.
    pub waiting_ns: u64,
    /// Decode: re-ask prefill for the drain ack after this.
    pub drain_retry_ns: u64,
    /// Decode: after this many unanswered drain requests the node fails loudly (it
    /// takes no new request) but keeps asking; only the ack releases the pages.
    pub drain_retries: u32,
    /// Router: a request with no terminal answer from both halves is cancelled.
    pub request_ns: u64,
    /// vLLM prefill: how long it keeps a finished request's pages for decode to read
    /// when no notification comes (`kv_lease_duration`, 30 s in vLLM; decode's
    /// heartbeats renew it every sixth of it while it has not read).
    #[serde(skip_serializing_if = "is_default_lease")]
    pub lease_ns: u64,
}

/// The default lease, scaled as the other timers are (a tenth of the request timeout).
const LEASE_NS: u64 = 200_000_000;

fn is_default_lease(ns: &u64) -> bool {
    *ns == LEASE_NS
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            bootstrap_ns: 200_000_000,
            waiting_ns: 400_000_000,
            drain_retry_ns: 50_000_000,
            drain_retries: 40,
            request_ns: 2_000_000_000,
            lease_ns: LEASE_NS,
        }
    }
}

/// Compute latencies the engine asks its clock for (forward, decode step).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Latencies {
    pub prefill_forward_ns: u64,
    pub decode_step_ns: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            prefill_forward_ns: 2_000_000,
            decode_step_ns: 1_000_000,
        }
    }
}

/// Everything the nodes share. Per-node pool sizes are passed to each node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Tokens per KV page (SGLang `page_size`); prefill and decode must agree.
    pub page_size: u32,
    /// The context length the deployment advertises.
    pub context_len: u64,
    /// Most pages in one KV write message (a bounded transfer batch, #32758).
    pub chunk_pages: u32,
    /// Most chunk writes one room may have in flight at once.
    pub max_inflight_chunks: u32,
    /// Prefill's radix-cache hit, in pages: the leading pages of every prompt whose KV
    /// prefill already holds (a page-aligned match, at most all but the prompt's last
    /// page). Their forward chunks are skipped, so they are no send of their own: the
    /// first KV write carries them with the first computed chunk (SGLang's cached-prefix
    /// early send, sglang #30545). 0 (the default): no prefix hit, every chunk is
    /// `chunk_pages` long.
    pub prefix_hit_pages: u32,
    /// Sender ranks per room (tensor-parallel prefill): each rank holds its slice of
    /// the room's KV and moves it with a transfer handle of its own, and the transfer
    /// ends only when every rank's handle has been counted. Read by vLLM's pull
    /// (`nodes/decode/handles.rs`: one READ handle per remote prefill rank, as vLLM's
    /// NIXL connector under heterogeneous TP; the prefill counts one notification per
    /// rank). 1 (the default): one sender per room.
    pub ranks: u32,
    /// Size of the router's room table; room numbers are reused (LIFO).
    pub max_rooms: u32,
    /// Most requests one node holds in its queues (beyond it: 503).
    pub max_queue: u32,
    /// Most requests in one decode batch.
    pub max_batch: u32,
    /// Most tokens a request may ask to generate.
    pub max_new_tokens_limit: u32,
    pub timeouts: Timeouts,
    pub latencies: Latencies,
    pub defenses: Defenses,
    /// How KV writes reach decode's memory: `one-sided` (RDMA WRITE, the default: the
    /// deployments the incident ran on) or `two-sided` (a receive a thread copies, as
    /// kvsim's runtime over TCP). See [`crate::transport::KvTransport`].
    pub transport: crate::transport::KvTransport,
    pub bugs: BugSet,
    /// Start even though a pool cannot hold the context (the incident configuration).
    pub allow_unsafe_pool: bool,
    /// SGLang `--allow-auto-truncate`: a prompt over a node's admission limit is cut to
    /// the limit instead of rejected. Each half truncates to its own limit, so with
    /// asymmetric pools prefill and decode disagree on the prompt length: exactly the
    /// mismatch that decode's length agreement (defense 2) exists to catch.
    pub allow_auto_truncate: bool,
    /// The router's policy: `careful` (default) or `sglang-router`.
    pub router: RouterPolicy,
    /// The seed of the router's own random draws (the room of each attempt under
    /// `sglang-router`); the engine holds the generator, no global source is read.
    pub router_seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            page_size: 64,
            context_len: 8192,
            chunk_pages: 16,
            max_inflight_chunks: 4,
            prefix_hit_pages: 0,
            ranks: 1,
            max_rooms: 64,
            max_queue: 256,
            max_batch: 32,
            max_new_tokens_limit: 64,
            timeouts: Timeouts::default(),
            latencies: Latencies::default(),
            defenses: Defenses::default(),
            transport: crate::transport::KvTransport::default(),
            bugs: BugSet::NONE,
            allow_unsafe_pool: false,
            allow_auto_truncate: false,
            router: RouterPolicy::Careful,
            router_seed: 0,
        }
    }
}

/// A configuration that cannot run, naming the field and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("`{field}` must be at least {min} (got {value})")]
    TooSmall {
        field: &'static str,
        min: u64,
        value: u64,
    },
    #[error("`{field}` must be at most {max} (got {value})")]
    TooLarge {
        field: &'static str,
        max: u64,
        value: u64,
    },
    #[error(
        "pre-flight: {node} KV pool holds {pool_tokens} tokens ({pool_pages} pages of {page_size}), \
         less than the advertised context of {context_len} tokens; lower `context_len` or grow the \
         pool (set `allow_unsafe_pool = true` only to reproduce the unsafe configuration on purpose)"
    )]
    PoolSmallerThanContext {
        node: String,
        pool_tokens: u64,
        pool_pages: u32,
        page_size: u32,
        context_len: u64,
    },
}

/// The longest timer or latency a config may set, in nanoseconds (30 days). Nodes add
/// timeouts and latencies to their clock; with this bound no such sum can overflow.
pub const MAX_DURATION_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// The largest router room table: a run holds at most 65535 requests, so more rooms
/// than that are never used (and `Router::new` allocates every one up front).
pub const MAX_ROOMS: u32 = 1 << 16;

/// The most requests one node queues, and the most in one decode batch.
pub const MAX_QUEUE: u32 = 1 << 20;

/// The most tokens a request may ask to generate (each is a decode step).
pub const MAX_NEW_TOKENS_LIMIT: u32 = 1 << 20;

/// The most pages in one KV write message (at most a whole pool).
pub const MAX_CHUNK_PAGES: u32 = 1 << 24;

/// The most sender ranks of one room (a tensor-parallel group).
pub const MAX_RANKS: u32 = 64;

/// The most unanswered drain requests before a decode node fails loudly.
pub const MAX_DRAIN_RETRIES: u32 = 1 << 20;

impl EngineConfig {
    /// Is a KV write checked against the receiver's page record before it lands? Only
    /// on a transport whose receiver software sees writes, and only with the landing
    /// gate on. The one statement of it, for every driver.
    pub fn landing_gated(&self) -> bool {
        self.transport.receiver_sees_writes() && self.defenses.landing_gate
    }

    /// Check every stated relation between fields, and a bound on every size and
    /// duration (a value this machine can honour, and no arithmetic overflow later).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let at_least = |field, min: u64, value: u64| {
            if value < min {
                Err(ConfigError::TooSmall { field, min, value })
            } else {
                Ok(())
            }
        };
        let at_most = |field, max: u64, value: u64| {
            if value > max {
                Err(ConfigError::TooLarge { field, max, value })
            } else {
                Ok(())
            }
        };
        at_least("page_size", 1, self.page_size.into())?;
        at_most("page_size", 4096, self.page_size.into())?;
        at_least("context_len", 1, self.context_len)?;
        at_most("context_len", 1 << 32, self.context_len)?;
        at_least("chunk_pages", 1, self.chunk_pages.into())?;
        at_most(
            "chunk_pages",
            MAX_CHUNK_PAGES.into(),
            self.chunk_pages.into(),
        )?;
        at_least("max_inflight_chunks", 1, self.max_inflight_chunks.into())?;
        at_most("prefix_hit_pages", 1 << 24, self.prefix_hit_pages.into())?;
        at_least("ranks", 1, self.ranks.into())?;
        at_most("ranks", MAX_RANKS.into(), self.ranks.into())?;
        at_most("max_inflight_chunks", 1024, self.max_inflight_chunks.into())?;
        at_least("max_rooms", 1, self.max_rooms.into())?;
        at_most("max_rooms", MAX_ROOMS.into(), self.max_rooms.into())?;
        at_least("max_queue", 1, self.max_queue.into())?;
        at_most("max_queue", MAX_QUEUE.into(), self.max_queue.into())?;
        at_least("max_batch", 1, self.max_batch.into())?;
        at_most("max_batch", MAX_QUEUE.into(), self.max_batch.into())?;
        at_least("max_new_tokens_limit", 1, self.max_new_tokens_limit.into())?;
        at_most(
            "max_new_tokens_limit",
            MAX_NEW_TOKENS_LIMIT.into(),
            self.max_new_tokens_limit.into(),
        )?;
        let t = &self.timeouts;
        let l = &self.latencies;
        for (field, v) in [
            ("timeouts.bootstrap_ns", t.bootstrap_ns),
            ("timeouts.waiting_ns", t.waiting_ns),
            ("timeouts.drain_retry_ns", t.drain_retry_ns),
            ("timeouts.request_ns", t.request_ns),
        ] {
            at_least(field, 1, v)?;
            at_most(field, MAX_DURATION_NS, v)?;
        }
        at_most(
            "timeouts.drain_retries",
            MAX_DRAIN_RETRIES.into(),
            t.drain_retries.into(),
        )?;
        at_most(
            "latencies.prefill_forward_ns",
            MAX_DURATION_NS,
            l.prefill_forward_ns,
        )?;
        at_most(
            "latencies.decode_step_ns",
            MAX_DURATION_NS,
            l.decode_step_ns,
        )?;
        Ok(())
    }

    /// The pre-flight rule for one node: its pool must hold the advertised context,
    /// unless the scenario asks for the unsafe configuration on purpose (or the
    /// `skip-preflight` bug, or the defense is off).
    pub fn preflight(&self, node: &str, pool_pages: u32) -> Result<(), ConfigError> {
        let pool_tokens = u64::from(pool_pages) * u64::from(self.page_size);
        let enforced = self.defenses.preflight
            && !self.allow_unsafe_pool
            && !self.bugs.has(Bug::SkipPreflight);
        if enforced && pool_tokens < self.context_len {
            return Err(ConfigError::PoolSmallerThanContext {
                node: node.to_string(),
                pool_tokens,
                pool_pages,
                page_size: self.page_size,
                context_len: self.context_len,
            });
        }
        Ok(())
    }

    /// The longest prompt a node with `pool_pages` admits: `min(context, pool)`, or
    /// the context alone under `admit-beyond-pool` (SGLang #29249). `None` when the
    /// admission check is off.
    pub fn admission_limit(&self, pool_pages: u32) -> Option<u64> {
        let pool_tokens = u64::from(pool_pages) * u64::from(self.page_size);
        if self.bugs.has(Bug::AdmitBeyondPool) {
            Some(self.context_len)
        } else if self.defenses.admission_check || self.bugs.has(Bug::GateChecksFinishedOnly) {
            Some(self.context_len.min(pool_tokens))
        } else {
            None
        }
    }

    pub fn pages_for(&self, tokens: u64) -> u64 {
        pages_for(tokens, self.page_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preflight_names_both_numbers() {
        let cfg = EngineConfig {
            page_size: 64,
            context_len: 1_048_576,
            ..Default::default()
        };
        let err = cfg.preflight("prefill n1", 10_645).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("681280"), "{msg}");
        assert!(msg.contains("1048576"), "{msg}");
        assert!(cfg.preflight("decode n2", 16_384).is_ok());
        let unsafe_ok = EngineConfig {
            allow_unsafe_pool: true,
            ..cfg.clone()
        };
        assert!(unsafe_ok.preflight("prefill n1", 10_645).is_ok());
        let bug = EngineConfig {
            bugs: BugSet::NONE.with(Bug::SkipPreflight),
            ..cfg
        };
        assert!(bug.preflight("prefill n1", 10_645).is_ok());
    }

    #[test]
    fn validate_names_the_field() {
        let cfg = EngineConfig {
            chunk_pages: 0,
            ..Default::default()
        };
        assert_eq!(
            cfg.validate(),
            Err(ConfigError::TooSmall {
                field: "chunk_pages",
                min: 1,
                value: 0
            })
        );
        assert!(EngineConfig::default().validate().is_ok());
    }

    #[test]
    fn every_size_and_duration_has_a_bound() {
        let big = |f: fn(&mut EngineConfig)| {
            let mut c = EngineConfig::default();
            f(&mut c);
            c.validate()
        };
        let err = big(|c| c.max_rooms = u32::MAX).unwrap_err();
        assert!(
            err.to_string()
                .contains("`max_rooms` must be at most 65536"),
            "{err}"
        );
        for f in [
            (|c: &mut EngineConfig| c.chunk_pages = u32::MAX) as fn(&mut EngineConfig),
            |c| c.max_queue = u32::MAX,
            |c| c.max_batch = u32::MAX,
            |c| c.max_new_tokens_limit = u32::MAX,
            |c| c.timeouts.bootstrap_ns = u64::MAX,
            |c| c.timeouts.waiting_ns = u64::MAX,
            |c| c.timeouts.drain_retry_ns = u64::MAX,
            |c| c.timeouts.request_ns = u64::MAX,
            |c| c.timeouts.drain_retries = u32::MAX,
            |c| c.latencies.prefill_forward_ns = u64::MAX,
            |c| c.latencies.decode_step_ns = u64::MAX,
        ] {
            assert!(matches!(big(f), Err(ConfigError::TooLarge { .. })));
        }
    }

    #[test]
    fn admission_limit_follows_pool_unless_bugged() {
        let cfg = EngineConfig {
            page_size: 4,
            context_len: 100,
            ..Default::default()
        };
        assert_eq!(cfg.admission_limit(10), Some(40));
        let bug = EngineConfig {
            bugs: BugSet::NONE.with(Bug::AdmitBeyondPool),
            ..cfg.clone()
        };
        assert_eq!(bug.admission_limit(10), Some(100));
    }
}
