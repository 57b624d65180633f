//! The canary: a concurrent, seeded load of marked requests, judged from outside.
//!
//! `kvsim canary` ([`run`]) speaks to any server with SGLang's `POST /generate` (a
//! real SGLang deployment or `kvsim serve --http`) or the OpenAI API;
//! `kvsim canary-client` ([`run_line`]) to `kvsim serve`'s line endpoint, where a
//! request's marker is the canary token sequence of its id (`kvsim_oracle::canary`).
//! Both draw the same plan ([`Round`]), run it on the same workers ([`run_phase`]) and
//! judge the same two facts: a 200 reply carrying another request's marker (a leak) and
//! an over-length prompt answered 200 (the incident). Only the transport and the
//! report differ.
//!
//! Every request carries a unique marker `CANARY-<kind><n>-<8 hex>` (drawn from
//! `--seed`). Phase 1 sends the short requests, whose prompts are the marker repeated,
//! so whatever KV they leave in freed pages reads as their marker. Phase 2 sends
//! `--over-length` prompts one token past the server's advertised context (read from
//! `/get_model_info`): their marker, then `x` words. Every reply is searched for markers
//! of other requests. Some clients disconnect mid-request at seeded points
//! (`--disconnect-rate`). Exit 1 when a reply carries a foreign marker (both requests
//! are printed) or an over-length prompt is answered 200; 2 when the server cannot be
//! read.
//!
//! The files: the arguments (`args`), the plan and its record (`plan`), the workers
//! (`phase`), the server's limits (`limits`), the HTTP canary (`http`) and its verdict
//! (`report`), and the line endpoint's canary (`line`).
//!
//! [`Round`]: plan::Round
//! [`run_phase`]: phase::run_phase

mod args;
mod http;
mod limits;
mod line;
mod phase;
mod plan;
mod report;

pub use args::{Api, CanaryArgs};
pub use http::run;
pub use line::{run_line, CanaryReport, LineCanaryArgs};
