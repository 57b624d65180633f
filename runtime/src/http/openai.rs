//! The OpenAI API on the front, as SGLang serves it: `POST /v1/completions`,
//! `POST /v1/chat/completions` (a plain chat template: one `role: content` line per
//! message, then `assistant:`), `GET /v1/models`; streaming (`stream`, with
//! `stream_options.include_usage`) and not; usage counts; errors in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`). A streamed event carries only
//! the new text (a delta), as OpenAI's do.

use crate::http::body::{self, field_err, ChatBody, CompletionBody, Prompt};
use crate::http::generate::{MaxNew, Tokenize};
use crate::http::info::FrontInfo;
use crate::http::pending::{submit, Job};
use crate::http::response::{event, json_reply, Out};
use crate::http::state::Shared;
use crate::http::stream::{stream_reply, Streamer};
use crate::node::reply::Reply;
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use hyper::Response;
use serde_json::{json, Value};

/// An error in OpenAI's shape; `param` is the field a `field: reason` message names.
pub fn error(status: u16, message: &str) -> Response<Out> {
    json_reply(status, &error_body(status, message))
}

fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 | 413 | 408 => "invalid_request_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "service_unavailable_error",
        _ => "server_error",
    };
    let param = message
        .split_once(": ")
        .map(|(f, _)| f)
        .filter(|f| !f.contains(' ') && *f != "body");
    json!({"error": {"message": message, "type": kind, "param": param, "code": status}})
}

/// `GET /v1/models`.
pub fn models(info: &FrontInfo) -> Value {
    json!({"object": "list", "data": [{
        "id": info.model_path, "object": "model", "created": 0, "owned_by": "kvsim",
        "root": info.model_path, "max_model_len": info.context_len,
    }]})
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Which endpoint, and what it answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// A checked OpenAI request.
#[derive(Clone, Debug)]
pub struct Checked {
    pub job: Job,
    pub kind: Kind,
    pub model: String,
    pub include_usage: bool,
}

/// What checking a body needs from the server: its tokenizer, its `max_new_tokens`
/// check, its default reply length and model name.
pub struct Checks<'a> {
    pub tokenize: &'a Tokenize<'a>,
    pub max_new: &'a MaxNew<'a>,
    pub default_max: u32,
    pub model: &'a str,
}

/// Check a `/v1/completions` (or, for `path` `/v1/chat/completions`, a chat) body.
pub fn check(path: &str, b: &[u8], k: &Checks<'_>) -> Result<Checked, String> {
    if path == "/v1/chat/completions" {
        body::parse::<ChatBody>(b).and_then(|c| check_chat(k, c))
    } else {
        body::parse::<CompletionBody>(b).and_then(|c| check_completion(k, c))
    }
}

fn check_n(n: Option<body::Int>) -> Result<(), String> {
    match n {
        None | Some(body::Int(1)) => Ok(()),
        Some(body::Int(n)) => Err(field_err("n", format!("{n}: only 1 choice is supported"))),
    }
}

fn check_completion(k: &Checks<'_>, b: CompletionBody) -> Result<Checked, String> {
    check_n(b.n)?;
    if b.echo.is_some_and(|e| e.0) {
        return Err(field_err("echo", "echo is not supported"));
    }
    let ids = match b.prompt {
        None => return Err(field_err("prompt", "a prompt is required")),
        Some(Prompt::Text(t)) => (k.tokenize)("prompt", &t)?,
        Some(Prompt::Ids(ids)) => ids,
        Some(Prompt::Batch(_)) => {
            return Err(field_err(
                "prompt",
                "a batch (a list of prompts) is not supported: send one",
            ))
        }
    };
    if ids.is_empty() {
        return Err(field_err("prompt", "the prompt is empty (no tokens)"));
    }
    let max_new = (k.max_new)("max_tokens", b.max_tokens)?;
    let stream = Streaming {
        model: b.model,
        stream: b.stream,
        options: b.stream_options,
    };
    Ok(checked(k, Kind::Completion, ids, max_new, stream))
}

/// The fields both endpoints share: the model named and how to stream.
struct Streaming {
    model: Option<body::Str>,
    stream: Option<body::Flag>,
    options: Option<body::Obj<body::StreamOptions>>,
}

/// A checked request of either endpoint (`max_new`: the reply length asked for).
fn checked(
    k: &Checks<'_>,
    kind: Kind,
    ids: Vec<u32>,
    max_new: Option<u32>,
    s: Streaming,
) -> Checked {
    Checked {
        job: Job {
            ids,
            max_new_tokens: max_new.unwrap_or(k.default_max),
            stream: s.stream.is_some_and(|f| f.0),
        },
        kind,
        model: s.model.map(|m| m.0).unwrap_or_else(|| k.model.to_string()),
        include_usage: s
            .options
            .and_then(|o| o.0.include_usage)
            .is_some_and(|f| f.0),
    }
}

/// The plain chat template: `role: content` per message, then `assistant:`.
fn template(messages: &[body::Obj<body::Message>]) -> Result<String, String> {
    let mut text = String::new();
    for (i, body::Obj(m)) in messages.iter().enumerate() {
        let role = m
            .role
            .as_ref()
            .ok_or_else(|| field_err("messages", format!("element {i} has no role")))?;
        let content = m.content.as_ref().map(|c| c.0.as_str()).unwrap_or("");
        text.push_str(&format!("{}: {content}\n", role.0));
    }
    text.push_str("assistant:");
    Ok(text)
}

