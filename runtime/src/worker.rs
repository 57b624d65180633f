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

use crate::http::body::{self, GenerateBody};
use crate::http::{
    self, check_generate, error, full, json_reply, model_info, read_body, CancelGuard, EventBody,
    FrontCounters, FrontInfo, FrontLimits, Handler, Job, NodesFn, Out, Pending, Streamer,
};
use crate::node::{NodeEvent, ReplyEv, ReplySink};
use crate::tokenizer::Vocab;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::{Generation, NodeId, RequestId, RoomId, RoomKey};
use kvsim_engine::msg::Msg;
use kvsim_engine::node::Role;
use kvsim_engine::retired::{GenTable, RETIRED_MIN_HALF};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// Most rooms registered at a prefill node's bootstrap and not yet taken.
const MAX_REGISTERED: usize = 1 << 16;

/// What a worker front is given.
pub struct WorkerParts<K> {
    pub id: NodeId,
    /// This worker's own URL (a decode node gives it to prefill's bootstrap, where
    /// prefill says when its half of a room is done).
    pub url: String,
    pub role: Role,
    pub node: Sender<NodeEvent<K>>,
    pub nodes: NodesFn,
    pub info: FrontInfo,
    pub cfg: EngineConfig,
    /// The deployment's decode nodes (who may register at a bootstrap).
    pub decodes: Vec<NodeId>,
    /// Each prefill node's bootstrap address.
    pub prefills: BTreeMap<SocketAddr, NodeId>,
    pub limits: FrontLimits,
    /// Answer the first this many `/generate` requests 503 (prefill; a test's failing
    /// half).
    pub fail_first: u64,
    /// The incarnation this process started the node as (`--epoch`): a prefill node's
    /// bootstrap answers each registration with it, so that decode learns when the
    /// prefill process it registered a room at was killed and restarted.
    pub epoch: u32,
}

/// The rooms this node was given.
struct Rooms {
    live: BTreeSet<u64>,
    /// The newest generation given per engine room number, bounded by the engine's own
    /// rule for its retired rooms (the same table, the same bound: a number this front
    /// lets go of, the node's engine lets go of after as many rooms).
    newest: GenTable<()>,
}

impl Rooms {
    fn new(cfg: &EngineConfig) -> Self {
        Rooms {
            live: BTreeSet::new(),
            newest: GenTable::new((cfg.max_rooms as usize).max(RETIRED_MIN_HALF)),
        }
    }
}

/// The engine's room key of a router room.
pub fn room_key(r: u64) -> RoomKey {
    RoomKey::new(1 + (r % u64::from(u32::MAX)) as u32, r)
}

struct Worker<K> {
    p: WorkerParts<K>,
    vocab: Mutex<Vocab>,
    rooms: Mutex<Rooms>,
    /// Prefill: rooms registered by decode nodes (the node, its URL), with when.
    registered: Mutex<BTreeMap<u64, (NodeId, String, Instant)>>,
    /// Prefill: (room, decode's URL) of each finished half, to tell decode.
    done_tx: Mutex<std::sync::mpsc::Sender<Told>>,
    /// Prefill: rooms whose half ended here without running (no registration in time,
    /// refused, the router gone), with the status: a decode node that registers one
    /// later is told at once, so its half ends too.
    gone: Mutex<BTreeMap<u64, (u16, Instant)>>,
    /// Prefill: answer this many more `/generate` requests 503 without running them
    /// (`--worker-fail-first`: a half that fails, for the router's retries).
    fail_first: std::sync::atomic::AtomicU64,
    registered_changed: Notify,
    counters: FrontCounters,
    bootstrap_port: Option<u16>,
}

