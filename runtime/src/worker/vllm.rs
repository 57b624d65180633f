//! vLLM's worker API on a prefill or decode node of vLLM's family (a scenario under
//! `vllm-router`, served with `--worker-http`): what `vllm-router` 0.1.17 in
//! `--vllm-pd-disaggregation` mode drives. `/v1/completions` and
//! `/v1/chat/completions` take `kv_transfer_params` in and give them out as vLLM's
//! NIXL connector does in pull mode (vllm-project/vllm commit 0050936b,
//! `vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py`:
//! `get_num_new_matched_tokens`, `update_state_after_alloc`, `request_finished`).
//!
//! - **Prefill** (`do_remote_decode: true`): the worker takes a room of its own (vLLM's
//!   request id; the router has no rooms), starts the engine's `PrefillStart`, and
//!   answers 200 with the reply's `kv_transfer_params` once the node leased the pages
//!   (`Msg::KvParams`): `do_remote_prefill: true`, `do_remote_decode: false`,
//!   `remote_block_ids` (one KV cache group: `[[page, ...]]`), `remote_engine_id`,
//!   `remote_request_id`, `remote_host` and `remote_port` (this node's side channel:
//!   its `bootstrap` line), `tp_size`, `dcp_size`, `pp_size`, `remote_num_tokens`,
//!   `remote_blocks_expiry_time` (null on a prefill node), `transfer_mode: "pull"`;
//!   and kvsim's own `kvsim_block_gens`, each page's generation (the page tag's other
//!   half, which the trace names; the router copies the params verbatim).
//! - **Decode** (`do_remote_prefill: true` and those fields): the worker asks the side
//!   channel for the engine's facts (`GET /kvsim/vllm_handshake`: its engine id and
//!   block count, as vLLM's NIXL handshake exchanges them), checks the params against
//!   them, takes the room and starts the engine's `PullStart`; decode READs the pages
//!   over the nodes' connection and notifies prefill (the engine's pull, `world::read`).
//!
//! Bad params get 400 naming the field: missing or mistyped, a request id no prefill
//! of this kind gives, an address that names no prefill node, an engine id that is not
//! the one at that address (a restarted prefill is a new engine), a block id outside
//! the remote engine's blocks. Where vLLM differs: it logs "Got invalid
//! KVTransferParams" and recomputes the prompt locally; kvsim has no local prefill on
//! a decode node, so it refuses.

use crate::http::conn::read_body;
use crate::http::openai;
use crate::http::response::{json_reply, Out};
use crate::node::reply::Reply;
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use crate::worker::check::{check_openai, Half};
use crate::worker::decode::{decode_answer, prefill_of, stream};
use crate::worker::start::{bounded, engine_error, start};
use crate::worker::state::{count, release_room, room_key, take_room, Worker};
use hyper::body::Incoming;
use hyper::{Request, Response};
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RequestId};
use kvsim_engine::msg::Msg;
use serde_json::{json, Value};
use std::time::Duration;

/// The prefix of the request ids a vLLM-kind prefill gives (`remote_request_id`).
const REQUEST_ID: &str = "kvsim-room-";

/// A node's engine id, as vLLM's handshake names an engine: each incarnation is a new
/// engine.
pub(super) fn engine_id(node: NodeId, epoch: u32) -> String {
    format!("kvsim-{node}-e{epoch}")
}

/// A 400 in OpenAI's error shape, counted.
fn refuse<K>(w: &Worker<K>, status: u16, msg: &str) -> Response<Out> {
    count(w, status);
    openai::error(status, msg)
}

/// `/v1/completions` or `/v1/chat/completions` on a vLLM-kind worker.
pub(super) async fn generate<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    path: &str,
    req: Request<Incoming>,
) -> Response<Out> {
    let b = match read_body(req, w.p.limits.read_deadline).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    w.counters.requests.fetch_add(1, Ordering::Relaxed);
    let checked = check_openai(w, path, &b).and_then(|c| Ok((c, params_of(&b)?)));
    let (c, params) = match checked {
        Ok(x) => x,
        Err(msg) => {
            w.counters.rejected_by_front.fetch_add(1, Ordering::Relaxed);
            return refuse(w, 400, &msg);
        }
    };
    let half = Half {
        job: c.job.clone(),
        openai: Some(c),
        room: 0,
        bootstrap: String::new(),
    };
    match w.p.role {
        kvsim_engine::node::Role::Prefill => prefill(w, half, &params).await,
        _ => decode(w, half, &params).await,
    }
}

