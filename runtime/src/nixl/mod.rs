//! KV over NVIDIA's NIXL library (`kvsim serve --transport nixl`, the `nixl` feature):
//! the transport vLLM's, Dynamo's and SGLang's NIXL connectors move KV with, here its
//! UCX backend over TCP (measured against nixl 1.5.1, the `nixl-cu12` wheel, with its
//! bundled UCX; `nixl-sys` 1.5.2 loads the wheel's `libnixl_capi.so` at run time).
//!
//! - A decode node ([`NixlReceiver`]) registers its KV memory, the pages' floats and
//!   their tag words (`Gpu::host_memory`), with an agent of its own and pulls the
//!   agent's notifications on a thread. Its agent's metadata and the memory's layout
//!   ([`NixlMeta`](crate::kvpath::NixlMeta)) go first on each of its connections, so
//!   ahead of every page list it sends; each page's descriptors (address, length) are
//!   computed from it.
//! - A prefill node ([`NixlWriter`]) loads that metadata as its connection's reader
//!   meets it, binds each page list to it, and posts each KV write as one NIXL WRITE
//!   of its pages' floats and tag words (staged in memory it registered) with a
//!   notification naming the write. The write completes when the transfer's state
//!   says so (`getXferStatus`), polled on a thread: no code of the decode node runs.
//! - The world's record of a landing (`KvLanded` at the decode node) is written when
//!   the transfer's state says done, by the writer's loop, just before the write's
//!   completion ([`crate::node::event::NodeEvent::TransferDone`]): the first moment
//!   anyone knows the bytes are placed. Decode learns of landed writes only from
//!   notifications, and runs nothing for them; the messages that say a room's writes
//!   completed (`KvDone`, `DrainAck`) travel as notifications behind the writes', on
//!   the same UCX endpoint.
//!
//! The library is loaded with `dlopen("libnixl_capi.so")`: `LD_LIBRARY_PATH` must name
//! the wheel's library folder (`kvsim_testenv::nixl_lib_dir` installs and finds it);
//! [`available`] says why not before anything calls into it (the stub aborts).
//! `UCX_TLS=tcp` is set when unset (UCX would otherwise pick shared memory between
//! processes on one machine); `UCX_NET_DEVICES` is the caller's (`lo` on loopback).

mod agent;
pub mod bench;
mod receiver;
mod writer;

pub use agent::{available, prepare_env, PROGRESS_DELAY_US};
pub use receiver::NixlReceiver;
pub use writer::NixlWriter;
