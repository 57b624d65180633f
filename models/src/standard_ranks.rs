//! The standard model of rooms with several sender ranks (issue 37, class 1), beside
//! `standard.rs`'s (whose file is at its size limit).

use crate::spec::{FaultBounds, ModelSpec};

impl ModelSpec {
    /// `vllm-ranks`: `vllm-pull` with two sender ranks a room (issue 37, class 1):
    /// decode reads the 3-token prompt's two pages with two READ handles, one per
    /// remote prefill rank (one page each), and the transfer ends when both are
    /// counted; prefill frees its pages once both ranks' notifications came. The client
    /// may disconnect at any point, and one READ (or its response) may fail, so one
    /// handle fails while its sibling is in flight. No lost message (the two handles
    /// double the interleavings already). Small enough for the default `cargo test`.
    pub fn vllm_ranks() -> ModelSpec {
        let mut spec = ModelSpec::vllm_pull();
        spec.name = "vllm-ranks".into();
        spec.about = "vllm-pull with two sender ranks a room (two READ handles of one page \
                      each); one 3-token request whose client may disconnect at any point; at \
                      most 1 failed READ (or its response)"
            .into();
        spec.engine.ranks = 2;
        spec.faults = FaultBounds {
            write_failures: 1,
            ..FaultBounds::default()
        };
        spec
    }
}
