//! Model specifications: topology, engine configuration, clients and fault bounds.
//!
//! A [`ModelSpec`] is data: which requests the clients may send, how big each pool
//! is, and how many faults of each kind the environment may inject in one run. The
//! standard models ([`ModelSpec::standard`]) are named and documented in
//! `standard.rs`, with the reduced bounds the default `cargo test` runs; this file
//! holds the types, the engine configuration they share and the checks of a spec.
//! Nothing here runs anything.

use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::{ConfigError, EngineConfig, RouterPolicy, Timeouts};

/// What one client does: submit one request, and perhaps cancel it later.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ClientSpec {
    pub tenant: u32,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    /// The client may disconnect at any point before it has its answer.
    pub may_cancel: bool,
}

impl ClientSpec {
    /// A request that fits both pools.
    pub fn normal(tenant: u32, prompt_len: u64) -> Self {
        ClientSpec {
            tenant,
            prompt_len,
            max_new_tokens: 1,
            may_cancel: false,
        }
    }

    /// The same request from a client that may disconnect at any point.
    pub fn aborting(self) -> Self {
        ClientSpec {
            may_cancel: true,
            ..self
        }
    }
}

/// How many faults of each kind one run may suffer. Small bounds keep the model
/// exhaustible; every placement of each fault is explored.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct FaultBounds {
    /// Control messages lost (KV writes and their completions never are).
    pub losses: u8,
    /// Control messages delivered twice.
    pub duplicates: u8,
    /// KV writes that fail on the wire: not applied, and the writer's NIC reports
    /// `WriteDone { ok: false }`.
    pub write_failures: u8,
    /// Timeouts that fire while other progress is still possible (a message in flight
    /// or a scheduler tick pending): the network was slower than the timer. A timer
    /// fires freely once nothing else can happen, so recovery never depends on this
    /// budget; the bound only limits how many premature timeouts one run explores.
    pub early_timeouts: u8,
    /// Messages delivered ahead of older ones on their channel.
    pub overtakes: u8,
    /// Crashes of a prefill or a decode node, each followed at once by a restart
    /// into a new incarnation (the simulator's semantics): its timers die, messages in
    /// flight to it are lost (a KV write to it fails back to its writer), its own KV
    /// writes in flight are flushed, and a later write addressed with page tags of the
    /// dead incarnation fails (its memory registration is gone).
    pub crashes: u8,
    /// KV writes delivered altered by a data fault (each of `world::DataFault::ALL`
    /// that has something to act on), applied by the engine's one definition,
    /// `world::alter`, with the fixed salt [`crate::model_state::DATA_FAULT_SALT`]. The
    /// writer's completion still reports success. A stale duplicate is a write that
    /// lands and leaves a copy in the network, which lands again at any later point
    /// (`world::stale_landing` describes it, its receiver's completion is dropped as
    /// `world::duplicate_completion` says); the copy counts against this budget.
    pub data_faults: u8,
    /// Only this kind of data fault (`None`: every kind): to show what one kind alone
    /// finds.
    pub data_fault_kind: Option<kvsim_engine::world::DataFault>,
    /// Deliveries of a timer that already fired or was cancelled (a timer wheel that
    /// delivers a stale entry): the node gets the same timer input again.
    pub timer_refires: u8,
    /// Pauses of a prefill or a decode node (a stall: GC, swap, SIGSTOP), each
    /// until a later wake: while frozen, the node's timers and the arrivals that need
    /// its process (all but one-sided KV writes) wait, and the other nodes' timers
    /// fire as on time (work waiting for the frozen node is not progress that could
    /// come first). Once it wakes its timers are overdue: they may fire before its
    /// queued inputs, not counted as early, until it handles a message.
    pub pauses: u8,
    /// How long one run lasts, for its timers: a timeout armed for longer than this
    /// never fires (the rest of the run is fast next to it, as a transfer of
    /// milliseconds is next to SGLang's 300 s decode waiting timeout), so a run whose
    /// cleanup needs such a timer ends with it pending, and the quiescence property
    /// judges what it left. `None`: every timer may fire (every model but
    /// `failed-room`).
    pub horizon_ns: Option<u64>,
    /// Start pairs for a live room use from a request of another party (issue 37,
    /// class 2: a client of SGLang's worker API supplying a `bootstrap_room` a live
    /// request holds, SGLang #40125, or a second gateway drawing the same room), sent
    /// by the world's one definition, `world::colliding_starts`, from the router's
    /// address, with a prompt one token shorter than the live request's (so that a
    /// half taking it over breaks length agreement; the models judge no reply text).
    pub colliding_rooms: u8,
}

/// How many prefill and decode nodes a model deploys (every prefill node has
/// [`ModelSpec::prefill_pages`], every decode node [`ModelSpec::decode_pages`]). Ids
/// as the simulator numbers them (`world::Topology`): the router `n0`, the prefill
/// nodes `n1..=nP`, the decode nodes after them, the client endpoint last.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Nodes {
    pub prefill: u8,
    pub decode: u8,
    /// Worker mode: each prefill and decode node behind its SGLang worker front,
    /// which the router (policy `sglang-router`) reaches it through
    /// (`engine/src/nodes/worker/behind.rs`).
    pub fronts: bool,
}

