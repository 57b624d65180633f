//! The halves a worker's request body asks for ([`check_halves`]): SGLang's
//! `/generate` (single or the batch form) or the OpenAI API's bodies, each with the
//! router's pairing fields, checked before anything reaches the node. Not running
//! them.

use crate::http::body::{self, GenerateBody};
use crate::http::generate::check_generate;
use crate::http::openai;
use crate::http::pending::Job;
use crate::worker::state::Worker;

/// The checked `/generate` of a half.
pub(super) struct Half {
    pub(super) job: Job,
    /// The OpenAI API's request (`None`: SGLang's `/generate`).
    pub(super) openai: Option<openai::Checked>,
    pub(super) room: u64,
    /// `bootstrap_host:bootstrap_port`, as sent.
    pub(super) bootstrap: String,
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
pub(super) fn check_halves<K>(
    w: &Worker<K>,
    path: &str,
    body: &[u8],
) -> Result<(Vec<Half>, bool), String> {
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
        let c = check_openai(w, path, body)?;
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

/// An OpenAI API body (`/v1/completions` or `/v1/chat/completions`), checked.
pub(super) fn check_openai<K>(
    w: &Worker<K>,
    path: &str,
    b: &[u8],
) -> Result<openai::Checked, String> {
    let limit = w.p.info.max_new_tokens_limit;
    let tokenize = |_: &str, t: &str| -> Result<Vec<u32>, String> {
        Ok(w.vocab
            .lock()
            .map_err(|_| "tokenizer unavailable")?
            .encode(t))
    };
    let max_new = |name: &str, v: Option<body::Int>| max_new_tokens(limit, name, v);
    let checks = openai::Checks {
        tokenize: &tokenize,
        max_new: &max_new,
        default_max: limit.min(128),
        model: &w.p.info.model_path,
    };
    openai::check(path, b, &checks)
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
