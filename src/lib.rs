//! The `kvsim` package: the command line's library half (the default suite).
//!
//! Logic that the CLI prints lives here or in the crates below, so tests reach it
//! directly; `src/main.rs` only parses arguments and prints.

mod bench;
pub mod cmd_audit;
pub mod cmd_bugs;
pub mod cmd_check;
pub mod cmd_lease;
pub mod cmd_sim;
pub mod cmd_ttc;
pub mod html;
pub mod raw_http;
pub mod render;
pub mod serve;
pub mod suite;
pub mod suite_protocols;
pub mod suite_row;