/// Serve the worker API on `listener` (and a prefill node's bootstrap on `bootstrap`).
pub fn spawn_worker<K: Send + 'static>(
    listener: TcpListener,
    bootstrap: Option<TcpListener>,
    p: WorkerParts<K>,
) -> std::io::Result<()> {
    let bootstrap_port = match &bootstrap {
        Some(b) => Some(b.local_addr()?.port()),
        None => None,
    };
    let max = p.limits.max_connections;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Told>();
    std::thread::Builder::new()
        .name(format!("{}-done", p.id))
        .spawn(move || tell_decode(done_rx))?;
    let rooms = Mutex::new(Rooms::new(&p.cfg));
    let w = Arc::new(Worker {
        done_tx: Mutex::new(done_tx),
        gone: Mutex::new(BTreeMap::new()),
        fail_first: std::sync::atomic::AtomicU64::new(p.fail_first),
        p,
        vocab: Mutex::new(Vocab::new()),
        rooms,
        registered: Mutex::new(BTreeMap::new()),
        registered_changed: Notify::new(),
        counters: FrontCounters::default(),
        bootstrap_port,
    });
    if w.p.role == Role::Prefill {
        let w2 = w.clone();
        std::thread::Builder::new()
            .name(format!("{}-bootstrap-prune", w.p.id))
            .spawn(move || loop {
                std::thread::sleep(bootstrap_wait(&w2) / 4);
                prune_registrations(&w2);
            })?;
    }
    let name = format!("{}-worker", w.p.id);
    let w1 = w.clone();
    let handler: Handler = Arc::new(move |req| {
        let w = w1.clone();
        Box::pin(async move { route(&w, req).await })
    });
    http::spawn_server(listener, &name, max, handler)?;
    if let Some(b) = bootstrap {
        let handler: Handler = Arc::new(move |req| {
            let w = w.clone();
            Box::pin(async move { bootstrap_route(&w, req).await })
        });
        http::spawn_server(b, &format!("{name}-bootstrap"), max, handler)?;
    }
    Ok(())
}

/// What prefill tells decode: the room, its half's status and reason, decode's URL.
type Told = (u64, u16, Option<String>, String);

/// Prefill: tell each finished half's decode node (`POST /kvsim/prefill_done`), in
/// order, one at a time; a decode node that cannot be reached is told nothing (its
/// room then stays open in the audit, which is what is known).
fn tell_decode(rx: std::sync::mpsc::Receiver<Told>) {
    let a = crate::http_client::agent(Duration::from_secs(2));
    for (room, status, reason, url) in rx {
        let body = json!({ "room": room, "status": status, "reason": reason }).to_string();
        let _ = crate::http_client::fetch_with(
            &a,
            &url,
            "POST",
            "/kvsim/prefill_done",
            Some(body.as_bytes()),
        );
    }
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
        (&Method::GET, "/get_load") => {
            let live = w.rooms.lock().map(|r| r.live.len()).unwrap_or(0);
            json_reply(200, &json!({"load": live, "num_reqs": live}))
        }
        (&Method::GET, "/metrics") => {
            let w2 = w.clone();
            let nodes = tokio::task::spawn_blocking(move || (w2.p.nodes)())
                .await
                .unwrap_or_default();
            let text = http::metrics::render(w.p.info.page_size, &w.counters, &nodes);
            full(200, http::metrics::CONTENT_TYPE, text)
        }
        (&Method::POST, "/kvsim/prefill_done") => {
            match read_body(req, w.p.limits.read_deadline).await {
                Ok(b) => prefill_done(w, &b),
                Err(r) => r,
            }
        }
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

/// The checked `/generate` of a half.
struct Half {
    job: Job,
    /// The OpenAI API's request (`None`: SGLang's `/generate`).
    openai: Option<http::openai::Checked>,
    room: u64,
    /// `bootstrap_host:bootstrap_port`, as sent.
    bootstrap: String,
}

/// The router's pairing fields, in any body it sends (one each, or a list each for a
/// batch).
#[derive(serde::Deserialize)]
struct Bootstrap {
    bootstrap_host: Option<body::OneOrMany<body::Str>>,
    bootstrap_port: Option<body::OneOrMany<Option<body::Int>>>,
    bootstrap_room: Option<body::OneOrMany<body::Int>>,
}

impl Bootstrap {
    /// Element `i`'s room and `host:port`.
    fn of(&self, i: usize) -> Result<(u64, String), String> {
        let room = match self.bootstrap_room.as_ref().and_then(|r| r.get(i)) {
            Some(body::Int(r)) if r >= 0 => r as u64,
            Some(body::Int(r)) => {
                return Err(body::field_err(
                    "bootstrap_room",
                    format!("{r} is not a room (0..2^63)"),
                ))
            }
            None => {
                return Err(body::field_err(
                    "bootstrap_room",
                    format!(
                        "a disaggregated worker needs the router's bootstrap_room (element {i})"
                    ),
                ))
            }
        };
        let host = self
            .bootstrap_host
            .as_ref()
            .and_then(|h| h.get(i))
            .map(|h| h.0);
        let port = match self
            .bootstrap_port
            .as_ref()
            .and_then(|p| p.get(i))
            .flatten()
        {
            Some(body::Int(p)) => u16::try_from(p)
                .map_err(|_| body::field_err("bootstrap_port", format!("{p} is not a port")))?,
            None => 0,
        };
        Ok((room, format!("{}:{port}", host.unwrap_or_default())))
    }
}

/// The halves a body asks for: one, or one per element of SGLang's batch form (`text`
/// or `input_ids` a list, the pairing fields lists of the same length).
fn check_halves<K>(w: &Worker<K>, path: &str, body: &[u8]) -> Result<(Vec<Half>, bool), String> {
    let boot = body::parse::<Bootstrap>(body)?;
    let limit = w.p.info.max_new_tokens_limit;
    let tokenize = |_: &str, t: &str| -> Result<Vec<u32>, String> {
        Ok(w.vocab
            .lock()
            .map_err(|_| "tokenizer unavailable")?
            .encode(t))
    };
    let max_new = |name: &str, v: Option<body::Int>| max_new_tokens(limit, name, v);
    let half = |job: Job, openai, i: usize| -> Result<Half, String> {
        let (room, bootstrap) = boot.of(i)?;
        Ok(Half {
            job,
            openai,
            room,
            bootstrap,
        })
    };
    if path != "/generate" {
        let checks = http::openai::Checks {
            tokenize: &tokenize,
            max_new: &max_new,
            default_max: limit.min(128),
            model: &w.p.info.model_path,
        };
        let c = http::openai::check(path, body, &checks)?;
        return Ok((vec![half(c.job.clone(), Some(c), 0)?], false));
    }
    let g = body::parse::<GenerateBody>(body)?;
    let Some(elements) = batch_elements(&g) else {
        let job = check_generate(&tokenize, &max_new, limit.min(128), g)?;
        return Ok((vec![half(job, None, 0)?], false));
    };
    if g.stream.is_some_and(|f| f.0) {
        return Err(body::field_err("stream", "a batch is not streamed here"));
    }
    let halves = elements
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            half(
                check_generate(&tokenize, &max_new, limit.min(128), e)?,
                None,
                i,
            )
        })
        .collect::<Result<Vec<Half>, String>>()?;
    distinct_rooms(&halves)?;
    Ok((halves, true))
}

