//! The SGLang-compatible HTTP front of the router: a small blocking HTTP/1.1 server on
//! std threads (one thread per connection, one request per connection,
//! `Connection: close`).
//!
//! Endpoints: `POST /generate` (SGLang's native body: `text` or `input_ids`,
//! `sampling_params.max_new_tokens`, `stream`; and the write-ups' body: `prompt`,
//! `max_tokens`, `model`), `GET /get_model_info`, `GET /get_server_info`,
//! `GET /metrics` (Prometheus text), `GET /health`.
//!
//! Limits: a request's head is at most [`MAX_HEAD`] bytes, its body at most
//! [`MAX_BODY`] bytes, and the whole request must arrive within [`READ_DEADLINE`];
//! otherwise 431/413/408. A body that is not JSON, has a field of the wrong type, an
//! empty prompt, a prompt over [`MAX_PROMPT_TOKENS`], or `max_new_tokens` outside
//! `1..=max_new_tokens_limit` gets 400 naming the field, before anything reaches the
//! engine (so nothing is allocated for it). Prompts longer than the context are NOT
//! refused here: admission is the engine's job, and the front must not hide whether
//! the engine does it.
//!
//! Text: the front tokenizes with [`crate::tokenizer`] and submits the prompt's length;
//! the engine sends the canary prompt (`kvsim_oracle::canary`), whose token names the
//! request and the position. The front keeps every recent request's token ids (its
//! first 65,536 positions), so a reply token that echoes request `r`'s position `i`
//! reads as the word `r`'s prompt had at `i`: a reply that reads another request's
//! stale KV shows that request's words, its canary marker included.
//!
//! Streaming: the router answers a request once, with all its tokens; with
//! `"stream": true` the front then sends one `data: {...}` event per token (cumulative
//! `text`, as SGLang does) and `data: [DONE]`.

use crate::client::StatusFn;
use crate::node::{Ev, Reply};
use crate::tokenizer::Vocab;
use kvsim_engine::ids::{RequestId, TenantId};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Most bytes of a request line plus headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most bytes of a request body (the write-ups' 700,000-word prompt is 1.4 MB).
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// Most time to receive a whole request.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);
/// Most prompt tokens the front accepts (beyond it 400, whatever the context).
pub const MAX_PROMPT_TOKENS: usize = 1 << 22;
/// Positions of a prompt the front remembers (the canary token keeps 16 bits).
const KEPT_POSITIONS: usize = 1 << 16;
/// Most remembered tokens over all requests (the oldest requests are forgotten).
const KEPT_TOKENS: usize = 1 << 23;
/// Most connections served at once (beyond it 503).
const MAX_CONNECTIONS: usize = 1024;

/// What the front serves besides generation: fixed facts about the deployment.
#[derive(Clone, Debug)]
pub struct FrontInfo {
    pub model_path: String,
    pub context_len: u64,
    pub max_new_tokens_limit: u32,
    /// The smallest pool of any node, in tokens.
    pub min_pool_tokens: u64,
    /// `/get_server_info`'s body.
    pub server_info: Value,
}

/// Counters the front keeps itself.
#[derive(Default, Debug)]
struct FrontCounters {
    requests: AtomicU64,
    rejected_by_front: AtomicU64,
    disconnects: AtomicU64,
    by_status: Mutex<BTreeMap<u16, u64>>,
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

struct Shared<K> {
    router: Sender<Ev<K>>,
    status: StatusFn,
    next: Arc<AtomicU64>,
    info: FrontInfo,
    vocab: Mutex<Vocab>,
    prompts: Mutex<Prompts>,
    counters: FrontCounters,
    open: AtomicU64,
    stop: Arc<AtomicBool>,
}

/// Serve HTTP on `listener` until `stop`, submitting to the router's loop. `next`
/// hands out request ids (shared with the line-JSON endpoint).
pub fn spawn_http_front<K: Send + 'static>(
    listener: TcpListener,
    router: Sender<Ev<K>>,
    status: StatusFn,
    next: Arc<AtomicU64>,
    info: FrontInfo,
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<()>> {
    // Blocking accept: a sleep-and-poll loop would add up to its period to every
    // request's latency (each request is a new connection). The thread checks `stop`
    // after each connection and ends with the process.
    listener.set_nonblocking(false)?;
    let shared = Arc::new(Shared {
        router,
        status,
        next,
        info,
        vocab: Mutex::new(Vocab::new()),
        prompts: Mutex::new(Prompts::default()),
        counters: FrontCounters::default(),
        open: AtomicU64::new(0),
        stop,
    });
    thread::Builder::new()
        .name("http-front".into())
        .spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let sh = shared.clone();
                        if sh.open.fetch_add(1, Ordering::Relaxed) as usize >= MAX_CONNECTIONS {
                            sh.open.fetch_sub(1, Ordering::Relaxed);
                            let mut s = s;
                            let _ = s.set_nonblocking(false);
                            let _ = respond_json(
                                &mut s,
                                503,
                                &error_body(503, "too many open connections"),
                            );
                            continue;
                        }
                        let spawned = thread::Builder::new().name("http".into()).spawn(move || {
                            serve_connection(s, &sh);
                            sh.open.fetch_sub(1, Ordering::Relaxed);
                        });
                        if spawned.is_err() {
                            shared.open.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(2))
                    }
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            }
        })
}

