//! kvsim-engine: a miniature disaggregated inference engine as deterministic state
//! machines.
//!
//! The [`router::Router`], [`prefill::PrefillNode`] and [`decode::DecodeNode`] run the
//! prefill-to-decode handoff of SGLang's disaggregated serving (bootstrap room, page
//! list, chunked KV writes, completion, abort and drain acks) with its defenses
//! (`config::Defenses`) and, behind [`bugs::BugSet`], the historical bugs. The crate is
//! pure: it does no I/O, reads no clock, starts no thread and draws no random number.
//! Time, delivery and randomness belong to the driver: a handler records what it asks
//! for in an [`env::Outbox`]; KV memory and compute belong to the node's [`gpu::Gpu`]. Same inputs in the same order give
//! the same effects, bit for bit.
//!
//! Drive a node with [`node::Node::handle`]; effects leave through the `Outbox` in the
//! order they were issued (messages, timers, trace events interleaved as called).

pub mod bugs;
pub mod compute;
pub mod config;
pub mod counters;
pub mod enum_table;
pub mod env;
pub mod gpu;
/// The hand-stepped test driver: behind the `testing` feature, as the fault injection
/// of [`world`] is (`alter`, `WriteHistory`, `stale_landing`, `duplicate_completion`).
/// The simulator and the models turn the feature on, so a workspace build compiles
/// it; the serving binary, `kvsim-server`, links none of it (the root package's
/// `tests/product_boundary.rs` reads its symbols).
#[cfg(feature = "testing")]
pub mod harness;
pub mod ids;
pub mod invariant;
pub mod kv;
pub mod msg;
mod nodes;
pub mod shared_cfg;
pub mod step;
mod sync;
pub mod trace;
pub mod transport;
pub mod world;

pub use bugs::{Bug, BugSet};
pub use config::{ConfigError, Defenses, EngineConfig, RouterPolicy};
pub use counters::Counters;
pub use enum_table::every;
pub use env::{Effect, Input, Outbox, Timer, TimerOp, Trace};
pub use ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomId, RoomKey, TenantId, Token, WriteId,
};
pub use invariant::{Invariant, Violation};
pub use msg::{Carried, KvWrite, Msg, Status, TransferOutcome, Why};
pub use node::{Node, Role};
pub use nodes::{decode, node, prefill, prefill_vllm, retired, router, worker};
pub use shared_cfg::Cfg;
pub use trace::TraceEvent;

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived tables hold every variant in declaration order, named as the hand-kept
    /// tables named them.
    #[test]
    fn derived_tables_keep_every_variant_and_its_name() {
        assert_eq!(Bug::ALL.len(), 23);
        assert_eq!(Bug::ALL[16], Bug::FirstFailedHandleFrees);
        assert_eq!(Bug::ALL[20], Bug::LeaseIgnoresHeartbeat);
        assert_eq!(Bug::ALL[22], Bug::PrefillDropsFailedPageList);
        assert_eq!(
            Bug::PrefillDropsFailedPageList.name(),
            "prefill-drops-failed-page-list"
        );
        assert_eq!(Bug::ALL[0], Bug::GateChecksFinishedOnly);
        assert_eq!(Bug::ALL[12], Bug::AbortAfterSuccess);
        assert_eq!(Bug::ALL[13], Bug::ChunkIndexByPosition);
        assert_eq!(Bug::ChunkIndexByPosition.name(), "chunk-index-by-position");
        assert_eq!(Bug::FailOpenOnRecvError.name(), "fail-open-on-recv-error");
        assert_eq!(world::DataFault::StaleDuplicate.name(), "stale-duplicate");
        assert_eq!(RouterPolicy::SglangRouter.name(), "sglang-router");
        assert_eq!(RouterPolicy::VllmRouter.name(), "vllm-router");
        assert_eq!(
            RouterPolicy::ALL,
            [
                RouterPolicy::Careful,
                RouterPolicy::SglangRouter,
                RouterPolicy::VllmRouter
            ]
        );
        assert_eq!(
            RouterPolicy::of(config::Protocol::Sglang),
            [RouterPolicy::Careful, RouterPolicy::SglangRouter]
        );
        assert_eq!(
            RouterPolicy::of(config::Protocol::Vllm),
            [RouterPolicy::VllmRouter]
        );
        assert!(RouterPolicy::VllmRouter.sequential());
        assert!(!RouterPolicy::VllmRouter.cancels_other_half());
        assert_eq!(RouterPolicy::VllmRouter.max_attempts(), 1);
        assert_eq!(Invariant::ALL[10], Invariant::L1);
        assert!(RouterPolicy::Careful.cancels_other_half());
        assert!(!RouterPolicy::SglangRouter.cancels_other_half());
        assert_eq!(RouterPolicy::Careful.max_attempts(), 1);
        assert_eq!(
            RouterPolicy::SglangRouter.max_attempts(),
            router::SGLANG_MAX_ATTEMPTS
        );
        assert_eq!(every::<u8, 2>(&[1, 2]), [1, 2]);
    }
}
