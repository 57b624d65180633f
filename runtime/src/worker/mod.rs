//! SGLang's worker API on a prefill or decode node (worker mode, `kvsim serve --node N
//! --worker-http ADDR`): what SGLang's router (`sglang-router` 0.3.2 in
//! `--pd-disaggregation` mode) drives. No engine router runs: the worker front plays
//! its part of starting and aborting halves, delivering the engine's own
//! `PrefillStart`, `DecodeStart` and `Abort` to the node as from the router, and
//! turning what the half sends the router (`TokenOut`, `PrefillFinished`,
//! `DecodeFinished`) into the HTTP answer.
//!
//! Endpoints: `POST /generate` (the router's body: `text` or `input_ids`,
//! `sampling_params`, `stream`, `bootstrap_host`, `bootstrap_port`, `bootstrap_room`,
//! single or the batch form of lists; and the OpenAI API's completions and chat
//! completions with the same pairing fields), `GET /health`, `/health_generate`, `/get_server_info`
//! (with `disaggregation_mode` and, for prefill, `disaggregation_bootstrap_port`),
//! `/get_model_info`, `/metrics`, `/get_load`. A prefill node also serves its bootstrap
//! endpoint (`POST /kvsim/bootstrap {"room", "decode"}`) on its bootstrap port: a
//! decode node given a room registers there, naming itself, so prefill learns which
//! decode node its half pairs with (SGLang's decode likewise registers with prefill's
//! bootstrap server). Decode finds its prefill node from `bootstrap_host:bootstrap_port`
//! (the deployment's `bootstrap` lines); an address that names no prefill node gets 400.
//!
//! Rooms: the router's 63-bit `bootstrap_room` `r` is the engine's room key
//! `RoomKey { room: 1 + r mod (2^32 - 1), gen: r }` on both halves (they agree with no
//! exchange) and the request id `r`. Distinct rooms give distinct keys. Nothing the
//! router sends is trusted: a room live here already gets 400; a room whose number
//! this node has used with a later generation (the engine would take it for a late
//! copy and ignore it) gets 503, which the router retries with a new room; a prefill
//! half whose decode never registers gets 504 after the engine's bootstrap bound; a
//! half the engine leaves unanswered is aborted and answered 504 after a bound; a
//! client that closes the connection aborts its half, as the router would.
//!
//! On a node of vLLM's family (a scenario under `vllm-router`) the completions
//! endpoints are vLLM's instead, with `kv_transfer_params` in and out ([`vllm`]).
//!
//! The worker front's parts: what it is given and keeps (`state`), the halves a body
//! asks for (`check`), a half at the node (`start`), prefill's side (`prefill`),
//! decode's side (`decode`), and which endpoint answers what (`routes`).

pub(crate) mod carry;
pub(crate) mod check;
pub(crate) mod decode;
pub(crate) mod prefill;
pub(crate) mod routes;
pub(crate) mod start;
pub(crate) mod state;
pub(crate) mod vllm;

pub use routes::spawn_worker;
pub use state::{room_key, WorkerParts};
