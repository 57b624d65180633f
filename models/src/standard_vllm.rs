//! vLLM's standard models (its NIXL connector's pull under `vllm-router`), beside
//! `standard.rs`'s (whose file is at its size limit). A private module, as
//! `standard.rs`: its items are inherent items of [`ModelSpec`], listed in
//! [`ModelSpec::NAMES`].

use crate::model::names;
use crate::spec::{model_engine, ClientSpec, FaultBounds, ModelSpec, Nodes};
use kvsim_engine::config::RouterPolicy;

impl ModelSpec {
    /// `vllm-pull`: vLLM's NIXL connector (pull) under `vllm-router` (the nodes of
    /// `nodes/prefill_vllm/` and `nodes/decode/pull.rs`): prefill runs first and keeps
    /// its pages under a lease, decode reads them with one RDMA READ and NIXL's
    /// notification frees them, heartbeats renew the lease. One 3-token request whose
    /// client may disconnect at any point (the router closes the one open upstream),
    /// one lost control message (a start, an answer, the params, a heartbeat, the
    /// notification) and one failed RDMA operation (the READ or its response). No
    /// timeout fires early: the lease expires only once nothing else can happen (decode
    /// will never read).
    pub fn vllm_pull() -> ModelSpec {
        let mut engine = model_engine();
        engine.router = RouterPolicy::VllmRouter;
        ModelSpec {
            name: "vllm-pull".into(),
            about: "vllm-router and vLLM's pull; 1 prefill (2 pages), 1 decode (2 pages), \
                    context 16; one 3-token request whose client may disconnect at any point; \
                    at most 1 lost control message and 1 failed READ (or its response)"
                .into(),
            engine,
            nodes: Nodes::ONE_EACH,
            prefill_pages: 2,
            decode_pages: 2,
            clients: vec![ClientSpec::normal(1, 3).aborting()],
            faults: FaultBounds {
                losses: 1,
                write_failures: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES],
            detections_hold: false,
        }
    }

    /// `vllm-lease-race`: `vllm-pull` with two requests of two tenants (prefill's
    /// pool holds one at a time, so the second reuses the first's pages) and one
    /// timeout that fires early: the lease may run out while the first READ is on
    /// its way (the READ slower than the lease, aws-samples/aws-do-eks#84). The
    /// defended pair has nothing against it: the model finds S2 (the READ served
    /// after its lease expired), and S3 where the pages were handed to the other
    /// request first.
    pub fn vllm_lease_race() -> ModelSpec {
        let mut spec = ModelSpec::vllm_pull();
        spec.name = "vllm-lease-race".into();
        spec.about = "vllm-pull with two requests of two tenants sharing prefill's pages, \
                      no lost message or failed READ, and one premature timeout (the lease)"
            .into();
        spec.clients = vec![ClientSpec::normal(1, 3), ClientSpec::normal(2, 3)];
        spec.faults = FaultBounds {
            early_timeouts: 1,
            ..FaultBounds::default()
        };
        spec
    }

    /// `vllm-crash`: `vllm-pull` with one crash (and restart) of the prefill or the
    /// decode node instead of the lost message: the remote disconnect of vLLM's unit
    /// tests (`test_nixl_connector.py`'s transfer failures and aborts): a prefill that
    /// dies with its lease while the READ or its response is on the wire (the READ
    /// fails back to its reader, `world::crash_fate`), a decode that dies with its READ
    /// posted. One 3-token request whose client may disconnect at any point, one failed
    /// READ (or its response).
    pub fn vllm_crash() -> ModelSpec {
        let mut spec = ModelSpec::vllm_pull();
        spec.name = "vllm-crash".into();
        spec.about = "vllm-pull with one crash of the prefill or the decode node (no lost \
                      message): a client that may disconnect, 1 failed READ, 1 crash"
            .into();
        spec.faults = FaultBounds {
            write_failures: 1,
            crashes: 1,
            ..FaultBounds::default()
        };
        spec.reaches = vec![names::COMPLETES, names::CRASH];
        spec
    }
}