/// A request's `max_new_tokens` (field `name`), within the server's `limit`.
fn max_new_tokens(limit: u32, name: &str, v: Option<body::Int>) -> Result<Option<u32>, String> {
    match v {
        None => Ok(None),
        Some(body::Int(n)) if (1..=i64::from(limit)).contains(&n) => Ok(Some(n as u32)),
        Some(body::Int(n)) => Err(body::field_err(
            name,
            format!("{n} is outside 1..={limit} (the server's max_new_tokens limit)"),
        )),
    }
}

/// The elements of SGLang's batch form (`text` or `input_ids` a list), each a body of
/// its own; `None` for a single request.
fn batch_elements(g: &GenerateBody) -> Option<Vec<GenerateBody>> {
    match (&g.text, &g.input_ids) {
        (Some(body::Text::Batch(texts)), None) => Some(
            texts
                .iter()
                .map(|t| GenerateBody {
                    text: Some(body::Text::One(t.clone())),
                    ..g.clone()
                })
                .collect(),
        ),
        (None, Some(body::Ids::Batch(lists))) => Some(
            lists
                .iter()
                .map(|l| GenerateBody {
                    input_ids: Some(body::Ids::One(l.clone())),
                    ..g.clone()
                })
                .collect(),
        ),
        _ => None,
    }
}

/// A batch names each room once.
fn distinct_rooms(halves: &[Half]) -> Result<(), String> {
    let mut rooms: Vec<u64> = halves.iter().map(|h| h.room).collect();
    rooms.sort_unstable();
    if rooms.windows(2).any(|p| p[0] == p[1]) {
        return Err(body::field_err(
            "bootstrap_room",
            "a batch names a room twice",
        ));
    }
    Ok(())
}