/// A parsed request.
struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// Why a request could not be read (status and message).
struct HttpError(u16, String);

fn read_request(stream: &TcpStream, deadline: Duration) -> Result<HttpRequest, HttpError> {
    let start = Instant::now();
    let left = || deadline.saturating_sub(start.elapsed());
    let timeout = |s: &TcpStream| {
        let l = left();
        if l.is_zero() {
            return Err(HttpError(408, "request not received in time".into()));
        }
        s.set_read_timeout(Some(l))
            .map_err(|e| HttpError(400, format!("socket: {e}")))
    };
    let mut r = BufReader::new(stream);
    let mut head = 0usize;
    let mut line = Vec::new();
    let read_line = |r: &mut BufReader<&TcpStream>,
                     line: &mut Vec<u8>,
                     head: &mut usize|
     -> Result<String, HttpError> {
        line.clear();
        timeout(stream)?;
        let n = r
            .by_ref()
            .take((MAX_HEAD - *head + 1) as u64)
            .read_until(b'\n', line)
            .map_err(|e| match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    HttpError(408, "request not received in time".into())
                }
                _ => HttpError(400, format!("read: {e}")),
            })?;
        *head += n;
        if *head > MAX_HEAD {
            return Err(HttpError(
                431,
                format!("request head longer than {MAX_HEAD} bytes"),
            ));
        }
        if n == 0 || !line.ends_with(b"\n") {
            return Err(HttpError(400, "connection closed mid-request".into()));
        }
        String::from_utf8(line.clone())
            .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
            .map_err(|_| HttpError(400, "request head is not UTF-8".into()))
    };
    let first = read_line(&mut r, &mut line, &mut head)?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError(400, format!("bad request line `{first}`")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError(
            505,
            format!("HTTP version `{version}` not supported"),
        ));
    }
    // Absolute form (a request through a proxy): keep the path.
    let path = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map(|i| &rest[i..]).unwrap_or("/"),
        None => target,
    };
    let path = path.split('?').next().unwrap_or("/").to_string();
    let mut length: Option<usize> = None;
    loop {
        let h = read_line(&mut r, &mut line, &mut head)?;
        if h.is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else {
            return Err(HttpError(400, format!("bad header line `{h}`")));
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "content-length" {
            let n: usize = value
                .parse()
                .map_err(|_| HttpError(400, format!("Content-Length `{value}` is not a length")))?;
            if length.is_some_and(|l| l != n) {
                return Err(HttpError(400, "conflicting Content-Length headers".into()));
            }
            length = Some(n);
        } else if name == "transfer-encoding" {
            return Err(HttpError(
                411,
                "Transfer-Encoding is not supported: send a Content-Length".into(),
            ));
        }
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(HttpError(
            413,
            format!("body: {length} bytes is over the limit of {MAX_BODY} bytes"),
        ));
    }
    let mut body = vec![0u8; length];
    let mut got = 0;
    while got < length {
        timeout(stream)?;
        match r.read(&mut body[got..]) {
            Ok(0) => return Err(HttpError(400, "connection closed mid-body".into())),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HttpError(408, "request body not received in time".into()))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(HttpError(400, format!("read: {e}"))),
        }
    }
    Ok(HttpRequest {
        method: method.to_string(),
        path,
        body,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

fn respond(s: &mut TcpStream, status: u16, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    s.flush()
}

fn respond_json(s: &mut TcpStream, status: u16, v: &Value) -> std::io::Result<()> {
    respond(s, status, "application/json", v.to_string().as_bytes())
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

fn serve_connection<K>(mut stream: TcpStream, sh: &Shared<K>) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let req = match read_request(&stream, READ_DEADLINE) {
        Ok(r) => r,
        Err(HttpError(status, msg)) => {
            let _ = respond_json(&mut stream, status, &error_body(status, &msg));
            return;
        }
    };
    let _ = match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") | ("GET", "/health_generate") => {
            respond(&mut stream, 200, "text/plain", b"")
        }
        ("GET", "/get_model_info") => respond_json(
            &mut stream,
            200,
            &json!({
                "model_path": sh.info.model_path,
                "tokenizer_path": null,
                "is_generation": true,
                "max_context_length": sh.info.context_len,
            }),
        ),
        ("GET", "/get_server_info") => {
            let mut v = sh.info.server_info.clone();
            if let Some(o) = v.as_object_mut() {
                o.insert("status".into(), (sh.status)());
            }
            respond_json(&mut stream, 200, &v)
        }
        ("GET", "/metrics") => {
            let text = metrics(sh);
            respond(
                &mut stream,
                200,
                "text/plain; version=0.0.4",
                text.as_bytes(),
            )
        }
        ("POST", "/generate") => generate(&mut stream, sh, &req.body),
        (_, "/generate" | "/health" | "/get_model_info" | "/get_server_info" | "/metrics") => {
            respond_json(
                &mut stream,
                405,
                &error_body(
                    405,
                    &format!("method {} not allowed on {}", req.method, req.path),
                ),
            )
        }
        _ => respond_json(
            &mut stream,
            404,
            &error_body(404, &format!("no endpoint {}", req.path)),
        ),
    };
}

