//! A streamed answer: each token once, in order, rendered by a [`Streamer`] (SGLang's
//! events, [`SglangStream`]; OpenAI's chunks are [`crate::http::openai`]'s) as an SSE
//! body. Not the request's submission ([`crate::http::pending`]).

use crate::http::pending::{EventBody, Pending};
use crate::http::response::{error_body, event, sse, Out};
use crate::http::state::Shared;
use crate::node::reply::{Reply, ReplyEv};
use crate::sync::Arc;
use hyper::body::Bytes;
use hyper::Response;
use serde_json::{json, Value};

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
            ReplyEv::Params { .. } => return Bytes::new(),
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