/// Take room `r` for a half here, or say why not (status, message).
fn take_room<K>(w: &Worker<K>, r: u64) -> Result<(), (u16, String)> {
    let key = room_key(r);
    let mut rooms = w
        .rooms
        .lock()
        .map_err(|_| (500, "room table poisoned".into()))?;
    if rooms.live.contains(&r) {
        return Err((400, format!("bootstrap_room {r} is already in use here")));
    }
    let rooms = &mut *rooms;
    if rooms.newest.get(key.room).is_some_and(|(g, _)| g.0 >= r) {
        return Err((
            503,
            format!(
                "bootstrap_room {r}: room number {} was used here with a later generation; \
                 retry with a new room",
                key.room.0
            ),
        ));
    }
    rooms.live.insert(r);
    let live = &rooms.live;
    let held = |n: RoomId| live.iter().any(|&l| room_key(l).room == n);
    *rooms.newest.entry(key.room, || (Generation(r), ()), &held) = (Generation(r), ());
    Ok(())
}

fn release_room<K>(w: &Worker<K>, r: u64) {
    if let Ok(mut rooms) = w.rooms.lock() {
        rooms.live.remove(&r);
    }
}

fn count<K>(w: &Worker<K>, status: u16) {
    if let Ok(mut m) = w.counters.by_status.lock() {
        *m.entry(status).or_default() += 1;
    }
}

