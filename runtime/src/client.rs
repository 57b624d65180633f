//! The client endpoint: line-delimited JSON over TCP, one request at a time per
//! connection (open several connections for concurrency).
//!
//! A request line: `{"prompt_len": N, "max_new_tokens": M}` (optional `"tenant"`);
//! the line `status` gets the server's status (bug switches on, every local node's
//! pool and rooms) as one JSON line.
//! The server assigns the request id and sends a canary prompt (token `i` of request
//! `r` is `((r + 1) << 16) | i`), so a reply token names the prompt it came from.
//! The reply line: `{"req": R, "status": S, "tokens": [...]}`, with `"reason"` (the
//! engine's words) when the status is not 200 and the engine gave one; a line that is not a
//! request gets `{"error": "..."}` naming the field and the reason. A client that
//! closes its connection before the reply cancels its request (the router then
//! cancels both halves).

use crate::node::event::NodeEvent;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::server::options::PromptMode;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use crate::sync::thread;
use crate::sync::Arc;
use kvsim_engine::ids::{RequestId, TenantId};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// One request, as a client sends it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    #[serde(default)]
    pub tenant: u32,
}

/// What the `status` line answers.
pub type StatusFn = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Serve clients on `listener` until `stop`, submitting to the router's loop.
pub fn spawn_client_endpoint<K: Send + 'static>(
    listener: TcpListener,
    router: Sender<NodeEvent<K>>,
    status: StatusFn,
    next: Arc<AtomicU64>,
    prompts: PromptMode,
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    thread::Builder::new()
        .name("client-endpoint".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (router, next, stop) = (router.clone(), next.clone(), stop.clone());
                        let status = status.clone();
                        let _ = thread::Builder::new()
                            .name("client".into())
                            .spawn(move || serve_client(s, router, next, status, prompts, stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            }
        })
}

fn error_line(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

fn serve_client<K>(
    stream: TcpStream,
    router: Sender<NodeEvent<K>>,
    next: Arc<AtomicU64>,
    status: StatusFn,
    prompts: PromptMode,
    stop: Arc<AtomicBool>,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let Ok(read) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(read);
    let mut out = stream;
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.len() > 4096 {
            let _ = writeln!(out, "{}", error_line("request line longer than 4096 bytes"));
            return;
        }
        if line.trim() == "status" {
            if writeln!(out, "{}", status()).is_err() {
                return;
            }
            continue;
        }
        let req = match request_of(&line) {
            Ok(r) => r,
            Err(msg) => {
                let _ = writeln!(out, "{}", error_line(&msg));
                continue;
            }
        };
        let id = next.fetch_add(1, Ordering::Relaxed);
        if prompts == PromptMode::Canary && id as usize >= kvsim_oracle::canary::MAX_REQUESTS {
            let _ = writeln!(
                out,
                "{}",
                error_line("request limit reached: canary prompts name at most 65535 requests")
            );
            return;
        }
        let (tx, rx) = channel();
        // A request of a length: the canary sequence of its id (under `own` prompts
        // the id wraps past 65,535, and no oracle reads the tokens as names).
        let named = RequestId(id % kvsim_oracle::canary::MAX_REQUESTS as u64);
        let submitted = router.send(NodeEvent::Submit {
            req: RequestId(id),
            tenant: TenantId(req.tenant),
            prompt: kvsim_oracle::canary::prompt(named, req.prompt_len),
            max_new_tokens: req.max_new_tokens,
            reply: ReplySink::channel(tx),
        });
        if submitted.is_err() {
            let _ = writeln!(out, "{}", error_line("server is shutting down"));
            return;
        }
        if !await_reply(&mut out, &rx, &router, RequestId(id)) {
            return;
        }
    }
}

/// A request line's request, or the error line's message: a line that does not parse,
/// or a prompt over [`crate::http::MAX_PROMPT_TOKENS`].
fn request_of(line: &str) -> Result<Request, String> {
    let req: Request =
        serde_json::from_str(line.trim()).map_err(|e| format!("bad request: {e}"))?;
    if req.prompt_len > crate::http::limits::MAX_PROMPT_TOKENS as u64 {
        return Err(format!(
            "prompt_len: {} is over the limit of {}",
            req.prompt_len,
            crate::http::limits::MAX_PROMPT_TOKENS
        ));
    }
    Ok(req)
}

/// Wait for `req`'s reply and write it as one line; a client that closed meanwhile
/// cancels the request. `false` when the connection is done (closed, or the server
/// shutting down).
fn await_reply<K>(
    out: &mut TcpStream,
    rx: &Receiver<ReplyEv>,
    router: &Sender<NodeEvent<K>>,
    req: RequestId,
) -> bool {
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(ReplyEv::Token { .. } | ReplyEv::Params { .. }) => {}
            Ok(ReplyEv::Done(reply)) => {
                let text = serde_json::to_string(&reply).unwrap_or_default();
                return writeln!(out, "{text}").is_ok();
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = writeln!(out, "{}", error_line("server is shutting down"));
                return false;
            }
            Err(RecvTimeoutError::Timeout) => {
                if closed(out) {
                    let _ = router.send(NodeEvent::Cancel { req });
                    return false;
                }
            }
        }
    }
}

/// Has the peer closed the connection? (A pending request line is not a close.)
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

/// A blocking client of the endpoint (tests, benchmarks).
pub struct Client {
    lines: BufReader<TcpStream>,
    out: TcpStream,
}

/// What a client got back.
#[derive(Debug)]
pub enum Answer {
    Reply(Reply),
    Error(String),
}

impl Client {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        Ok(Client {
            lines: BufReader::new(s.try_clone()?),
            out: s,
        })
    }

    /// Send one raw line without waiting for the answer.
    pub fn raw_send(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.out, "{line}")
    }

    /// Send one raw line and read the answer line.
    pub fn raw(&mut self, line: &str) -> std::io::Result<Answer> {
        writeln!(self.out, "{line}")?;
        let mut back = String::new();
        if self.lines.read_line(&mut back)? == 0 {
            return Err(std::io::Error::new(
                ErrorKind::UnexpectedEof,
                "server closed",
            ));
        }
        let v: serde_json::Value = serde_json::from_str(back.trim())
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            return Ok(Answer::Error(e.to_string()));
        }
        serde_json::from_value(v)
            .map(Answer::Reply)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
    }

    /// The server's status line, parsed.
    pub fn status(&mut self) -> std::io::Result<serde_json::Value> {
        writeln!(self.out, "status")?;
        let mut back = String::new();
        self.lines.read_line(&mut back)?;
        serde_json::from_str(back.trim())
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
    }

    pub fn request(&mut self, prompt_len: u64, max_new_tokens: u32) -> std::io::Result<Answer> {
        let r = Request {
            prompt_len,
            max_new_tokens,
            tenant: 0,
        };
        self.raw(&serde_json::to_string(&r).unwrap_or_default())
    }
}
