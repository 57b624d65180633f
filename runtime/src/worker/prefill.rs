//! A prefill worker: its half, run once decode has registered the room at its
//! bootstrap endpoint, and the word it owes decode when its half ends (or never
//! starts). Not decode's side ([`crate::worker::decode`]).

use crate::http::body;
use crate::http::conn::read_body;
use crate::http::response::{error, full, json_reply, Out};
use crate::node::reply::Reply;
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use crate::worker::check::Half;
use crate::worker::start::{bounded, engine_error, start};
use crate::worker::state::{bootstrap_wait, count, fail, room_key, Told, Worker, MAX_REGISTERED};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use kvsim_engine::ids::{NodeId, RequestId};
use kvsim_engine::msg::{Msg, Why};
use serde_json::json;
use std::time::{Duration, Instant};

/// Prefill: tell each finished half's decode node (`POST /kvsim/prefill_done`), in
/// order, one at a time; a decode node that cannot be reached is told nothing (its
/// room then stays open in the audit, which is what is known).
pub(super) fn tell_decode(rx: crate::sync::mpsc::Receiver<Told>) {
    let a = crate::http_client::agent(Duration::from_secs(2));
    for (room, status, why, url) in rx {
        let reason = why.map(|w| w.to_string());
        let body = json!({ "room": room, "status": status, "reason": reason, "why": why });
        let body = body.to_string();
        let _ = crate::http_client::fetch_with(
            &a,
            &url,
            "POST",
            "/kvsim/prefill_done",
            Some(body.as_bytes()),
        );
    }
}

/// Prefill: room `r` ends here without its half running, with `status`: its decode
/// node (registered now or later) is told.
fn prefill_gone<K>(w: &Worker<K>, r: u64, status: u16) {
    let reg = w.registered.lock().ok().and_then(|mut m| m.remove(&r));
    match reg {
        Some((_, url, _)) => tell(w, r, status, url),
        None => {
            if let Ok(mut g) = w.gone.lock() {
                let wait = bootstrap_wait(w);
                g.retain(|_, (_, at)| at.elapsed() < wait * 4);
                if g.len() < MAX_REGISTERED {
                    g.insert(r, (status, Instant::now()));
                }
            }
        }
    }
}

fn tell<K>(w: &Worker<K>, r: u64, status: u16, url: String) {
    if let Ok(t) = w.done_tx.lock() {
        let _ = t.send((r, status, None, url));
    }
}

/// Prefill: registrations no `/generate` took within the bootstrap wait (the router's
/// request to prefill never came, or went away unread) are dropped, and their decode
/// nodes told, so the abandoned decode halves' rooms end.
pub(super) fn prune_registrations<K>(w: &Worker<K>) {
    let wait = bootstrap_wait(w);
    let stale: Vec<(u64, String)> = match w.registered.lock() {
        Ok(mut m) => {
            let old: Vec<u64> = m
                .iter()
                .filter(|(_, (_, _, at))| at.elapsed() >= wait)
                .map(|(r, _)| *r)
                .collect();
            old.into_iter()
                .filter_map(|r| m.remove(&r).map(|(_, url, _)| (r, url)))
                .collect()
        }
        Err(_) => Vec::new(),
    };
    for (r, url) in stale {
        tell(w, r, 504, url);
    }
}

/// Prefill: tells decode when the `/generate` ends (or is dropped) before the half
/// started.
struct NotStarted<'a, K> {
    w: &'a Worker<K>,
    r: u64,
    status: Option<u16>,
}

impl<K> Drop for NotStarted<'_, K> {
    fn drop(&mut self) {
        if let Some(st) = self.status {
            prefill_gone(self.w, self.r, st);
        }
    }
}

/// Prefill: wait for decode's registration, run the half, answer when it is done.
pub(super) async fn prefill<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
    let r = half.room;
    // Until the half starts, its end (an answer, or the router gone) is told to decode.
    let mut not_started = NotStarted {
        w,
        r,
        status: Some(499),
    };
    let failing = w
        .fail_first
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        not_started.status = Some(503);
        return fail(
            w,
            503,
            &format!("room {r}: this prefill fails its first halves (--worker-fail-first)"),
        );
    }
    let (decode, decode_url) = match registered_decode(w, r).await {
        Ok(d) => d,
        Err(msg) => {
            not_started.status = Some(504);
            return fail(w, 504, &msg);
        }
    };
    not_started.status = None;
    let key = room_key(r);
    let msg = Msg::PrefillStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        decode,
    };
    let tell = w.done_tx.lock().ok().map(|t| t.clone());
    let on_done = move |status: u16, why: Option<Why>| {
        if let Some(t) = tell {
            let _ = t.send((r, status, why, decode_url));
        }
    };
    let mut pending = match start(w, key, msg, &half.job, Some(Box::new(on_done)), None) {
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
    prefill_answer(w, &half, reply)
}

/// The decode node that registered room `r` at this prefill's bootstrap (its id and
/// URL), waited for up to the bootstrap bound; the error says it never came.
async fn registered_decode<K>(w: &Worker<K>, r: u64) -> Result<(NodeId, String), String> {
    let wait = bootstrap_wait(w);
    let end = tokio::time::Instant::now() + wait;
    loop {
        let notified = w.registered_changed.notified();
        let got = w.registered.lock().ok().and_then(|mut m| m.remove(&r));
        if let Some((d, url, _)) = got {
            return Ok((d, url));
        }
        if tokio::time::timeout_at(end, notified).await.is_err() {
            return Err(format!(
                "no decode node registered bootstrap_room {r} within {} ms",
                wait.as_millis()
            ));
        }
    }
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
/// N}` registers decode node `N` as room `R`'s decode half.
pub(super) async fn bootstrap_route<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    req: Request<Incoming>,
) -> Response<Out> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/health") => full(200, "text/plain", ""),
        (Method::GET, "/kvsim/vllm_handshake") => crate::worker::vllm::handshake_reply(w).await,
        (Method::POST, "/kvsim/bootstrap") => {
            match read_body(req, w.p.limits.read_deadline).await {
                Ok(b) => register(w, &b),
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

fn register<K>(w: &Worker<K>, b: &[u8]) -> Response<Out> {
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
            &format!("decode: {d} is not a decode node of this deployment"),
        );
    }
    let Ok(mut m) = w.registered.lock() else {
        return error(500, "bootstrap table poisoned");
    };
    // (Registrations no prefill half takes within the wait are dropped by the prune.)
    if m.len() >= MAX_REGISTERED {
        return error(503, "too many rooms registered and not taken");
    }
    let url = reg.notify.map(|u| u.0).unwrap_or_default();
    let gone = w
        .gone
        .lock()
        .ok()
        .and_then(|mut g| g.remove(&(room as u64)));
    if let Some((status, _)) = gone {
        // Prefill's half of this room already ended here without running.
        drop(m);
        tell(w, room as u64, status, url);
        return json_reply(
            200,
            &json!({"ok": true, "prefill_status": status, "epoch": w.p.epoch}),
        );
    }
    m.insert(room as u64, (decode, url, Instant::now()));
    drop(m);
    w.registered_changed.notify_waiters();
    json_reply(200, &json!({"ok": true, "epoch": w.p.epoch}))
}