/// A `/generate` body, checked.
struct Generate {
    ids: Vec<u32>,
    max_new_tokens: u32,
    stream: bool,
}

fn field_err(field: &str, why: impl std::fmt::Display) -> String {
    format!("{field}: {why}")
}

fn parse_generate<K>(sh: &Shared<K>, body: &[u8]) -> Result<Generate, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| field_err("body", format!("not JSON: {e}")))?;
    let o = v
        .as_object()
        .ok_or_else(|| field_err("body", "must be a JSON object"))?;
    let prompt_fields: Vec<&str> = ["text", "input_ids", "prompt"]
        .into_iter()
        .filter(|f| o.get(*f).is_some_and(|v| !v.is_null()))
        .collect();
    if prompt_fields.len() != 1 {
        return Err(field_err(
            "text",
            format!(
                "give exactly one of text, input_ids, prompt (got {})",
                if prompt_fields.is_empty() {
                    "none".to_string()
                } else {
                    prompt_fields.join(", ")
                }
            ),
        ));
    }
    let which = prompt_fields[0];
    let ids = match (which, &o[which]) {
        ("input_ids", Value::Array(a)) => {
            if a.len() > MAX_PROMPT_TOKENS {
                return Err(field_err(
                    "input_ids",
                    format!(
                        "{} tokens is over the front's limit of {MAX_PROMPT_TOKENS}",
                        a.len()
                    ),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(i, t)| {
                    t.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(|| {
                            field_err(
                                "input_ids",
                                format!("element {i} is not a token id (an integer 0..2^32)"),
                            )
                        })
                })
                .collect::<Result<Vec<u32>, String>>()?
        }
        ("input_ids", _) => return Err(field_err("input_ids", "must be an array of token ids")),
        (f, Value::String(s)) => {
            // Count first: a huge prompt must not grow the vocabulary.
            let n = s.split_whitespace().count();
            if n > MAX_PROMPT_TOKENS {
                return Err(field_err(
                    f,
                    format!("{n} tokens is over the front's limit of {MAX_PROMPT_TOKENS}"),
                ));
            }
            sh.vocab
                .lock()
                .map_err(|_| field_err(f, "tokenizer unavailable"))?
                .encode(s)
                .map_err(|e| field_err(f, e))?
        }
        (f, Value::Array(_)) => {
            return Err(field_err(
                f,
                "a batch (a list of prompts) is not supported: send one string",
            ))
        }
        (f, _) => return Err(field_err(f, "must be a string")),
    };
    if ids.is_empty() {
        return Err(field_err(which, "the prompt is empty (no tokens)"));
    }
    let limit = sh.info.max_new_tokens_limit;
    let mut max_new = None;
    let mut check = |name: &str, v: &Value| -> Result<(), String> {
        if v.is_null() {
            return Ok(());
        }
        let n = v
            .as_i64()
            .ok_or_else(|| field_err(name, format!("must be an integer (got {v})")))?;
        if n < 1 || n > i64::from(limit) {
            return Err(field_err(
                name,
                format!("{n} is outside 1..={limit} (the server's max_new_tokens limit)"),
            ));
        }
        max_new = Some(n as u32);
        Ok(())
    };
    match o.get("sampling_params") {
        None | Some(Value::Null) => {}
        Some(Value::Object(sp)) => {
            if let Some(v) = sp.get("max_new_tokens") {
                check("sampling_params.max_new_tokens", v)?;
            }
        }
        Some(_) => return Err(field_err("sampling_params", "must be an object")),
    }
    if let Some(v) = o.get("max_tokens") {
        check("max_tokens", v)?;
    }
    if let Some(v) = o.get("model") {
        if !v.is_string() && !v.is_null() {
            return Err(field_err("model", "must be a string"));
        }
    }
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(field_err("stream", "must be true or false")),
    };
    Ok(Generate {
        ids,
        max_new_tokens: max_new.unwrap_or(limit.min(128)),
        stream,
    })
}

