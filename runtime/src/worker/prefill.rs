//! A prefill worker: its half, handed to the engine front, which waits for decode's
//! registration at the bootstrap endpoint before the node runs it, and the bootstrap
//! endpoint itself (a registration goes to the front, whose answer goes back). The
//! pairing's decisions are the front's (`kvsim_engine::worker`); what it sends decode
//! is carried by [`crate::worker::carry`]. Not decode's side ([`crate::worker::decode`]).

use crate::http::body;
use crate::http::conn::read_body;
use crate::http::response::{error, full, json_reply, Out};
use crate::node::event::NodeEvent;
use crate::node::reply::Reply;
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use crate::worker::check::Half;
use crate::worker::start::{bounded, engine_error, start};
use crate::worker::state::{count, fail, room_key, Worker};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use kvsim_engine::ids::{NodeId, RequestId};
use kvsim_engine::msg::Msg;
use kvsim_engine::worker::MAX_REGISTERED;
use serde_json::json;
use std::time::Duration;

/// How long a registration waits for the front's answer (it answers at once; this
/// bounds a loop that stopped).
const REGISTRATION_ANSWER: Duration = Duration::from_secs(5);

/// Prefill: hand the half to the front (which runs it once decode registered the
/// room), answer when it is done.
pub(super) async fn prefill<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
    let r = half.room;
    let refused = w
        .fail_first
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    let key = room_key(r);
    // The router names no decode node: the front takes the registrant as the decode.
    let msg = Msg::PrefillStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        decode: NodeId(0),
    };
    let mut pending = match start(w, key, msg, &half.job, (refused, None)) {
        Ok(p) => p,
        Err(m) => return fail(w, 503, &m),
    };
    let Some(reply) = bounded(w, &mut pending, &mut Vec::new()).await else {
        return fail(
            w,
            504,
            &format!("the prefill half of room {r} got no answer in time"),
        );
    };
    if refused {
        let why = format!("room {r}: this prefill fails its first halves (--worker-fail-first)");
        return fail(w, reply.status, &why);
    }
    prefill_answer(w, &half, reply)
}

/// The HTTP answer of a prefill half that ended with `reply`.
fn prefill_answer<K>(w: &Worker<K>, half: &Half, reply: Reply) -> Response<Out> {
    let r = half.room;
    count(w, reply.status);
    if reply.status != 200 {
        let why = reply.reason.clone();
        return error(
            reply.status,
            &why.unwrap_or_else(|| engine_error(reply.status, "prefill")),
        );
    }
    json_reply(
        200,
        &json!({"text": "", "output_ids": [], "meta_info": {"id": format!("room{r}"),
                "prompt_tokens": half.job.ids.len(), "completion_tokens": 0,
                "finish_reason": {"type": "length", "length": 0}}}),
    )
}

/// A prefill node's bootstrap endpoint: `POST /kvsim/bootstrap {"room": R, "decode":
/// N, "notify": URL}` registers decode node `N` as room `R`'s decode half.
pub(super) async fn bootstrap_route<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    req: Request<Incoming>,
) -> Response<Out> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/health") => full(200, "text/plain", ""),
        (Method::GET, "/kvsim/vllm_handshake") => crate::worker::vllm::handshake_reply(w).await,
        (Method::POST, "/kvsim/bootstrap") => {
            match read_body(req, w.p.limits.read_deadline).await {
                Ok(b) => register(w, &b).await,
                Err(r) => r,
            }
        }
        (_, p) => error(404, &format!("no bootstrap endpoint {p}")),
    }
}

#[derive(serde::Deserialize)]
struct Registration {
    room: Option<body::Int>,
    decode: Option<body::Int>,
    /// The decode worker's URL (told when prefill's half is done).
    notify: Option<body::Str>,
}

/// A registration, checked, handed to the front as decode's `Register`; the answer
/// is the front's: `{"ok": true, "epoch": E}` (taken by incarnation `E`), or
/// `{"ok": false, "prefill_status": S, "why": W}` (prefill's half already ended, or
/// the front refused it).
async fn register<K>(w: &Worker<K>, b: &[u8]) -> Response<Out> {
    let reg = match body::parse::<Registration>(b) {
        Ok(r) => r,
        Err(m) => return error(400, &m),
    };
    let (Some(body::Int(room)), Some(body::Int(d))) = (reg.room, reg.decode) else {
        return error(400, "room and decode are required");
    };
    let decode = NodeId(u16::try_from(d).unwrap_or(u16::MAX));
    if room < 0 || !w.p.decodes.contains(&decode) {
        return error(
            400,
            &format!("room {room}, decode {d}: a room (0..2^63) and a decode node of this deployment are required"),
        );
    }
    let r = room as u64;
    if let (Some(url), Ok(mut urls)) = (reg.notify, w.decode_urls.lock()) {
        urls.insert(decode, url.0);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    match w.pending.lock() {
        Ok(mut m) if m.len() < MAX_REGISTERED => {
            m.insert(r, tx);
        }
        Ok(_) => return error(503, "too many registrations waiting for an answer"),
        Err(_) => return error(500, "bootstrap table poisoned"),
    }
    let msg = Msg::Register { room: room_key(r) };
    if w.p
        .node
        .send(NodeEvent::FrontPeer { from: decode, msg })
        .is_err()
    {
        return error(503, "the node is shutting down");
    }
    match tokio::time::timeout(REGISTRATION_ANSWER, rx).await {
        Ok(Ok(v)) => json_reply(200, &v),
        _ => {
            if let Ok(mut m) = w.pending.lock() {
                m.remove(&r);
            }
            error(
                503,
                &format!("room {r}: the prefill front did not answer the registration"),
            )
        }
    }
}
