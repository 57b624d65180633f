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

pub mod body;
pub mod metrics;
pub mod openai;

use crate::client::StatusFn;
use crate::node::{NodeEvent, NodeStatus, Reply, ReplyEv, ReplySink};
use crate::tokenizer::Vocab;
use body::{field_err, GenerateBody, Ids, Text};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kvsim_engine::ids::{RequestId, TenantId};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Most bytes of a request line plus headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most bytes of a request body (the write-ups' 700,000-word prompt is 1.4 MB).
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// Most time to receive a request's head, and then its body.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);
/// Most prompt tokens the front accepts (beyond it 400, whatever the context).
pub const MAX_PROMPT_TOKENS: usize = 1 << 22;
/// Most connections served at once (beyond it 503).
pub const MAX_CONNECTIONS: usize = 1024;
/// Positions of a prompt the front remembers (the canary token keeps 16 bits).
const KEPT_POSITIONS: usize = 1 << 16;
/// Most remembered tokens over all requests (the oldest requests are forgotten).
const KEPT_TOKENS: usize = 1 << 23;
/// Connections over the limit being answered 503 at once (more are closed unanswered).
const MAX_REFUSING: usize = 64;

/// The front's limits (tests lower them; `kvsim serve` uses the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontLimits {
    pub max_connections: usize,
    pub read_deadline: Duration,
}

impl Default for FrontLimits {
    fn default() -> Self {
        FrontLimits {
            max_connections: MAX_CONNECTIONS,
            read_deadline: READ_DEADLINE,
        }
    }
}

/// What the front serves besides generation: fixed facts about the deployment.
#[derive(Clone, Debug)]
pub struct FrontInfo {
    pub model_path: String,
    pub context_len: u64,
    pub max_new_tokens_limit: u32,
    /// The smallest pool of any node, in tokens.
    pub min_pool_tokens: u64,
    /// Tokens per page.
    pub page_size: u64,
    /// `/get_server_info`'s body.
    pub server_info: Value,
}

/// Counters the front keeps itself.
#[derive(Default, Debug)]
pub struct FrontCounters {
    pub requests: AtomicU64,
    pub rejected_by_front: AtomicU64,
    pub disconnects: AtomicU64,
    pub by_status: Mutex<BTreeMap<u16, u64>>,
}

/// Recent requests' prompt ids, for reading reply tokens as text.
#[derive(Default)]
struct Prompts {
    by_req: BTreeMap<u64, Vec<u32>>,
    order: VecDeque<u64>,
    tokens: usize,
}

impl Prompts {
    fn keep(&mut self, req: u64, ids: &[u32]) {
        let ids: Vec<u32> = ids.iter().take(KEPT_POSITIONS).copied().collect();
        self.tokens += ids.len();
        self.by_req.insert(req, ids);
        self.order.push_back(req);
        while self.tokens > KEPT_TOKENS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.by_req.remove(&old) {
                self.tokens -= v.len();
            }
        }
    }
}

/// Every node's typed status (the router's process asks each loop).
pub type NodesFn = Arc<dyn Fn() -> Vec<NodeStatus> + Send + Sync>;

/// What the front's handlers share.
pub struct Shared<K> {
    router: Sender<NodeEvent<K>>,
    status: StatusFn,
    nodes: NodesFn,
    next: Arc<AtomicU64>,
    pub info: FrontInfo,
    vocab: Mutex<Vocab>,
    prompts: Mutex<Prompts>,
    pub counters: FrontCounters,
    limits: FrontLimits,
    /// Canary prompts (the front keeps each prompt's words to read replies with).
    canary: bool,
}

/// What the router process gives the front.
pub struct FrontParts<K> {
    pub router: Sender<NodeEvent<K>>,
    pub status: StatusFn,
    pub nodes: NodesFn,
    /// Request ids (shared with the line-JSON endpoint).
    pub next: Arc<AtomicU64>,
    pub info: FrontInfo,
    pub limits: FrontLimits,
    pub prompts: crate::server::PromptMode,
}

