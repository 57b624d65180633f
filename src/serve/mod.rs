//! `kvsim serve`: the engine on threads, sockets and clocks (kvsim-runtime). This
//! folder is the whole of serve's code: its arguments (`args`), the peers file and
//! address lists (`peers`), starting and draining the server (`start`) and the
//! stdout lines that announce its addresses (`lines`).
//!
//! The load generators (`kvsim bench-client` and friends) are not serve's code; they
//! live in `src/bench.rs` and are re-exported here only so that their old paths
//! (`kvsim::serve::bench`, ...) keep working.

mod args;
mod lines;
mod peers;
mod start;

pub use crate::bench::{
    bench, bench_http, bench_transfer, BenchArgs, BenchClient, BenchHttpArgs, BenchTransferArgs,
};
pub use args::{Compute, Prompts, ServeArgs};
pub use lines::{endpoint_of, http_of, worker_of};
pub use peers::{node_list, parse_bootstraps, parse_peers};
pub use start::serve;