fn check_chat(k: &Checks<'_>, b: ChatBody) -> Result<Checked, String> {
    check_n(b.n)?;
    let messages = match b.messages {
        None => return Err(field_err("messages", "messages are required")),
        Some(body::List(m)) if m.is_empty() => {
            return Err(field_err("messages", "at least one message is required"))
        }
        Some(body::List(m)) => m,
    };
    let ids = (k.tokenize)("messages", &template(&messages)?)?;
    let mut max_new = (k.max_new)("max_tokens", b.max_tokens)?;
    if let Some(n) = (k.max_new)("max_completion_tokens", b.max_completion_tokens)? {
        max_new = Some(n);
    }
    let stream = Streaming {
        model: b.model,
        stream: b.stream,
        options: b.stream_options,
    };
    Ok(checked(k, Kind::Chat, ids, max_new, stream))
}

fn finish_reason(n: usize, max_new: u32) -> &'static str {
    if n >= max_new as usize {
        "length"
    } else {
        "stop"
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

/// `POST /v1/completions` or `POST /v1/chat/completions`.
pub async fn serve<K: Send + 'static>(sh: &Arc<Shared<K>>, path: &str, b: &[u8]) -> Response<Out> {
    sh.counters.requests.fetch_add(1, Ordering::Relaxed);
    // The checks borrow closures that are not `Send`: done before the first await.
    let checked = {
        let tokenize = |f: &str, t: &str| sh.tokenize(f, t);
        let max_new = |f: &str, v| sh.max_new(f, v);
        let checks = Checks {
            tokenize: &tokenize,
            max_new: &max_new,
            default_max: sh.default_max_new(),
            model: &sh.info.model_path,
        };
        check(path, b, &checks)
    };
    let c = match checked {
        Ok(c) => c,
        Err(msg) => return sh.refuse(&msg, error),
    };
    let mut pending = match submit(sh, &c.job) {
        Ok(p) => p,
        Err(msg) => {
            sh.count_status(503);
            return error(503, &msg);
        }
    };
    let id = reply_id(&c, pending.req);
    if c.job.stream {
        return stream_reply(sh, pending, streamer(&c, id));
    }
    let Some(reply) = pending.done().await else {
        sh.count_status(503);
        return error(503, "server is shutting down");
    };
    sh.count_status(reply.status);
    if reply.status != 200 {
        return error(reply.status, &sh.engine_error(&reply, c.job.ids.len()));
    }
    let text = sh.render(&reply.tokens);
    json_reply(200, &answer(&c, &id, &text, reply.tokens.len()))
}

/// A reply's id.
pub fn reply_id(c: &Checked, req: u64) -> String {
    match c.kind {
        Kind::Completion => format!("cmpl-r{req}"),
        Kind::Chat => format!("chatcmpl-r{req}"),
    }
}

/// The whole answer of `n` tokens reading `text`.
pub fn answer(c: &Checked, id: &str, text: &str, n: usize) -> Value {
    let finish = finish_reason(n, c.job.max_new_tokens);
    let choice = match c.kind {
        Kind::Completion => {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        }
        Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": finish}),
    };
    let object = match c.kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    json!({"id": id, "object": object, "created": unix_now(), "model": c.model,
           "choices": [choice], "usage": usage(c.job.ids.len(), n)})
}

/// The stream of `c`'s answer.
pub fn streamer(c: &Checked, id: String) -> OpenAiStream {
    OpenAiStream {
        id,
        created: unix_now(),
        model: c.model.clone(),
        kind: c.kind,
        prompt: c.job.ids.len(),
        max_new: c.job.max_new_tokens,
        include_usage: c.include_usage,
        n: 0,
    }
}

/// OpenAI's stream: one chunk per token with only the new text.
pub struct OpenAiStream {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt: usize,
    max_new: u32,
    include_usage: bool,
    n: usize,
}

impl OpenAiStream {
    fn chunk(&self, choice: Value) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        let choices = if choice.is_null() {
            json!([])
        } else {
            json!([choice])
        };
        json!({"id": self.id, "object": object, "created": self.created,
               "model": self.model, "choices": choices})
    }

    fn choice(&self, delta: Option<&str>, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Completion => json!({"index": 0, "text": delta.unwrap_or(""),
                                       "logprobs": null, "finish_reason": finish}),
            Kind::Chat => {
                let d = match delta {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
        }
    }
}

impl Streamer for OpenAiStream {
    fn token(&mut self, word: &str, _id: u32, out: &mut Vec<u8>) {
        if self.n == 0 && self.kind == Kind::Chat {
            let first = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null});
            out.extend_from_slice(&event(&self.chunk(first)));
        }
        let delta = if self.n == 0 {
            word.to_string()
        } else {
            format!(" {word}")
        };
        self.n += 1;
        let c = self.choice(Some(&delta), None);
        out.extend_from_slice(&event(&self.chunk(c)));
    }

    fn finish(&mut self, _reply: &Reply, out: &mut Vec<u8>) {
        let c = self.choice(None, Some(finish_reason(self.n, self.max_new)));
        out.extend_from_slice(&event(&self.chunk(c)));
        if self.include_usage {
            let mut u = self.chunk(Value::Null);
            u["usage"] = usage(self.prompt, self.n);
            out.extend_from_slice(&event(&u));
        }
    }

    fn failed(&mut self, status: u16, message: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(&event(&error_body(status, message)));
    }
}