/// Serve HTTP on `listener` (until the process ends), submitting to the router's loop.
pub fn spawn_http_front<K: Send + 'static>(
    listener: TcpListener,
    parts: FrontParts<K>,
) -> std::io::Result<thread::JoinHandle<()>> {
    let shared = Arc::new(Shared {
        router: parts.router,
        status: parts.status,
        nodes: parts.nodes,
        next: parts.next,
        info: parts.info,
        vocab: Mutex::new(Vocab::new()),
        prompts: Mutex::new(Prompts::default()),
        counters: FrontCounters::default(),
        limits: parts.limits,
        canary: parts.prompts == crate::server::PromptMode::Canary,
    });
    let max = shared.limits.max_connections;
    let handler: Handler = Arc::new(move |req| {
        let sh = shared.clone();
        Box::pin(async move { route(&sh, req).await })
    });
    spawn_server(listener, "http-front", max, handler)
}

/// What answers a request.
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn std::future::Future<Output = Response<Out>> + Send>>
        + Send
        + Sync,
>;

/// Serve `handler` on `listener` from a tokio runtime of its own (two worker
/// threads), with the front's limits: at most `max_connections` open (503 beyond),
/// [`MAX_HEAD`] bytes of head, [`READ_DEADLINE`] to receive a head.
pub fn spawn_server(
    listener: TcpListener,
    name: &str,
    max_connections: usize,
    handler: Handler,
) -> std::io::Result<thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()?;
    thread::Builder::new()
        .name(format!("{name}-accept"))
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => accept_loop(l, max_connections, handler).await,
                    Err(e) => eprintln!("kvsim serve: http: {e}"),
                }
            })
        })
}

async fn accept_loop(l: tokio::net::TcpListener, max: usize, handler: Handler) {
    let open = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let stream = match l.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors, most likely: wait for connections to close.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    serve_conn(stream, h, false).await;
                    drop(permit);
                });
            }
            Err(_) => {
                // Over the limit: read the request and answer 503 (a reply written
                // before the request is read can be lost to the reset of closing on
                // unread bytes), with a small bound on how many are being refused.
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        serve_conn(stream, h, true).await;
                        drop(permit);
                    });
                }
            }
        }
    }
}

async fn serve_conn(stream: tokio::net::TcpStream, handler: Handler, refuse: bool) {
    let svc = hyper::service::service_fn(move |req| {
        let h = handler.clone();
        async move {
            if refuse {
                let mut r = error(503, "too many open connections");
                close(&mut r);
                return Ok::<_, Infallible>(r);
            }
            Ok(h(req).await)
        }
    });
    let deadline = if refuse {
        Duration::from_secs(1)
    } else {
        READ_DEADLINE
    };
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(deadline)
        .max_buf_size(MAX_HEAD)
        .keep_alive(!refuse)
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// A response body.
pub type Out = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(status: u16, ctype: &str, body: impl Into<Bytes>) -> Response<Out> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(ctype) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

/// A JSON response.
pub fn json_reply(status: u16, v: &Value) -> Response<Out> {
    full(status, "application/json", v.to_string())
}

/// An error in SGLang's shape (which carries OpenAI's `error` object too).
pub fn error(status: u16, message: &str) -> Response<Out> {
    json_reply(status, &error_body(status, message))
}

/// Ask hyper to close the connection after this response.
pub fn close(r: &mut Response<Out>) {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// SGLang's error body.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400..=499 => "BadRequestError",
        503 => "ServiceUnavailableError",
        _ => "InternalServerError",
    };
    json!({"error": {"message": message, "type": kind, "code": status}, "object": "error",
           "message": message, "code": status})
}

/// Read a request's whole body within the deadline and the size limit. A failed read
/// answers with `Connection: close` (the rest of the body is not read).
pub async fn read_body(req: Request<Incoming>, deadline: Duration) -> Result<Bytes, Response<Out>> {
    let fail = |status: u16, msg: String| {
        let mut r = error(status, &msg);
        close(&mut r);
        r
    };
    let claimed = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = claimed.filter(|&n| n > MAX_BODY as u64) {
        return Err(fail(
            413,
            format!("body: {n} bytes is over the limit of {MAX_BODY} bytes"),
        ));
    }
    let body = Limited::new(req.into_body(), MAX_BODY);
    match tokio::time::timeout(deadline, body.collect()).await {
        Err(_) => Err(fail(408, "request body not received in time".into())),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(fail(
            413,
            format!("body: over the limit of {MAX_BODY} bytes"),
        )),
        Ok(Err(e)) => Err(fail(400, format!("body: not received whole: {e}"))),
    }
}