/// The body's `kv_transfer_params` object (400 without one: a worker of a
/// disaggregated pair serves only its half).
fn params_of(b: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(b).map_err(|e| format!("body: {e}"))?;
    match v.get("kv_transfer_params") {
        Some(p @ Value::Object(_)) => Ok(p.clone()),
        Some(_) => Err("kv_transfer_params: not an object".into()),
        None => Err(
            "kv_transfer_params: missing (a vLLM disaggregated worker serves \
                     only its half; vllm-router sends them)"
                .into(),
        ),
    }
}

/// `field` of the params as a flag; missing or null is false.
fn flag(p: &Value, field: &str) -> Result<bool, String> {
    match &p[field] {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(format!(
            "kv_transfer_params.{field}: {other} is not a boolean"
        )),
    }
}

/// Prefill: run the prompt, keep its pages under the lease, answer with the params.
async fn prefill<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    mut half: Half,
    p: &Value,
) -> Response<Out> {
    match flag(p, "do_remote_decode") {
        Ok(true) => {}
        Ok(false) => {
            let why = "kv_transfer_params.do_remote_decode: must be true on a vLLM prefill \
                       (kv_producer) worker";
            return refuse(w, 400, why);
        }
        Err(m) => return refuse(w, 400, &m),
    }
    let [decode] = w.p.decodes[..] else {
        let why = format!(
            "a vLLM prefill here pairs with exactly one decode node (vLLM's prefill learns \
             its reader only from the READ; kvsim's names it at the start): this \
             deployment has {}",
            w.p.decodes.len()
        );
        return refuse(w, 503, &why);
    };
    let r = w.next_room.fetch_add(1, Ordering::Relaxed);
    if let Err((st, msg)) = take_room(w, r) {
        return refuse(w, st, &msg);
    }
    half.room = r;
    let key = room_key(r);
    let msg = Msg::PrefillStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        decode,
    };
    let answer = match start(w, key, msg, &half.job, (false, None)) {
        Ok(mut pending) => {
            let mut tokens = Vec::new();
            let reply = bounded(w, &mut pending, &mut tokens).await;
            prefill_answer(w, &half, reply, pending.params.take())
        }
        Err(m) => refuse(w, 503, &m),
    };
    release_room(w, r);
    answer
}

/// Prefill's HTTP answer: the engine's refusal, or 200 with `kv_transfer_params`.
fn prefill_answer<K>(
    w: &Worker<K>,
    half: &Half,
    reply: Option<Reply>,
    params: Option<(Vec<PageTag>, u64)>,
) -> Response<Out> {
    let r = half.room;
    let Some(reply) = reply else {
        return refuse(
            w,
            504,
            &format!("the prefill of {REQUEST_ID}{r} got no answer in time"),
        );
    };
    if reply.status != 200 {
        let why = reply.reason.clone();
        return refuse(
            w,
            reply.status,
            &why.unwrap_or_else(|| engine_error(reply.status, "prefill")),
        );
    }
    let (Some((src, tokens)), Some(c)) = (params, &half.openai) else {
        return refuse(
            w,
            500,
            "the prefill answered 200 without its kv_transfer_params",
        );
    };
    count(w, 200);
    let (host, port) = match w.bootstrap_addr {
        Some(a) => (json!(a.ip().to_string()), json!(a.port())),
        None => (Value::Null, Value::Null),
    };
    let mut v = openai::answer(c, &openai::reply_id(c, r), "", 0);
    v["kv_transfer_params"] = json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": [src.iter().map(|t| t.page.0).collect::<Vec<_>>()],
        "remote_engine_id": engine_id(w.p.id, w.p.epoch),
        "remote_request_id": format!("{REQUEST_ID}{r}"),
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": tokens,
        "remote_blocks_expiry_time": null,
        "transfer_mode": "pull",
        "kvsim_block_gens": src.iter().map(|t| t.gen.0).collect::<Vec<_>>(),
    });
    json_reply(200, &v)
}

/// What decode's params name, checked against the side channel's handshake.
struct Pull {
    r: u64,
    prefill: NodeId,
    epoch: u32,
    src: Vec<PageTag>,
}

/// A string field of the params.
fn text<'a>(p: &'a Value, field: &str) -> Result<&'a str, String> {
    p[field].as_str().ok_or_else(|| {
        format!(
            "kv_transfer_params.{field}: missing or not a string ({})",
            p[field]
        )
    })
}

