//! A decode worker: it finds its prefill node, registers the room at prefill's
//! bootstrap, runs its half and answers (whole or streamed); and it hears prefill's
//! word that prefill's half is done. Not prefill's side ([`crate::worker::prefill`]).

use crate::http::body;
use crate::http::openai;
use crate::http::pending::{EventBody, Job, Pending};
use crate::http::response::{error, error_body, event, json_reply, sse, Out};
use crate::http::stream::{SglangStream, Streamer};
use crate::node::event::NodeEvent;
use crate::node::reply::{Reply, ReplyEv};
use crate::sync::Arc;
use crate::worker::check::Half;
use crate::worker::start::{bounded, engine_error, start};
use crate::worker::state::{count, fail, release_room, room_key, Worker};
use hyper::body::Bytes;
use hyper::Response;
use kvsim_engine::ids::{NodeId, RequestId};
use kvsim_engine::msg::Msg;
use serde_json::{json, Value};
use std::net::ToSocketAddrs;

/// The prefill node a `bootstrap_host:bootstrap_port` names.
pub(super) fn prefill_of<K>(w: &Worker<K>, bootstrap: &str) -> Option<NodeId> {
    let addrs = bootstrap.to_socket_addrs().ok()?;
    addrs
        .into_iter()
        .find_map(|a| w.p.prefills.get(&a).copied())
}

/// Decode: find prefill and hand the half to the front, which registers the room at
/// prefill's bootstrap (carried by [`crate::worker::carry`]) and then runs it.
pub(super) async fn decode<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
    let r = half.room;
    let Some(prefill) = prefill_of(w, &half.bootstrap) else {
        return fail(
            w,
            400,
            &format!(
                "bootstrap_host:bootstrap_port {} names no prefill node of this deployment",
                half.bootstrap
            ),
        );
    };
    let key = room_key(r);
    let msg = Msg::DecodeStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        max_new_tokens: half.job.max_new_tokens,
        prefill,
    };
    let mut pending = match start(w, key, msg, &half.job, (false, None)) {
        Ok(p) => p,
        Err(m) => return fail(w, 503, &m),
    };
    if half.job.stream {
        return stream(w, pending, half);
    }
    let mut tokens = Vec::new();
    let Some(reply) = bounded(w, &mut pending, &mut tokens).await else {
        return fail(
            w,
            504,
            &format!("the decode half of room {r} got no answer in time"),
        );
    };
    decode_answer(w, &half, reply, tokens)
}

/// The HTTP answer of a decode half that ended with `reply` and `tokens`.
pub(super) fn decode_answer<K>(
    w: &Worker<K>,
    half: &Half,
    reply: Reply,
    tokens: Vec<u32>,
) -> Response<Out> {
    let r = half.room;
    count(w, reply.status);
    if reply.status != 200 {
        let why = reply.reason.clone();
        return error(
            reply.status,
            &why.unwrap_or_else(|| engine_error(reply.status, "decode")),
        );
    }
    let text = w
        .vocab
        .lock()
        .map(|v| v.decode(&tokens))
        .unwrap_or_default();
    let n = tokens.len();
    if let Some(c) = &half.openai {
        let id = openai::reply_id(c, r);
        return json_reply(200, &openai::answer(c, &id, &text, n));
    }
    json_reply(
        200,
        &json!({"text": text, "output_ids": tokens, "meta_info": meta(r, &half.job, n, true)}),
    )
}

fn meta(r: u64, job: &Job, n: usize, done: bool) -> Value {
    let finish = if !done {
        Value::Null
    } else if n >= job.max_new_tokens as usize {
        json!({"type": "length", "length": n})
    } else {
        json!({"type": "stop", "matched": null})
    };
    json!({"id": format!("room{r}"), "prompt_tokens": job.ids.len(),
           "completion_tokens": n, "finish_reason": finish})
}

/// Decode's stream (SGLang's events, or OpenAI's chunks): an event per token as decode
/// makes it, then the end; the room is released when the body ends.
pub(super) fn stream<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    pending: Pending,
    half: Half,
) -> Response<Out> {
    let w2 = w.clone();
    let r = half.room;
    let mut s: Box<dyn Streamer> = match &half.openai {
        Some(c) => Box::new(openai::streamer(c, openai::reply_id(c, r))),
        None => {
            let job = half.job.clone();
            Box::new(SglangStream::new(move |n, done| meta(r, &job, n, done)))
        }
    };
    let release = ReleaseOnDrop(w.clone(), r);
    let mut sent = 0usize;
    let render = move |ev: ReplyEv| -> Bytes {
        let _keep = &release;
        let mut out = Vec::new();
        match ev {
            ReplyEv::Token { index, token } if index as usize == sent => {
                let word = w2.vocab.lock().map(|v| v.word(token)).unwrap_or_default();
                s.token(&word, token, &mut out);
                sent += 1;
            }
            ReplyEv::Token { .. } | ReplyEv::Params { .. } => {}
            ReplyEv::Done(reply) => {
                count(&w2, reply.status);
                if reply.status == 200 {
                    s.finish(&reply, &mut out);
                } else {
                    let why = reply.reason.clone();
                    let why = why.unwrap_or_else(|| engine_error(reply.status, "decode"));
                    s.failed(reply.status, &why, &mut out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
        Bytes::from(out)
    };
    let closing = event(&error_body(503, "the node is shutting down"));
    let mut resp = sse(EventBody::new(pending, render, closing));
    resp.headers_mut().insert(
        "x-kvsim-streaming",
        hyper::header::HeaderValue::from_static("1"),
    );
    resp
}

/// Releases a room when the streaming body that holds it is dropped.
struct ReleaseOnDrop<K>(Arc<Worker<K>>, u64);

impl<K> Drop for ReleaseOnDrop<K> {
    fn drop(&mut self) {
        release_room(&self.0, self.1);
    }
}

/// Decode: prefill's word that its half of a room ended (`POST /kvsim/prefill_done
/// {"room": R, "status": S, "why": W, "prefill": P}`; `why`, the engine's typed reason,
/// where it gave one; the human `reason` beside it is not read), handed to the front
/// as prefill node `P`'s `PrefillDone`.
pub(super) fn prefill_done<K>(w: &Worker<K>, b: &[u8]) -> Response<Out> {
    #[derive(serde::Deserialize)]
    struct Done {
        room: Option<body::Int>,
        status: Option<body::Int>,
        why: Option<Value>,
        prefill: Option<body::Int>,
    }
    match body::parse::<Done>(b) {
        Ok(Done {
            room: Some(body::Int(r)),
            status,
            why,
            prefill: Some(body::Int(p)),
        }) if r >= 0 => {
            let Ok(from) = u16::try_from(p).map(NodeId) else {
                return error(400, &format!("prefill: {p} is no node id"));
            };
            let st = status.map_or(500, |s| u16::try_from(s.0).unwrap_or(500));
            let msg = Msg::PrefillDone {
                room: room_key(r as u64),
                status: kvsim_engine::msg::Status(st),
                why: why.and_then(|v| serde_json::from_value(v).ok()),
            };
            let _ = w.p.node.send(NodeEvent::FrontPeer { from, msg });
            json_reply(200, &json!({"ok": true}))
        }
        Ok(_) => error(
            400,
            "room and prefill: a room (0..2^63) and the prefill node are required",
        ),
        Err(m) => error(400, &m),
    }
}
