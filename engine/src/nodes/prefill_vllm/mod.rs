//! vLLM's prefill node, of its NIXL connector's pull mode (as of vllm-project/vllm
//! commit 0050936b, `vllm/distributed/kv_transfer/kv_connector/v1/nixl/`:
//! `pull_scheduler.py`, `base_scheduler.py`; `pull_worker.py` as of 0316d25a). It runs
//! a request's prompt (the router asks for one token), answers the router 200 with the
//! reply's `kv_transfer_params` (`Msg::KvParams`: its pages, as `remote_block_ids`)
//! and keeps the pages after its run (`request_finished`: `delay_free_blocks`) under a
//! lease of `Timeouts::lease_ns` (`kv_lease_duration`). It frees them when decode's
//! READ notification arrives (`Msg::ReadNotify`), or when the lease runs out; decode's
//! heartbeats (`Msg::Heartbeat`) renew it. Decode reads the pages with one-sided RDMA
//! READ: the world serves a read at this node's NIC (`world::serve_read`), and this
//! node's software never sees one.
//!
//! What it leaves out of vLLM: chunked prefill, prefix caching, host buffers,
//! heterogeneous TP and the handshake (docs/DECISIONS.md, "vLLM's protocol").

mod dispatch;
mod lease;
mod state;

pub use state::{VllmPhase, VllmPrefill};