const PATHS: [&str; 9] = [
    "/generate",
    "/health",
    "/health_generate",
    "/get_model_info",
    "/get_server_info",
    "/metrics",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
];

async fn route<K: Send + 'static>(sh: &Arc<Shared<K>>, req: Request<Incoming>) -> Response<Out> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/health" | "/health_generate") => full(200, "text/plain", ""),
        (&Method::GET, "/get_model_info") => json_reply(200, &model_info(&sh.info)),
        (&Method::GET, "/get_server_info") => {
            let sh2 = sh.clone();
            let status = tokio::task::spawn_blocking(move || (sh2.status)())
                .await
                .unwrap_or(Value::Null);
            let mut v = sh.info.server_info.clone();
            if let Some(o) = v.as_object_mut() {
                o.insert("status".into(), status);
            }
            json_reply(200, &v)
        }
        (&Method::GET, "/metrics") => {
            let sh2 = sh.clone();
            let nodes = tokio::task::spawn_blocking(move || (sh2.nodes)())
                .await
                .unwrap_or_default();
            full(
                200,
                metrics::CONTENT_TYPE,
                metrics::render(sh.info.page_size, &sh.counters, &nodes),
            )
        }
        (&Method::GET, "/v1/models") => json_reply(200, &openai::models(&sh.info)),
        (&Method::POST, "/generate") => match read_body(req, sh.limits.read_deadline).await {
            Ok(b) => generate(sh, &b).await,
            Err(r) => r,
        },
        (&Method::POST, "/v1/completions" | "/v1/chat/completions") => {
            match read_body(req, sh.limits.read_deadline).await {
                Ok(b) => openai::serve(sh, &path, &b).await,
                Err(r) => r,
            }
        }
        (_, p) if PATHS.contains(&p) => {
            error(405, &format!("method {method} not allowed on {path}"))
        }
        _ => error(404, &format!("no endpoint {path}")),
    }
}

/// `/get_model_info`'s body.
pub fn model_info(info: &FrontInfo) -> Value {
    json!({
        "model_path": info.model_path,
        "tokenizer_path": null,
        "is_generation": true,
        "max_context_length": info.context_len,
    })
}

/// A checked request for the engine.
#[derive(Clone, Debug)]
pub struct Job {
    pub ids: Vec<u32>,
    pub max_new_tokens: u32,
    pub stream: bool,
}

impl<K> Shared<K> {
    /// `text`'s token ids (counted first: a huge prompt must not grow the vocabulary).
    pub fn tokenize(&self, field: &str, text: &str) -> Result<Vec<u32>, String> {
        let n = text.split_whitespace().count();
        if n > MAX_PROMPT_TOKENS {
            return Err(field_err(
                field,
                format!("{n} tokens is over the front's limit of {MAX_PROMPT_TOKENS}"),
            ));
        }
        Ok(self
            .vocab
            .lock()
            .map_err(|_| field_err(field, "tokenizer unavailable"))?
            .encode(text))
    }

    /// A `max_new_tokens` value, checked against the server's limit.
    pub fn max_new(&self, name: &str, v: Option<body::Int>) -> Result<Option<u32>, String> {
        let Some(body::Int(n)) = v else {
            return Ok(None);
        };
        let limit = self.info.max_new_tokens_limit;
        if n < 1 || n > i64::from(limit) {
            return Err(field_err(
                name,
                format!("{n} is outside 1..={limit} (the server's max_new_tokens limit)"),
            ));
        }
        Ok(Some(n as u32))
    }

    /// `max_new_tokens` when the body gives none.
    pub fn default_max_new(&self) -> u32 {
        self.info.max_new_tokens_limit.min(128)
    }