/// The params' block ids and generations, as page tags (one KV cache group).
fn blocks(p: &Value) -> Result<Vec<PageTag>, String> {
    let field = "kv_transfer_params.remote_block_ids";
    let ids = match &p["remote_block_ids"] {
        Value::Array(groups) if !groups.is_empty() && groups.iter().all(Value::is_array) => {
            match &groups[..] {
                [one] => one.as_array().cloned().unwrap_or_default(),
                _ => {
                    return Err(format!(
                        "{field}: {} KV cache groups; kvsim has one",
                        groups.len()
                    ))
                }
            }
        }
        Value::Array(flat) => flat.clone(),
        other => return Err(format!("{field}: {other} is not a list of block ids")),
    };
    let gens = p["kvsim_block_gens"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if ids.is_empty() || gens.len() != ids.len() {
        return Err(format!(
            "{field}: {} block ids with {} kvsim_block_gens (one each, at least one)",
            ids.len(),
            gens.len()
        ));
    }
    ids.iter()
        .zip(&gens)
        .map(
            |(b, g)| match (b.as_u64().and_then(|b| u32::try_from(b).ok()), g.as_u64()) {
                (Some(page), Some(gen)) => Ok(PageTag {
                    page: PageId(page),
                    gen: Generation(gen),
                }),
                _ => Err(format!("{field}: {b} (generation {g}) is not a block id")),
            },
        )
        .collect()
}

/// Decode's params, checked: the field named in each refusal.
async fn pull_of<K>(w: &Worker<K>, p: &Value) -> Result<Pull, String> {
    if !flag(p, "do_remote_prefill")? {
        return Err(
            "kv_transfer_params.do_remote_prefill: must be true on a vLLM decode \
                    (kv_consumer) worker"
                .into(),
        );
    }
    let id = text(p, "remote_request_id")?;
    let r = id
        .strip_prefix(REQUEST_ID)
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|r| *r < 1 << 63)
        .ok_or_else(|| {
            format!(
                "kv_transfer_params.remote_request_id: `{id}` is no request id a prefill of \
                     this deployment gives ({REQUEST_ID}N)"
            )
        })?;
    let host = text(p, "remote_host")?;
    let port = p["remote_port"]
        .as_u64()
        .filter(|p| *p <= 65535)
        .ok_or_else(|| {
            format!(
                "kv_transfer_params.remote_port: {} is not a port",
                p["remote_port"]
            )
        })?;
    let addr = format!("{host}:{port}");
    let prefill = prefill_of(w, &addr).ok_or_else(|| {
        format!(
            "kv_transfer_params.remote_host/remote_port: {addr} names no prefill node of \
                 this deployment"
        )
    })?;
    let engine = text(p, "remote_engine_id")?;
    let src = blocks(p)?;
    let (theirs, epoch, pages) = handshake(&addr).await?;
    if engine != theirs {
        return Err(format!(
            "kv_transfer_params.remote_engine_id: `{engine}` is not the engine at {addr} \
             (`{theirs}`)"
        ));
    }
    if let Some(t) = src.iter().find(|t| u64::from(t.page.0) >= pages) {
        return Err(format!(
            "kv_transfer_params.remote_block_ids: block {} is not one of engine `{theirs}`'s \
             {pages} blocks",
            t.page.0
        ));
    }
    Ok(Pull {
        r,
        prefill,
        epoch,
        src,
    })
}

/// The side channel's handshake at `addr`: the engine id, incarnation and block count.
async fn handshake(addr: &str) -> Result<(String, u32, u64), String> {
    let url = format!("http://{addr}");
    let got = tokio::task::spawn_blocking(move || {
        let a = crate::http_client::agent(Duration::from_secs(5));
        crate::http_client::fetch_with(&a, &url, "GET", "/kvsim/vllm_handshake", None)
    })
    .await;
    let fail = |e: String| {
        format!(
            "kv_transfer_params.remote_host/remote_port: the handshake \
                                    with {addr} failed: {e}"
        )
    };
    let rep = match got {
        Ok(Ok(rep)) if rep.status == 200 => rep,
        Ok(Ok(rep)) => return Err(fail(format!("{} {}", rep.status, rep.text()))),
        Ok(Err(e)) => return Err(fail(e.to_string())),
        Err(e) => return Err(fail(e.to_string())),
    };
    let v: Value = serde_json::from_slice(&rep.body).map_err(|e| fail(e.to_string()))?;
    match (
        v["engine_id"].as_str(),
        v["epoch"].as_u64(),
        v["num_blocks"].as_u64(),
    ) {
        (Some(e), Some(epoch), Some(n)) => Ok((e.to_string(), epoch as u32, n)),
        _ => Err(fail(format!(
            "an answer without engine_id, epoch, num_blocks: {v}"
        ))),
    }
}

