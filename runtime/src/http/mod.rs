//! The SGLang-compatible HTTP front of the router: HTTP/1.1 from hyper on a tokio
//! runtime of its own (two worker threads), keep-alive, `Expect: 100-continue` and
//! chunked request bodies as hyper does them.
//!
//! Endpoints: `POST /generate` (SGLang's native body: `text` or `input_ids`,
//! `sampling_params.max_new_tokens`, `stream`; and the write-ups' body: `prompt`,
//! `max_tokens`, `model`), the OpenAI API (`POST /v1/completions`,
//! `POST /v1/chat/completions`, `GET /v1/models`, [`openai`]), `GET /get_model_info`,
//! `GET /get_server_info`, `GET /metrics` (Prometheus text, [`metrics`]), `GET /health`.
//!
//! Limits ([`FrontLimits`]): a request's head is at most [`MAX_HEAD`] bytes (431), its
//! body at most [`MAX_BODY`] bytes (413, from its `Content-Length` before a byte of it
//! is read, or as a chunked body passes the limit); the head must arrive within the
//! read deadline (10 s; hyper closes the connection) and the body within the deadline
//! after the head (408); at most 1,024 connections are open at once (503 beyond).
//! A body that is not JSON, has a field of the wrong type, an empty prompt, a prompt
//! over [`MAX_PROMPT_TOKENS`], or `max_new_tokens` outside `1..=max_new_tokens_limit`
//! gets 400 naming the field ([`body`]), before anything reaches the engine (so nothing
//! is allocated for it). Prompts longer than the context are NOT refused here:
//! admission is the engine's job, and the front must not hide whether the engine does
//! it.
//!
//! A client that closes its connection before its answer cancels its request: hyper
//! drops the request's future (or its streaming body), whose [`CancelGuard`] sends
//! `NodeEvent::Cancel` to the router's loop. Nothing polls.
//!
//! Text: the front tokenizes with [`crate::tokenizer`] and submits the prompt's length;
//! the engine sends the canary prompt (`kvsim_oracle::canary`), whose token names the
//! request and the position. The front keeps every recent request's token ids (its
//! first 65,536 positions), so a reply token that echoes request `r`'s position `i`
//! reads as the word `r`'s prompt had at `i`: a reply that reads another request's
//! stale KV shows that request's words, its canary marker included.

//!
//! The front's parts: its limits (`limits`), the shapes of its answers (`response`),
//! serving connections (`conn`), the deployment's facts (`info`), what its handlers
//! share (`state`), a request submitted to the router's loop (`pending`), a streamed
//! answer (`stream`), `POST /generate` (`generate`), and which endpoint answers what
//! (`front`).

pub mod body;
pub(crate) mod conn;
pub(crate) mod front;
pub(crate) mod generate;
pub(crate) mod info;
pub(crate) mod limits;
pub mod metrics;
pub mod openai;
pub(crate) mod pending;
pub(crate) mod response;
pub(crate) mod state;
pub(crate) mod stream;

pub use conn::{read_body, spawn_server, Handler};
pub use front::{spawn_http_front, FrontParts};
pub use generate::{check_generate, MaxNew, Tokenize};
pub use info::{front_info, model_info, FrontInfo};
pub use limits::{
    FrontLimits, MAX_BODY, MAX_CONNECTIONS, MAX_HEAD, MAX_PROMPT_TOKENS, READ_DEADLINE,
};
pub use pending::{submit, CancelGuard, EventBody, Job, Pending};
pub use response::{close, error, error_body, event, full, json_reply, sse, Out};
pub use state::{FrontCounters, NodesFn, Shared};
pub use stream::{stream_reply, SglangStream, Streamer};