    /// Count a reply's status.
    pub fn count_status(&self, status: u16) {
        if let Ok(mut m) = self.counters.by_status.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    /// A body the front refuses (400 naming the field; nothing reached the engine).
    pub fn refuse(&self, msg: &str, shape: fn(u16, &str) -> Response<Out>) -> Response<Out> {
        self.counters
            .rejected_by_front
            .fetch_add(1, Ordering::Relaxed);
        self.count_status(400);
        shape(400, msg)
    }

    /// Read reply tokens as text: their words (under canary prompts, the word the
    /// echoed request's prompt had at the echoed position).
    pub fn render(&self, tokens: &[u32]) -> String {
        if !self.canary {
            let vocab = match self.vocab.lock() {
                Ok(v) => v,
                Err(v) => v.into_inner(),
            };
            return vocab.decode(tokens);
        }
        let prompts = match self.prompts.lock() {
            Ok(p) => p,
            Err(p) => p.into_inner(),
        };
        let vocab = match self.vocab.lock() {
            Ok(v) => v,
            Err(v) => v.into_inner(),
        };
        tokens
            .iter()
            .map(|&t| match kvsim_oracle::canary::owner(t) {
                None => crate::tokenizer::UNKNOWN.to_string(),
                Some(r) => {
                    let pos = (t & 0xFFFF) as usize;
                    match prompts.by_req.get(&r.0).and_then(|p| p.get(pos)) {
                        Some(&id) => vocab.word(id),
                        None => format!("<forgotten:r{}:{pos}>", r.0),
                    }
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Why the engine did not answer 200, for the client: the engine's own reason
    /// where it gave one (`Reply::reason`), else what the status says.
    pub fn engine_error(&self, reply: &Reply, prompt_len: usize) -> String {
        if let Some(why) = &reply.reason {
            return why.clone();
        }
        match reply.status {
            400 => format!(
                "The input ({prompt_len} tokens) is longer than the server admits ({} tokens: \
                 the smaller of the context length {} and the smallest KV pool {}); rejected \
                 by the engine",
                self.info.context_len.min(self.info.min_pool_tokens),
                self.info.context_len,
                self.info.min_pool_tokens
            ),
            503 => "the engine is overloaded or shutting down (queue full or intake closed)".into(),
            st => format!("the engine failed the request (status {st})"),
        }
    }
}

/// Runs its action when dropped armed: hyper drops a request's future, or its
/// streaming body, when the client closes the connection, and the action cancels
/// the request where it runs.
pub struct CancelGuard(Option<Box<dyn FnOnce() + Send>>);

impl CancelGuard {
    pub fn new(on_drop: impl FnOnce() + Send + 'static) -> Self {
        CancelGuard(Some(Box::new(on_drop)))
    }

    /// The request was answered: nothing to cancel.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A request submitted to a node's loop: its id, its answers, its guard.
pub struct Pending {
    pub req: u64,
    pub prompt_len: usize,
    pub rx: mpsc::UnboundedReceiver<ReplyEv>,
    pub guard: CancelGuard,
}

impl Pending {
    /// Wait for the terminal answer (`None`: the server is shutting down); the tokens
    /// streamed before it are in `tokens`, by index.
    pub async fn done_with(&mut self, tokens: &mut Vec<u32>) -> Option<Reply> {
        while let Some(ev) = self.rx.recv().await {
            match ev {
                ReplyEv::Token { index, token } => {
                    if index as usize == tokens.len() {
                        tokens.push(token);
                    }
                }
                ReplyEv::Done(r) => {
                    self.guard.disarm();
                    return Some(r);
                }
            }
        }
        self.guard.disarm();
        None
    }

    /// Wait for the terminal answer (`None`: the server is shutting down).
    pub async fn done(&mut self) -> Option<Reply> {
        self.done_with(&mut Vec::new()).await
    }
}

/// Submit `job` to the router's loop.
pub fn submit<K: Send + 'static>(sh: &Arc<Shared<K>>, job: &Job) -> Result<Pending, String> {
    let id = sh.next.fetch_add(1, Ordering::Relaxed);
    let prompt = if sh.canary {
        if id as usize >= kvsim_oracle::canary::MAX_REQUESTS {
            return Err("request limit reached: canary prompts name at most 65535 requests".into());
        }
        if let Ok(mut p) = sh.prompts.lock() {
            p.keep(id, &job.ids);
        }
        kvsim_oracle::canary::prompt(RequestId(id), job.ids.len() as u64)
    } else {
        job.ids.clone()
    };
    let (tx, rx) = mpsc::unbounded_channel();
    // A reply that is not streamed needs only its terminal answer (it has every
    // token): each token passed on would wake the request's task for nothing.
    let stream = job.stream;
    let sink = ReplySink::new(move |ev| match ev {
        ReplyEv::Token { .. } if !stream => !tx.is_closed(),
        ev => tx.send(ev).is_ok(),
    });
    let sent = sh.router.send(NodeEvent::Submit {
        req: RequestId(id),
        tenant: TenantId(0),
        prompt,
        max_new_tokens: job.max_new_tokens,
        reply: sink,
    });
    if sent.is_err() {
        return Err("server is shutting down".into());
    }
    let sh2 = sh.clone();
    Ok(Pending {
        req: id,
        prompt_len: job.ids.len(),
        rx,
        guard: CancelGuard::new(move || {
            sh2.counters.disconnects.fetch_add(1, Ordering::Relaxed);
            let _ = sh2.router.send(NodeEvent::Cancel { req: RequestId(id) });
        }),
    })
}

/// A streaming body: each answer event rendered as bytes as it arrives; dropping it
/// (the client went away) cancels the request through its guard.
pub struct EventBody {
    pending: Pending,
    render: Box<dyn FnMut(ReplyEv) -> Bytes + Send>,
    /// Sent when the answers end without a terminal one (shutdown).
    on_close: Option<Bytes>,
    done: bool,
}

impl EventBody {
    pub fn new(
        pending: Pending,
        render: impl FnMut(ReplyEv) -> Bytes + Send + 'static,
        on_close: Bytes,
    ) -> Self {
        EventBody {
            pending,
            render: Box::new(render),
            on_close: Some(on_close),
            done: false,
        }
    }
}

impl Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let me = self.get_mut();
        if me.done {
            return Poll::Ready(None);
        }
        match me.pending.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(ev)) => {
                if matches!(ev, ReplyEv::Done(_)) {
                    me.pending.guard.disarm();
                    me.done = true;
                }
                Poll::Ready(Some(Ok(Frame::data((me.render)(ev)))))
            }
            Poll::Ready(None) => {
                me.pending.guard.disarm();
                me.done = true;
                Poll::Ready(me.on_close.take().map(|b| Ok(Frame::data(b))))
            }
        }
    }
}

/// An SSE response with `body`.
pub fn sse<B>(body: B) -> Response<Out>
where
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let mut r = Response::new(body.boxed_unsync());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// One SSE event.
pub fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A field's text to token ids (`field`, `text`).
pub type Tokenize<'a> = dyn Fn(&str, &str) -> Result<Vec<u32>, String> + 'a;
/// A `max_new_tokens` field checked against the server's limit (`field`, value).
pub type MaxNew<'a> = dyn Fn(&str, Option<body::Int>) -> Result<Option<u32>, String> + 'a;

/// Check a `/generate` body into a job.
pub fn check_generate(
    tokenize: &Tokenize<'_>,
    max_new: &MaxNew<'_>,
    default_max: u32,
    g: GenerateBody,
) -> Result<Job, String> {
    let given: Vec<&str> = [
        ("text", g.text.is_some()),
        ("input_ids", g.input_ids.is_some()),
        ("prompt", g.prompt.is_some()),
    ]
    .into_iter()
    .filter_map(|(f, on)| on.then_some(f))
    .collect();
    if given.len() != 1 {
        let got = if given.is_empty() {
            "none".to_string()
        } else {
            given.join(", ")
        };
        return Err(field_err(
            "text",
            format!("give exactly one of text, input_ids, prompt (got {got})"),
        ));
    }
    let which = given[0];
    let ids = match (g.input_ids, g.text.or(g.prompt)) {
        (Some(Ids::One(ids)), _) => ids,
        (Some(Ids::Batch(_)), _) | (_, Some(Text::Batch(_))) => {
            return Err(field_err(
                which,
                "a batch (a list of prompts) is not supported: send one string",
            ))
        }
        (None, Some(Text::One(s))) => tokenize(which, &s)?,
        (None, None) => Vec::new(),
    };
    if ids.is_empty() {
        return Err(field_err(which, "the prompt is empty (no tokens)"));
    }
    let max_new_of = max_new;
    let mut max_new = None;
    if let Some(body::Obj(sp)) = g.sampling_params {
        max_new = max_new_of("sampling_params.max_new_tokens", sp.max_new_tokens)?;
    }
    if let Some(n) = max_new_of("max_tokens", g.max_tokens)? {
        max_new = Some(n);
    }
    Ok(Job {
        ids,
        max_new_tokens: max_new.unwrap_or(default_max),
        stream: g.stream.is_some_and(|f| f.0),
    })
}

/// SGLang's `POST /generate`.
async fn generate<K: Send + 'static>(sh: &Arc<Shared<K>>, body: &[u8]) -> Response<Out> {
    sh.counters.requests.fetch_add(1, Ordering::Relaxed);
    let tokenize = |f: &str, t: &str| sh.tokenize(f, t);
    let max_new = |f: &str, v| sh.max_new(f, v);
    let parsed = body::parse::<GenerateBody>(body)
        .and_then(|g| check_generate(&tokenize, &max_new, sh.default_max_new(), g));
    let job = match parsed {
        Ok(j) => j,
        Err(msg) => return sh.refuse(&msg, error),
    };
    let mut pending = match submit(sh, &job) {
        Ok(p) => p,
        Err(msg) => {
            sh.count_status(503);
            return error(503, &msg);
        }
    };
    let id = pending.req;
    let (prompt_len, max_new) = (job.ids.len(), job.max_new_tokens as usize);
    let meta = move |n: usize, done: bool| -> Value {
        let finish = if !done {
            Value::Null
        } else if n >= max_new {
            json!({"type": "length", "length": n})
        } else {
            json!({"type": "stop", "matched": null})
        };
        json!({"id": format!("r{id}"), "prompt_tokens": prompt_len,
               "completion_tokens": n, "finish_reason": finish})
    };
    if !job.stream {
        let Some(reply) = pending.done().await else {
            sh.count_status(503);
            return error(503, "server is shutting down");
        };
        sh.count_status(reply.status);
        if reply.status != 200 {
            return error(reply.status, &sh.engine_error(&reply, prompt_len));
        }
        let text = sh.render(&reply.tokens);
        return json_reply(
            200,
            &json!({"text": text, "output_ids": reply.tokens,
                    "meta_info": meta(reply.tokens.len(), true)}),
        );
    }
    // Stream: the status line goes out now; an engine error arrives as an error event.
    stream_reply(sh, pending, SglangStream::new(meta))
}

