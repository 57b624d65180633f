//! A worker front's serving ([`spawn_worker`]): which endpoint answers each request,
//! its server info, and a `/generate` run as one half or a batch of them, each in a
//! room taken for it. Not what a prefill or a decode half does
//! ([`crate::worker::prefill`], [`crate::worker::decode`]).

use crate::http::conn::{read_body, spawn_server, Handler};
use crate::http::info::model_info;
use crate::http::metrics;
use crate::http::openai;
use crate::http::response::{error, full, json_reply, Out};
use crate::http::state::FrontCounters;
use crate::sync::atomic::Ordering;
use crate::sync::{Arc, Mutex};
use crate::tokenizer::Vocab;
use crate::worker::carry::spawn_carrier;
use crate::worker::check::{check_halves, Half};
use crate::worker::decode::{decode, prefill_done};
use crate::worker::prefill::{bootstrap_route, prefill};
use crate::worker::state::{count, fail, release_room, take_room, Rooms, Worker, WorkerParts};
use crate::worker::vllm;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use kvsim_engine::config::Protocol;
use kvsim_engine::node::Role;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::TcpListener;

/// Serve the worker API on `listener` (and a prefill node's bootstrap on `bootstrap`).
pub fn spawn_worker<K: Send + 'static>(
    listener: TcpListener,
    bootstrap: Option<TcpListener>,
    p: WorkerParts<K>,
) -> std::io::Result<()> {
    let bootstrap_addr = match &bootstrap {
        Some(b) => Some(b.local_addr()?),
        None => None,
    };
    let bootstrap_port = bootstrap_addr.map(|a| a.port());
    let max = p.limits.max_connections;
    let rooms = Mutex::new(Rooms::new(&p.cfg));
    let p_epoch = p.epoch;
    let w = Arc::new(Worker {
        fail_first: crate::sync::atomic::AtomicU64::new(p.fail_first),
        p,
        vocab: Mutex::new(Vocab::new()),
        rooms,
        pending: Mutex::new(BTreeMap::new()),
        decode_urls: Mutex::new(BTreeMap::new()),
        counters: FrontCounters::default(),
        bootstrap_port,
        bootstrap_addr,
        next_room: crate::sync::atomic::AtomicU64::new((u64::from(p_epoch) << 40) + 1),
    });
    spawn_carrier(&w)?;
    let name = format!("{}-worker", w.p.id);
    let w1 = w.clone();
    let handler: Handler = Arc::new(move |req| {
        let w = w1.clone();
        Box::pin(async move { route(&w, req).await })
    });
    spawn_server(listener, &name, max, handler)?;
    if let Some(b) = bootstrap {
        let handler: Handler = Arc::new(move |req| {
            let w = w.clone();
            Box::pin(async move { bootstrap_route(&w, req).await })
        });
        spawn_server(b, &format!("{name}-bootstrap"), max, handler)?;
    }
    Ok(())
}