fn fail<K>(w: &Worker<K>, status: u16, msg: &str) -> Response<Out> {
    count(w, status);
    error(status, msg)
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
                _ => http::openai::error(400, &msg),
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

/// Prefill: wait for decode's registration, run the half, answer when it is done.
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

fn bootstrap_wait<K>(w: &Worker<K>) -> Duration {
    Duration::from_nanos(w.p.cfg.timeouts.bootstrap_ns.max(1_000_000) * 10)
}

/// Prefill: registrations no `/generate` took within the bootstrap wait (the router's
/// request to prefill never came, or went away unread) are dropped, and their decode
/// nodes told, so the abandoned decode halves' rooms end.
fn prune_registrations<K>(w: &Worker<K>) {
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

async fn prefill<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
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
    let on_done = move |status: u16, reason: Option<String>| {
        if let Some(t) = tell {
            let _ = t.send((r, status, reason, decode_url));
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
fn prefill_answer<K>(w: &Worker<K>, half: &Half, reply: crate::node::Reply) -> Response<Out> {
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

fn engine_error(status: u16, side: &str) -> String {
    match status {
        400 => format!("the {side} half refused the request (the prompt does not fit)"),
        503 => format!("the {side} half has no capacity now (queue full or intake closed)"),
        st => format!("the {side} half failed the request (status {st})"),
    }
}

/// Called with a half's terminal status and reason.
type OnDone = Box<dyn FnOnce(u16, Option<String>) + Send>;

/// Start a half at the node; the guard aborts it when dropped armed.
fn start<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    key: RoomKey,
    msg: Msg<K>,
    job: &Job,
    mut on_done: Option<OnDone>,
    prefill_epoch: Option<u32>,
) -> Result<Pending, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_len = job.ids.len();
    let sink = ReplySink::new(move |ev| {
        if let ReplyEv::Done(r) = &ev {
            if let Some(f) = on_done.take() {
                f(r.status, r.reason.clone());
            }
        }
        tx.send(ev).is_ok()
    });
    let sent = w.p.node.send(NodeEvent::StartHalf {
        room: key,
        msg,
        max_new_tokens: job.max_new_tokens,
        reply: sink,
        prefill_epoch,
    });
    if sent.is_err() {
        return Err("the node is shutting down".into());
    }
    let (node, w2) = (w.p.node.clone(), w.clone());
    Ok(Pending {
        req: key.gen.0,
        prompt_len,
        rx,
        guard: CancelGuard::new(move || {
            w2.counters.disconnects.fetch_add(1, Ordering::Relaxed);
            let _ = node.send(NodeEvent::AbortHalf { room: key });
        }),
    })
}

/// The bound on a half's answer: the engine's request bound twice over.
fn answer_bound<K>(w: &Worker<K>) -> Duration {
    Duration::from_nanos(w.p.cfg.timeouts.request_ns.max(1_000_000) * 2)
}

/// Wait for the half's terminal answer within [`answer_bound`]; past it the half is
/// aborted (its guard) and `None` returned.
async fn bounded<K>(
    w: &Worker<K>,
    pending: &mut Pending,
    tokens: &mut Vec<u32>,
) -> Option<crate::node::Reply> {
    tokio::time::timeout(answer_bound(w), pending.done_with(tokens))
        .await
        .unwrap_or_default()
}

/// The prefill node a `bootstrap_host:bootstrap_port` names.
fn prefill_of<K>(w: &Worker<K>, bootstrap: &str) -> Option<NodeId> {
    let addrs = bootstrap.to_socket_addrs().ok()?;
    addrs
        .into_iter()
        .find_map(|a| w.p.prefills.get(&a).copied())
}

/// Decode: find prefill, register the room at its bootstrap, run the half.
async fn decode<K: Send + 'static>(w: &Arc<Worker<K>>, half: Half) -> Response<Out> {
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
    let prefill_epoch = match register_at_prefill(w, r, &half.bootstrap).await {
        Ok(e) => e,
        Err((status, msg)) => return fail(w, status, &msg),
    };
    let key = room_key(r);
    let msg = Msg::DecodeStart {
        room: key,
        req: RequestId(r),
        prompt: half.job.ids.clone(),
        max_new_tokens: half.job.max_new_tokens,
        prefill,
    };
    let mut pending = match start(w, key, msg, &half.job, None, prefill_epoch) {
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

/// Register room `r` at the prefill node's bootstrap (`host:port` as the router sent
/// it), naming this decode node and its URL: the prefill node's incarnation, as its
/// bootstrap says (`None` when it does not); the error is the HTTP status and why.
async fn register_at_prefill<K>(
    w: &Worker<K>,
    r: u64,
    bootstrap: &str,
) -> Result<Option<u32>, (u16, String)> {
    let url = format!("http://{bootstrap}");
    let (me, my_url) = (w.p.id.0, w.p.url.clone());
    let registered = tokio::task::spawn_blocking(move || {
        let body = json!({"room": r, "decode": me, "notify": my_url}).to_string();
        let a = crate::http_client::agent(Duration::from_secs(5));
        crate::http_client::fetch_with(&a, &url, "POST", "/kvsim/bootstrap", Some(body.as_bytes()))
    })
    .await;
    match registered {
        Ok(Ok(rep)) if rep.status == 200 => Ok(serde_json::from_slice::<Value>(&rep.body)
            .ok()
            .and_then(|v| v["epoch"].as_u64())
            .and_then(|e| u32::try_from(e).ok())),
        Ok(Ok(rep)) => Err((
            502,
            format!("prefill's bootstrap refused room {r}: {}", rep.text()),
        )),
        Ok(Err(e)) => Err((502, format!("prefill's bootstrap: {e}"))),
        Err(e) => Err((500, format!("bootstrap registration: {e}"))),
    }
}

/// The HTTP answer of a decode half that ended with `reply` and `tokens`.
fn decode_answer<K>(
    w: &Worker<K>,
    half: &Half,
    reply: crate::node::Reply,
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
        let id = http::openai::reply_id(c, r);
        return json_reply(200, &http::openai::answer(c, &id, &text, n));
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
fn stream<K: Send + 'static>(w: &Arc<Worker<K>>, pending: Pending, half: Half) -> Response<Out> {
    let w2 = w.clone();
    let r = half.room;
    let mut s: Box<dyn Streamer> = match &half.openai {
        Some(c) => Box::new(http::openai::streamer(c, http::openai::reply_id(c, r))),
        None => {
            let job = half.job.clone();
            Box::new(http::SglangStream::new(move |n, done| {
                meta(r, &job, n, done)
            }))
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
            ReplyEv::Token { .. } => {}
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
    let closing = http::event(&http::error_body(503, "the node is shutting down"));
    let mut resp = http::sse(EventBody::new(pending, render, closing));
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

/// A prefill node's bootstrap endpoint: `POST /kvsim/bootstrap {"room": R, "decode":
/// N}` registers decode node `N` as room `R`'s decode half.
async fn bootstrap_route<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    req: Request<Incoming>,
) -> Response<Out> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/health") => full(200, "text/plain", ""),
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

/// Decode: prefill's half of a room is done (`POST /kvsim/prefill_done {"room": R}`).
fn prefill_done<K>(w: &Worker<K>, b: &[u8]) -> Response<Out> {
    #[derive(serde::Deserialize)]
    struct Done {
        room: Option<body::Int>,
        status: Option<body::Int>,
        reason: Option<body::Str>,
    }
    match body::parse::<Done>(b) {
        Ok(Done {
            room: Some(body::Int(r)),
            status,
            reason,
        }) if r >= 0 => {
            let st = status.map_or(500, |s| u16::try_from(s.0).unwrap_or(500));
            let _ = w.p.node.send(NodeEvent::PeerHalfDone {
                room: room_key(r as u64),
                status: kvsim_engine::msg::Status(st),
                reason: reason.map(|r| r.0.chars().take(1000).collect()),
            });
            json_reply(200, &json!({"ok": true}))
        }
        Ok(_) => error(400, "room: a room (0..2^63) is required"),
        Err(m) => error(400, &m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Worker<()> {
        let (node, _rx) = std::sync::mpsc::channel();
        let info = FrontInfo {
            model_path: "m".into(),
            context_len: 1024,
            max_new_tokens_limit: 16,
            min_pool_tokens: 512,
            page_size: 16,
            server_info: json!({}),
        };
        Worker {
            p: WorkerParts {
                id: NodeId(2),
                url: String::new(),
                role: Role::Decode,
                node,
                nodes: Arc::new(Vec::new),
                info,
                cfg: EngineConfig::default(),
                decodes: vec![NodeId(2)],
                prefills: BTreeMap::new(),
                limits: FrontLimits::default(),
                fail_first: 0,
                epoch: 0,
            },
            vocab: Mutex::new(Vocab::new()),
            rooms: Mutex::new(Rooms::new(&EngineConfig::default())),
            registered: Mutex::new(BTreeMap::new()),
            registered_changed: Notify::new(),
            done_tx: Mutex::new(std::sync::mpsc::channel().0),
            gone: Mutex::new(BTreeMap::new()),
            fail_first: std::sync::atomic::AtomicU64::new(0),
            counters: FrontCounters::default(),
            bootstrap_port: None,
        }
    }

    /// Rooms from the router are not trusted: a live room is refused (400), a room
    /// number this node used with a later generation is refused for a retry (503),
    /// and distinct rooms give distinct keys.
    #[test]
    fn reused_and_stale_rooms_are_refused() {
        let w = worker();
        let big = u64::from(u32::MAX) + 5; // the same room number as 5, a later generation
        assert_eq!(room_key(5).room, room_key(big).room);
        assert_ne!(room_key(5), room_key(big));
        assert!(take_room(&w, big).is_ok());
        assert_eq!(take_room(&w, big).map_err(|e| e.0), Err(400));
        release_room(&w, big);
        assert_eq!(take_room(&w, 5).map_err(|e| e.0), Err(503));
        assert!(take_room(&w, 6).is_ok());
        assert_eq!(room_key(0).room.0, 1, "room number 0 is never used");
    }

    /// The front's table of room numbers is bounded as the engine's retired rooms are:
    /// more distinct rooms than the bound leave at most the bound, a recent number is
    /// still refused as stale, and a live room is never let go.
    #[test]
    fn the_room_table_stays_within_its_bound() {
        let w = worker();
        let live = u64::from(u32::MAX) + 9; // room number 9, kept live throughout
        assert!(take_room(&w, live).is_ok());
        let n = 3 * RETIRED_MIN_HALF as u64;
        for r in 1000..1000 + n {
            assert!(take_room(&w, r).is_ok(), "{r}");
            release_room(&w, r);
            let rooms = w.rooms.lock().unwrap();
            assert!(rooms.newest.len() <= rooms.newest.bound() + 1, "{r}");
        }
        assert_eq!(take_room(&w, live).map_err(|e| e.0), Err(400), "still live");
        assert_eq!(take_room(&w, 9).map_err(|e| e.0), Err(503), "still known");
        let last = 1000 + n - 1;
        let stale = last + u64::from(u32::MAX); // a later generation of its number
        assert!(take_room(&w, stale).is_ok());
        release_room(&w, stale);
        assert_eq!(take_room(&w, last).map_err(|e| e.0), Err(503));
    }
}