/// How a stream renders its events (into `out`).
pub trait Streamer: Send + 'static {
    /// One new token (`word` is its text).
    fn token(&mut self, word: &str, id: u32, out: &mut Vec<u8>);
    /// The end of a 200 answer, after its last token.
    fn finish(&mut self, reply: &Reply, out: &mut Vec<u8>);
    /// An answer that is not 200 (`message` is the engine's reason).
    fn failed(&mut self, status: u16, message: &str, out: &mut Vec<u8>);
}

/// Stream `pending`'s answers with `s`, each token once, in order.
pub fn stream_reply<K: Send + 'static, S: Streamer>(
    sh: &Arc<Shared<K>>,
    pending: Pending,
    mut s: S,
) -> Response<Out> {
    let sh = sh.clone();
    let prompt_len = pending.prompt_len;
    let mut sent = 0usize;
    let render = move |ev: ReplyEv| -> Bytes {
        let mut out = Vec::new();
        let reply = match ev {
            ReplyEv::Token { index, token } => {
                // Each token once, in order (the terminal answer has them all).
                if index as usize == sent {
                    s.token(&sh.render(&[token]), token, &mut out);
                    sent += 1;
                }
                return Bytes::from(out);
            }
            ReplyEv::Done(reply) => reply,
        };
        sh.count_status(reply.status);
        if reply.status == 200 {
            for &t in reply.tokens.iter().skip(sent) {
                s.token(&sh.render(&[t]), t, &mut out);
            }
            sent = reply.tokens.len();
            s.finish(&reply, &mut out);
        } else {
            s.failed(reply.status, &sh.engine_error(&reply, prompt_len), &mut out);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    };
    let closing = event(&error_body(503, "server is shutting down"));
    sse(EventBody::new(pending, render, closing))
}

/// SGLang's stream: each event has the whole text so far (appended to, not rebuilt)
/// and the ids so far; `meta(n, done)` is the event's `meta_info`.
pub struct SglangStream {
    text: String,
    ids: Vec<u32>,
    meta: Box<dyn Fn(usize, bool) -> Value + Send>,
}

impl SglangStream {
    pub fn new(meta: impl Fn(usize, bool) -> Value + Send + 'static) -> Self {
        SglangStream {
            text: String::new(),
            ids: Vec::new(),
            meta: Box::new(meta),
        }
    }
}

impl Streamer for SglangStream {
    fn token(&mut self, word: &str, id: u32, out: &mut Vec<u8>) {
        if !self.ids.is_empty() {
            self.text.push(' ');
        }
        self.text.push_str(word);
        self.ids.push(id);
        let n = self.ids.len();
        out.extend_from_slice(&event(&json!({"text": self.text, "output_ids": self.ids,
            "meta_info": (self.meta)(n, false)})));
    }

    fn finish(&mut self, _reply: &Reply, out: &mut Vec<u8>) {
        let n = self.ids.len();
        out.extend_from_slice(&event(&json!({"text": self.text, "output_ids": self.ids,
            "meta_info": (self.meta)(n, true)})));
    }

    fn failed(&mut self, status: u16, message: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(&event(&error_body(status, message)));
    }
}

/// The deployment facts the front serves, from the server's options. Flag names follow
/// SGLang where it has one (`disaggregation_enable_kv_checksum`, `page_size`,
/// `context_length`, `max_total_num_tokens`) and the write-ups' pre-flight gate where
/// it has not (`deferred_release`, `mooncake_transfer_batch_max`).
pub fn front_info(opts: &crate::server::ServeOptions) -> FrontInfo {
    let cfg = &opts.cfg;
    let d = &cfg.defenses;
    let page = u64::from(cfg.page_size);
    let nodes: Vec<Value> = opts
        .topology
        .nodes()
        .into_iter()
        .filter_map(|(id, role, pool)| {
            let pool = pool?;
            let mode = match role {
                kvsim_engine::node::Role::Prefill => "prefill",
                kvsim_engine::node::Role::Decode => "decode",
                _ => return None,
            };
            Some(json!({
                "node": id.to_string(),
                "disaggregation_mode": mode,
                "max_total_num_tokens": u64::from(pool) * page,
                "pool_pages": pool,
                "context_length": cfg.context_len,
                "page_size": cfg.page_size,
                "deferred_release": d.deferred_release,
                "mooncake_transfer_batch_max": cfg.chunk_pages,
                "disaggregation_enable_kv_checksum": d.verify_on_completion,
            }))
        })
        .collect();
    let min_pool = nodes
        .iter()
        .filter_map(|n| n["max_total_num_tokens"].as_u64())
        .min()
        .unwrap_or(0);
    let bugs: Vec<&str> = cfg.bugs.iter().map(|b| b.name()).collect();
    FrontInfo {
        model_path: format!("kvsim/{}", opts.scenario),
        context_len: cfg.context_len,
        max_new_tokens_limit: cfg.max_new_tokens_limit,
        min_pool_tokens: min_pool,
        page_size: page,
        server_info: json!({
            "model_path": format!("kvsim/{}", opts.scenario),
            "disaggregation_mode": "router",
            "context_length": cfg.context_len,
            "page_size": cfg.page_size,
            "max_total_num_tokens": min_pool,
            "deferred_release": d.deferred_release,
            "mooncake_transfer_batch_max": cfg.chunk_pages,
            "disaggregation_enable_kv_checksum": d.verify_on_completion,
            "allow_auto_truncate": cfg.allow_auto_truncate,
            "kvsim_defenses": {
                "admission_check": d.admission_check,
                "verify_on_completion": d.verify_on_completion,
                "deferred_release": d.deferred_release,
                "page_tags": d.page_tags,
                "preflight": d.preflight,
                "router_cancels_both": d.router_cancels_both,
                "zero_on_free": d.zero_on_free,
            },
            "kvsim_bugs": bugs,
            "nodes": nodes,
        }),
    }
}