async fn route<K: Send + 'static>(w: &Arc<Worker<K>>, req: Request<Incoming>) -> Response<Out> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/health" | "/health_generate") => full(200, "text/plain", ""),
        (&Method::GET, "/get_model_info" | "/model_info") => {
            json_reply(200, &model_info(&w.p.info))
        }
        (&Method::GET, "/get_server_info" | "/server_info") => json_reply(200, &server_info(w)),
        (&Method::GET, "/v1/models") => json_reply(200, &openai::models(&w.p.info)),
        (&Method::GET, "/get_load") => {
            let live = w.rooms.lock().map(|r| r.live.len()).unwrap_or(0);
            json_reply(200, &json!({"load": live, "num_reqs": live}))
        }
        (&Method::GET, "/metrics") => {
            let w2 = w.clone();
            let nodes = tokio::task::spawn_blocking(move || (w2.p.nodes)())
                .await
                .unwrap_or_default();
            let text = metrics::render(w.p.info.page_size, &w.counters, &nodes);
            full(200, metrics::CONTENT_TYPE, text)
        }
        (&Method::POST, "/kvsim/prefill_done") => {
            match read_body(req, w.p.limits.read_deadline).await {
                Ok(b) => prefill_done(w, &b),
                Err(r) => r,
            }
        }
        (&Method::POST, "/v1/completions" | "/v1/chat/completions") if vllm_kind(w) => {
            vllm::generate(w, &path, req).await
        }
        (&Method::POST, "/generate") if vllm_kind(w) => error(
            404,
            "no endpoint /generate on a vLLM worker (/v1/completions, /v1/chat/completions)",
        ),
        (&Method::POST, "/generate" | "/v1/completions" | "/v1/chat/completions") => {
            match read_body(req, w.p.limits.read_deadline).await {
                Ok(b) => generate(w, &path, &b).await,
                Err(r) => r,
            }
        }
        (_, "/generate" | "/health" | "/get_model_info" | "/get_server_info" | "/metrics") => {
            error(405, &format!("method {method} not allowed on {path}"))
        }
        _ => error(404, &format!("no endpoint {path}")),
    }
}

/// A worker of vLLM's family (its scenario's router is `vllm-router`): vLLM's worker
/// API ([`vllm`]).
fn vllm_kind<K>(w: &Worker<K>) -> bool {
    w.p.cfg.router.protocol() == Protocol::Vllm
}

/// `/get_server_info`: this node's facts, SGLang's names first.
fn server_info<K>(w: &Worker<K>) -> Value {
    let mode = match w.p.role {
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Router => "null",
    };
    let me = w.p.id.to_string();
    let node = w.p.info.server_info["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["node"] == me.as_str()).cloned())
        .unwrap_or(Value::Null);
    let mut v = w.p.info.server_info.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("disaggregation_mode".into(), json!(mode));
        o.insert(
            "disaggregation_bootstrap_port".into(),
            json!(w.bootstrap_port),
        );
        o.insert(
            "max_total_num_tokens".into(),
            node["max_total_num_tokens"].clone(),
        );
        o.insert("nodes".into(), json!([node]));
    }
    v
}

async fn generate<K: Send + 'static>(w: &Arc<Worker<K>>, path: &str, body: &[u8]) -> Response<Out> {
    w.counters.requests.fetch_add(1, Ordering::Relaxed);
    let (halves, batch) = match check_halves(w, path, body) {
        Ok(h) => h,
        Err(msg) => {
            w.counters.rejected_by_front.fetch_add(1, Ordering::Relaxed);
            count(w, 400);
            return match path {
                "/generate" => error(400, &msg),
                _ => openai::error(400, &msg),
            };
        }
    };
    if !batch {
        let Some(half) = halves.into_iter().next() else {
            return fail(w, 400, "no prompt");
        };
        return one_half(w, half).await;
    }
    // The batch form: every element's half at once, the answers in order.
    let tasks: Vec<_> = halves
        .into_iter()
        .map(|h| {
            let w = w.clone();
            tokio::spawn(async move {
                let r = one_half(&w, h).await;
                let status = r.status().as_u16();
                let body = http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default();
                (
                    status,
                    serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
                )
            })
        })
        .collect();
    let mut out = Vec::new();
    let mut status = 200;
    for t in tasks {
        let (st, v) = t.await.unwrap_or((500, Value::Null));
        if st != 200 && status == 200 {
            status = st;
        }
        out.push(v);
    }
    json_reply(status, &Value::Array(out))
}

/// One half: take its room, run it, release the room (a stream releases it when its
/// body ends).
async fn one_half<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
    if let Err((st, msg)) = take_room(w, half.room) {
        return fail(w, st, &msg);
    }
    let r = half.room;
    let answer = match w.p.role {
        Role::Prefill => prefill(w, half).await,
        _ => decode(w, half).await,
    };
    if !answer.headers().contains_key("x-kvsim-streaming") {
        release_room(w, r);
    }
    answer
}
