//! kvsim-ops: the operator tools, for a real deployment (SGLang's) as much as for
//! `kvsim serve`.
//!
//! [`canary`] is the one canary load: seeded marked requests, over-length prompts and
//! client disconnects, judged from outside (a reply carrying another request's marker,
//! an over-length prompt answered 200), against SGLang's `/generate` or the OpenAI API
//! (`kvsim canary`) or against `kvsim serve`'s line endpoint (`kvsim canary-client`).
//! [`preflight`] reads the incident write-ups' four gate conditions from running
//! servers, from numbers given by hand, or from a scenario. HTTP goes through `ureq`
//! (`kvsim_runtime::http_client`); the one hand-written request is a client that goes
//! away mid-request on purpose, which no HTTP client does. The CLI's commands are thin
//! wrappers over these.

pub mod canary;
pub mod preflight;