impl Nodes {
    /// One prefill and one decode node: router `n0`, prefill `n1`, decode `n2`,
    /// client `n3`.
    pub const ONE_EACH: Nodes = Nodes {
        prefill: 1,
        decode: 1,
        fronts: false,
    };
}

/// One model: the engine under a bounded environment.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub name: String,
    /// One paragraph: what the model explores and its bounds.
    pub about: String,
    pub engine: EngineConfig,
    /// How many prefill and decode nodes (each with the pool below).
    pub nodes: Nodes,
    pub prefill_pages: u32,
    pub decode_pages: u32,
    pub clients: Vec<ClientSpec>,
    pub faults: FaultBounds,
    /// The `sometimes` paths this model must reach (names from
    /// [`crate::model::names`]): a model that stops reaching one no longer exercises
    /// what it is for, and `kvsim check` fails it.
    pub reaches: Vec<&'static str>,
    /// A hazard a defense stopped (a `DETECTED` finding: refused, nothing leaked)
    /// leaves its invariant's `always` property holding, and reaches
    /// [`crate::model::names::STOPPED`] instead. For models whose environment injects
    /// the hazard itself (data faults): there the defenses must act. Off, every
    /// finding breaks its property: on the defended engine under the other faults no
    /// defense ever has to act, and a bug switch is found even where a defense stops it.
    pub detections_hold: bool,
}

/// A model name that is not one of [`ModelSpec::NAMES`], or a spec that cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("unknown model `{0}` (known: {known})", known = ModelSpec::NAMES.join(", "))]
    UnknownModel(String),
    #[error("model `{model}`: {source}")]
    Config { model: String, source: ConfigError },
    #[error("model `{model}`: {reason}")]
    Invalid { model: String, reason: String },
}

/// The engine configuration every standard model shares: pages of 2 tokens, a
/// context (16 tokens) larger than any pool (the incident's shape), one page per KV
/// write with two in flight, and one drain retry before a decode node stops loudly.
pub fn model_engine() -> EngineConfig {
    EngineConfig {
        page_size: 2,
        context_len: 16,
        chunk_pages: 1,
        max_inflight_chunks: 2,
        max_rooms: 3,
        max_queue: 4,
        max_batch: 2,
        max_new_tokens_limit: 2,
        timeouts: Timeouts {
            drain_retries: 1,
            ..Timeouts::default()
        },
        // Pools smaller than the context, on purpose: the pre-flight would refuse.
        allow_unsafe_pool: true,
        ..EngineConfig::default()
    }
}

impl ModelSpec {
    /// The same model with these bug switches (replacing any already set).
    pub fn with_bugs(mut self, bugs: BugSet) -> ModelSpec {
        self.engine.bugs = bugs;
        self
    }

    /// Check the relations a model relies on.
    pub fn validate(&self) -> Result<(), SpecError> {
        let config = |source| SpecError::Config {
            model: self.name.clone(),
            source,
        };
        let invalid = |reason: &str| SpecError::Invalid {
            model: self.name.clone(),
            reason: reason.to_string(),
        };
        self.engine.validate().map_err(config)?;
        self.engine
            .preflight("prefill", self.prefill_pages)
            .map_err(config)?;
        self.engine
            .preflight("decode", self.decode_pages)
            .map_err(config)?;
        if self.clients.is_empty() || self.clients.len() > 8 {
            return Err(invalid("a model has 1 to 8 clients"));
        }
        if !(1..=4).contains(&self.nodes.prefill) || !(1..=4).contains(&self.nodes.decode) {
            return Err(invalid(
                "a model has 1 to 4 prefill and 1 to 4 decode nodes",
            ));
        }
        if self.nodes.fronts && self.engine.router != RouterPolicy::SglangRouter {
            return Err(invalid(
                "worker fronts stand behind the sglang-router policy only",
            ));
        }
        if self.faults.pauses > 3 {
            return Err(invalid(
                "at most 3 pauses (the fault book counts them in 2 bits)",
            ));
        }
        if self.prefill_pages == 0 || self.decode_pages == 0 || self.decode_pages > 64 {
            return Err(invalid("pools have 1 to 64 pages"));
        }
        for c in &self.clients {
            if c.prompt_len == 0 || c.max_new_tokens == 0 {
                return Err(invalid("every request has a prompt and asks for a token"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_models_are_valid_and_named() {
        for name in ModelSpec::NAMES {
            let spec = ModelSpec::standard(name).unwrap();
            assert_eq!(spec.name, name);
            spec.validate().unwrap();
        }
        let err = ModelSpec::standard("nope").unwrap_err().to_string();
        assert!(err.contains("handoff"), "{err}");
    }
}