/// Read a reply token as text: the word the echoed request's prompt had there.
fn render<K>(sh: &Shared<K>, tokens: &[u32]) -> String {
    let prompts = match sh.prompts.lock() {
        Ok(p) => p,
        Err(p) => p.into_inner(),
    };
    let vocab = match sh.vocab.lock() {
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

fn count_status<K>(sh: &Shared<K>, status: u16) {
    if let Ok(mut m) = sh.counters.by_status.lock() {
        *m.entry(status).or_default() += 1;
    }
}

fn generate<K>(s: &mut TcpStream, sh: &Shared<K>, body: &[u8]) -> std::io::Result<()> {
    sh.counters.requests.fetch_add(1, Ordering::Relaxed);
    let g = match parse_generate(sh, body) {
        Ok(g) => g,
        Err(msg) => {
            sh.counters
                .rejected_by_front
                .fetch_add(1, Ordering::Relaxed);
            count_status(sh, 400);
            return respond_json(s, 400, &error_body(400, &msg));
        }
    };
    let id = sh.next.fetch_add(1, Ordering::Relaxed);
    if id as usize >= kvsim_oracle::canary::MAX_REQUESTS {
        count_status(sh, 503);
        return respond_json(
            s,
            503,
            &error_body(
                503,
                "request limit reached: canary prompts name at most 65535 requests",
            ),
        );
    }
    if let Ok(mut p) = sh.prompts.lock() {
        p.keep(id, &g.ids);
    }
    let prompt_len = g.ids.len() as u64;
    let (tx, rx) = channel();
    if sh
        .router
        .send(Ev::Submit {
            req: RequestId(id),
            tenant: TenantId(0),
            prompt_len,
            max_new_tokens: g.max_new_tokens,
            reply: tx,
        })
        .is_err()
    {
        count_status(sh, 503);
        return respond_json(s, 503, &error_body(503, "server is shutting down"));
    }
    let reply: Reply = loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => break r,
            Err(RecvTimeoutError::Disconnected) => {
                count_status(sh, 503);
                return respond_json(s, 503, &error_body(503, "server is shutting down"));
            }
            Err(RecvTimeoutError::Timeout) => {
                if closed(s) {
                    sh.counters.disconnects.fetch_add(1, Ordering::Relaxed);
                    let _ = sh.router.send(Ev::Cancel { req: RequestId(id) });
                    return Ok(());
                }
            }
        }
    };
    count_status(sh, reply.status);
    if reply.status != 200 {
        let msg = match reply.status {
            400 => format!(
                "The input ({prompt_len} tokens) is longer than the server admits ({} tokens: \
                 the smaller of the context length {} and the smallest KV pool {}); rejected \
                 by the engine",
                sh.info.context_len.min(sh.info.min_pool_tokens),
                sh.info.context_len,
                sh.info.min_pool_tokens
            ),
            503 => "the engine is overloaded or shutting down (queue full or intake closed)".into(),
            st => format!("the engine failed the request (status {st})"),
        };
        return respond_json(s, reply.status, &error_body(reply.status, &msg));
    }
    let finish = |n: usize| {
        if n >= g.max_new_tokens as usize {
            json!({"type": "length", "length": n})
        } else {
            json!({"type": "stop", "matched": null})
        }
    };
    let meta = |n: usize, done: bool| {
        json!({
            "id": format!("r{id}"),
            "prompt_tokens": prompt_len,
            "completion_tokens": n,
            "finish_reason": if done { finish(n) } else { Value::Null },
        })
    };
    if !g.stream {
        let text = render(sh, &reply.tokens);
        return respond_json(
            s,
            200,
            &json!({"text": text, "output_ids": reply.tokens,
                    "meta_info": meta(reply.tokens.len(), true)}),
        );
    }
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    s.write_all(head.as_bytes())?;
    let n = reply.tokens.len();
    for k in 1..=n {
        let ev = json!({"text": render(sh, &reply.tokens[..k]),
                        "output_ids": &reply.tokens[..k],
                        "meta_info": meta(k, k == n)});
        s.write_all(format!("data: {ev}\n\n").as_bytes())?;
    }
    if n == 0 {
        let ev = json!({"text": "", "output_ids": [], "meta_info": meta(0, true)});
        s.write_all(format!("data: {ev}\n\n").as_bytes())?;
    }
    s.write_all(b"data: [DONE]\n\n")?;
    s.flush()
}

