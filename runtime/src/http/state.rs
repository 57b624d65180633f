//! What the router's front keeps and its handlers share ([`Shared`]): the router's
//! loop, the request ids, the tokenizer, recent prompts (to read canary replies as
//! words), the front's own counters, and the checks and renderings every endpoint
//! does alike. Not the endpoints themselves.

use crate::client::StatusFn;
use crate::http::body::{self, field_err};
use crate::http::info::FrontInfo;
use crate::http::limits::{FrontLimits, MAX_PROMPT_TOKENS};
use crate::http::response::Out;
use crate::node::event::NodeEvent;
use crate::node::reply::Reply;
use crate::node::status::NodeStatus;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::mpsc::Sender;
use crate::sync::{Arc, Mutex};
use crate::tokenizer::Vocab;
use hyper::Response;
use std::collections::{BTreeMap, VecDeque};

/// Positions of a prompt the front remembers (the canary token keeps 16 bits).
const KEPT_POSITIONS: usize = 1 << 16;
/// Most remembered tokens over all requests (the oldest requests are forgotten).
const KEPT_TOKENS: usize = 1 << 23;

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
pub(super) struct Prompts {
    by_req: BTreeMap<u64, Vec<u32>>,
    order: VecDeque<u64>,
    tokens: usize,
}

impl Prompts {
    pub(super) fn keep(&mut self, req: u64, ids: &[u32]) {
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
    pub(super) router: Sender<NodeEvent<K>>,
    pub(super) status: StatusFn,
    pub(super) nodes: NodesFn,
    pub(super) next: Arc<AtomicU64>,
    pub info: FrontInfo,
    pub(super) vocab: Mutex<Vocab>,
    pub(super) prompts: Mutex<Prompts>,
    pub counters: FrontCounters,
    pub(super) limits: FrontLimits,
    /// Canary prompts (the front keeps each prompt's words to read replies with).
    pub(super) canary: bool,
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