/// Decode: check the params, take the room, pull and run.
async fn decode<K: Send + 'static>(w: &Arc<Worker<K>>, mut half: Half, p: &Value) -> Response<Out> {
    let pull = match pull_of(w, p).await {
        Ok(pull) => pull,
        Err(m) => return refuse(w, 400, &m),
    };
    let r = pull.r;
    if let Err((st, msg)) = take_room(w, r) {
        return refuse(w, st, &msg);
    }
    half.room = r;
    let key = room_key(r);
    let msg = Msg::PullStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        max_new_tokens: half.job.max_new_tokens,
        prefill: pull.prefill,
        src: pull.src,
    };
    let mut pending = match start(w, key, msg, &half.job, (false, Some(pull.epoch))) {
        Ok(p) => p,
        Err(m) => {
            release_room(w, r);
            return refuse(w, 503, &m);
        }
    };
    if half.job.stream {
        return stream(w, pending, half);
    }
    let mut tokens = Vec::new();
    let answer = match bounded(w, &mut pending, &mut tokens).await {
        Some(reply) => decode_answer(w, &half, reply, tokens),
        None => refuse(
            w,
            504,
            &format!("the decode of {REQUEST_ID}{r} got no answer in time"),
        ),
    };
    release_room(w, r);
    answer
}

/// The side channel's handshake (`GET /kvsim/vllm_handshake` on a prefill node's
/// bootstrap address): what vLLM's NIXL handshake tells a reader of an engine.
pub(super) async fn handshake_reply<K>(w: &Arc<Worker<K>>) -> Response<Out> {
    let nodes_fn = w.p.nodes.clone();
    let nodes = tokio::task::spawn_blocking(move || nodes_fn())
        .await
        .unwrap_or_default();
    let pages = nodes
        .iter()
        .find(|n| n.node == w.p.id)
        .and_then(|n| n.pool_pages);
    json_reply(
        200,
        &json!({
            "engine_id": engine_id(w.p.id, w.p.epoch),
            "node": w.p.id.0,
            "epoch": w.p.epoch,
            "num_blocks": pages,
            "block_size": w.p.info.page_size,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The params a decode worker is given: one KV cache group or a flat list, each
    /// block with its generation; anything else is refused naming the field.
    #[test]
    fn block_ids_and_generations_make_page_tags_or_a_refusal_naming_the_field() {
        let tag = |page, gen| PageTag {
            page: PageId(page),
            gen: Generation(gen),
        };
        let p = json!({"remote_block_ids": [[3, 4]], "kvsim_block_gens": [7, 8]});
        assert_eq!(blocks(&p), Ok(vec![tag(3, 7), tag(4, 8)]));
        let p = json!({"remote_block_ids": [3], "kvsim_block_gens": [7]});
        assert_eq!(blocks(&p), Ok(vec![tag(3, 7)]));
        for (bad, says) in [
            (
                json!({"remote_block_ids": [[3], [4]], "kvsim_block_gens": [7, 8]}),
                "2 KV cache groups",
            ),
            (
                json!({"remote_block_ids": [[3, 4]], "kvsim_block_gens": [7]}),
                "2 block ids with 1",
            ),
            (
                json!({"remote_block_ids": [], "kvsim_block_gens": []}),
                "at least one",
            ),
            (
                json!({"remote_block_ids": "3", "kvsim_block_gens": [7]}),
                "not a list",
            ),
            (
                json!({"remote_block_ids": [-1], "kvsim_block_gens": [7]}),
                "is not a block id",
            ),
        ] {
            let e = blocks(&bad).expect_err("refused");
            assert!(
                e.starts_with("kv_transfer_params.remote_block_ids") && e.contains(says),
                "{e}"
            );
        }
    }

    /// The body's params: an object, named when missing or mistyped; a flag is a
    /// boolean or absent.
    #[test]
    fn params_and_flags_are_refused_naming_the_field() {
        assert!(params_of(br#"{"prompt":"a"}"#)
            .is_err_and(|e| e.contains("kv_transfer_params: missing")));
        assert!(
            params_of(br#"{"kv_transfer_params":[1]}"#).is_err_and(|e| e.contains("not an object"))
        );
        let p = params_of(br#"{"kv_transfer_params":{"do_remote_decode":true}}"#).unwrap();
        assert_eq!(flag(&p, "do_remote_decode"), Ok(true));
        assert_eq!(flag(&p, "do_remote_prefill"), Ok(false));
        let p = json!({"do_remote_prefill": 1});
        assert!(flag(&p, "do_remote_prefill")
            .is_err_and(|e| e.contains("kv_transfer_params.do_remote_prefill")));
        assert_eq!(engine_id(NodeId(1), 2), "kvsim-n1-e2");
    }
}