/// Has the peer closed the connection?
fn closed(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let r = match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    r
}

/// Prometheus text: SGLang's `sglang:max_total_num_tokens` per node and kvsim's own.
fn metrics<K>(sh: &Shared<K>) -> String {
    let status = (sh.status)();
    let page = sh
        .info
        .server_info
        .get("page_size")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str, rows: Vec<(String, u64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    let nodes: Vec<&Value> = status
        .get("nodes")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let label = |n: &Value| {
        format!(
            "{{node=\"{}\",role=\"{}\"}}",
            n.get("node")
                .map(|v| v.to_string().trim_matches('"').to_string())
                .unwrap_or_default(),
            n.get("role")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_ascii_lowercase()
        )
    };
    let pools: Vec<(String, u64, u64, u64, u64)> = nodes
        .iter()
        .filter_map(|n| {
            let cap = n.get("pool_pages")?.as_u64()?;
            let free = n.get("free_pages")?.as_u64()?;
            let q = n.get("quarantined").and_then(Value::as_u64).unwrap_or(0);
            let qp = n
                .get("quarantined_pages")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            Some((label(n), cap, free, q, qp))
        })
        .collect();
    family(
        "sglang:max_total_num_tokens",
        "KV pool size in tokens",
        "gauge",
        pools
            .iter()
            .map(|(l, c, _, _, _)| (l.clone(), c * page))
            .collect(),
    );
    family(
        "kvsim_pool_pages_free",
        "Free KV pages",
        "gauge",
        pools
            .iter()
            .map(|(l, _, f, _, _)| (l.clone(), *f))
            .collect(),
    );
    family(
        "kvsim_pool_pages_held",
        "KV pages held (allocated, in flight or quarantined)",
        "gauge",
        pools
            .iter()
            .map(|(l, c, f, _, _)| (l.clone(), c - f))
            .collect(),
    );
    family(
        "kvsim_pool_pages_quarantined",
        "KV pages quarantined until their writer's drain ack (part of held)",
        "gauge",
        pools
            .iter()
            .map(|(l, _, _, _, qp)| (l.clone(), *qp))
            .collect(),
    );
    family(
        "kvsim_quarantined_rooms",
        "Rooms whose pages are quarantined until the writer's drain ack",
        "gauge",
        pools
            .iter()
            .map(|(l, _, _, q, _)| (l.clone(), *q))
            .collect(),
    );
    family(
        "kvsim_live_requests",
        "Requests in flight per node",
        "gauge",
        nodes
            .iter()
            .map(|n| (label(n), n.get("live").and_then(Value::as_u64).unwrap_or(0)))
            .collect(),
    );
    let count = |key: &str| -> Vec<(String, u64)> {
        nodes
            .iter()
            .filter(|n| n.get("pool_pages").is_some_and(|p| !p.is_null()))
            .map(|n| (label(n), n["counts"][key].as_u64().unwrap_or(0)))
            .collect()
    };
    family(
        "kvsim_tag_mismatches_refused_total",
        "Decode reads refused because a page's tag did not match",
        "counter",
        count("tag_mismatches"),
    );
    family(
        "kvsim_kv_writes_refused_total",
        "KV writes the receiving node refused",
        "counter",
        count("kv_refused"),
    );
    family(
        "kvsim_transfers_failed_total",
        "KV writes whose completion reported failure (writer side)",
        "counter",
        count("transfers_failed"),
    );
    family(
        "kvsim_drain_acks_outstanding",
        "Quarantined room uses waiting for the writer's drain ack",
        "gauge",
        pools
            .iter()
            .map(|(l, _, _, q, _)| (l.clone(), *q))
            .collect(),
    );
    let c = &sh.counters;
    family(
        "kvsim_http_requests_total",
        "POST /generate requests",
        "counter",
        vec![(String::new(), c.requests.load(Ordering::Relaxed))],
    );
    family(
        "kvsim_http_rejected_by_front_total",
        "Bodies refused by the front (400) before reaching the engine",
        "counter",
        vec![(String::new(), c.rejected_by_front.load(Ordering::Relaxed))],
    );
    family(
        "kvsim_http_disconnects_total",
        "Clients that closed before their reply (request cancelled)",
        "counter",
        vec![(String::new(), c.disconnects.load(Ordering::Relaxed))],
    );
    let by: Vec<(String, u64)> = c
        .by_status
        .lock()
        .map(|m| {
            m.iter()
                .map(|(s, n)| (format!("{{status=\"{s}\"}}"), *n))
                .collect()
        })
        .unwrap_or_default();
    family(
        "kvsim_http_responses_total",
        "Replies by status",
        "counter",
        by,
    );
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Feed `bytes` to `read_request` over loopback (then keep the connection open).
    fn read_from(bytes: &[u8], deadline: Duration) -> Result<HttpRequest, HttpError> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(bytes).unwrap();
        let (s, _) = l.accept().unwrap();
        let r = read_request(&s, deadline);
        drop(c);
        r
    }

    #[test]
    fn slow_or_oversized_requests_are_refused() {
        // A head that never ends: 408 once the deadline passes.
        let t = Instant::now();
        let Err(HttpError(st, _)) =
            read_from(b"POST /generate HTTP/1.1\r\n", Duration::from_millis(200))
        else {
            panic!("an unfinished head was accepted");
        };
        assert_eq!(st, 408);
        assert!(t.elapsed() < Duration::from_secs(5));
        // A body shorter than its Content-Length, the sender still connected: 408.
        let Err(HttpError(st, _)) = read_from(
            b"POST /generate HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}",
            Duration::from_millis(200),
        ) else {
            panic!("a short body was accepted");
        };
        assert_eq!(st, 408);
        // A head over the limit: 431.
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        big.extend(b"\r\n\r\n");
        let Err(HttpError(st, _)) = read_from(&big, Duration::from_secs(5)) else {
            panic!("an oversized head was accepted");
        };
        assert_eq!(st, 431);
        // A well-formed request in proxy form keeps its path.
        let Ok(r) = read_from(
            b"POST http://prefill:30000/generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            Duration::from_secs(5),
        ) else {
            panic!("a proxy-form request was refused");
        };
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), &r.body[..]),
            ("POST", "/generate", &b"{}"[..])
        );
    }
}
