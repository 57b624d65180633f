//! SGLang's native `POST /generate` on the router's front: its body checked into a
//! [`Job`] ([`check_generate`], which the worker front shares), submitted, and
//! answered whole or streamed. Not the OpenAI endpoints ([`crate::http::openai`]).

use crate::http::body::{self, field_err, GenerateBody, Ids, Text};
use crate::http::pending::{submit, Job};
use crate::http::response::{error, json_reply, Out};
use crate::http::state::Shared;
use crate::http::stream::{stream_reply, SglangStream};
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use hyper::Response;
use serde_json::{json, Value};

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
pub(super) async fn generate<K: Send + 'static>(sh: &Arc<Shared<K>>, body: &[u8]) -> Response<Out> {
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
