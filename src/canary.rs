//! `kvsim canary`: a concurrent canary-marker load against any server with SGLang's
//! `POST /generate` (a real SGLang deployment or `kvsim serve --http`).
//!
//! Every request carries a unique marker `CANARY-<kind><n>-<8 hex>` (drawn from
//! `--seed`). Phase 1 sends the short requests, whose prompts are the marker repeated,
//! so whatever KV they leave in freed pages reads as their marker. Phase 2 sends
//! `--over-length` prompts one token past the server's advertised context (read from
//! `/get_model_info`): their marker, then `x` words. Every reply is searched for markers
//! of other requests. Some clients disconnect mid-request at seeded points
//! (`--disconnect-rate`). Exit 1 when a reply carries a foreign marker (both requests
//! are printed) or an over-length prompt is answered 200; 2 when the server cannot be
//! read.

use anyhow::{bail, Context, Result};
use clap::Args;
use kvsim_runtime::http_client::{agent, base_addr, fetch, fetch_with, host_port, send_to};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct CanaryArgs {
    /// The server's base URL (`http://HOST:PORT`).
    #[arg(long)]
    pub url: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Short marked requests per round.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Over-length prompts per round (sent after the short ones).
    #[arg(long, default_value_t = 4)]
    pub over_length: usize,
    /// Share of requests whose client disconnects before the reply (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub disconnect_rate: f64,
    /// Seed of the markers and the disconnect points.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep running rounds for this many seconds (one round without it).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Tokens of a short prompt.
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// `max_new_tokens` of every request.
    #[arg(long, default_value_t = 8)]
    pub max_new_tokens: u32,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Seconds to wait for one reply.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Which API to send through: SGLang's `/generate` or the OpenAI API's
    /// `/v1/completions` (the model is the first of `/v1/models`).
    #[arg(long, value_enum, default_value_t = Api::Sglang)]
    pub api: Api,
}

/// The API a canary speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    Sglang,
    Openai,
}

/// Where a canary sends, and how its body and reply look.
#[derive(Clone, Debug)]
struct Target {
    api: Api,
    /// The model (OpenAI API).
    model: String,
}

impl Target {
    fn path(&self) -> &'static str {
        match self.api {
            Api::Sglang => "/generate",
            Api::Openai => "/v1/completions",
        }
    }

    fn body(&self, text: String, max_new: u32) -> Vec<u8> {
        match self.api {
            Api::Sglang => json!({"text": text, "sampling_params": {"max_new_tokens": max_new}}),
            Api::Openai => json!({"model": self.model, "prompt": text, "max_tokens": max_new}),
        }
        .to_string()
        .into_bytes()
    }

    /// A reply's text (the whole body when it has none: an error's text is searched too).
    fn text(&self, body: &[u8]) -> Option<String> {
        let v = serde_json::from_slice::<Value>(body).ok()?;
        let t = match self.api {
            Api::Sglang => v.get("text"),
            Api::Openai => v.pointer("/choices/0/text"),
        };
        t.and_then(Value::as_str).map(str::to_string)
    }
}

/// splitmix64: the seeded draws (markers, disconnects).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One planned request.
#[derive(Clone, Debug)]
struct Planned {
    n: usize,
    marker: String,
    over_length: bool,
    /// Disconnect after this many milliseconds instead of reading the reply.
    disconnect_ms: Option<u64>,
    tokens: usize,
}

/// What happened to one request.
#[derive(Clone, Debug)]
struct Outcome {
    plan: Planned,
    /// 0: disconnected on purpose; 1: transport error.
    status: u16,
    latency: Duration,
    text: String,
}

fn markers_in(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|w| w.starts_with("CANARY-"))
        .collect()
}

fn prompt_text(p: &Planned) -> String {
    let mut text = String::with_capacity(p.tokens * 2 + p.marker.len());
    text.push_str(&p.marker);
    let filler = if p.over_length {
        " x".to_string()
    } else {
        format!(" {}", p.marker)
    };
    for _ in 1..p.tokens {
        text.push_str(&filler);
    }
    text
}

fn one(
    url: &str,
    target: &Target,
    client: &ureq::Agent,
    p: &Planned,
    max_new: u32,
    timeout: Duration,
) -> Outcome {
    let t = Instant::now();
    let done = |status: u16, text: String| Outcome {
        plan: p.clone(),
        status,
        latency: t.elapsed(),
        text,
    };
    let body = target.body(prompt_text(p), max_new);
    if let Some(ms) = p.disconnect_ms {
        // Send on a connection of its own, then close it at the drawn point.
        let (Ok(addr), Ok((host, port))) = (base_addr(url), host_port(url)) else {
            return done(1, "bad url".into());
        };
        let host = format!("{host}:{port}");
        match send_to(addr, &host, "POST", target.path(), Some(&body), timeout) {
            Ok(stream) => {
                std::thread::sleep(Duration::from_millis(ms));
                drop(stream);
                return done(0, String::new());
            }
            Err(e) => return done(1, e.to_string()),
        }
    }
    match fetch_with(client, url, "POST", target.path(), Some(&body)) {
        Ok(r) => {
            let text = target.text(&r.body).unwrap_or_else(|| r.text());
            done(r.status, text)
        }
        Err(e) => done(1, e.to_string()),
    }
}

/// Run planned requests on `concurrency` threads.
fn run_phase(
    url: &str,
    target: &Target,
    plans: Vec<Planned>,
    a: &CanaryArgs,
    progress: &dyn Fn(usize),
) -> Vec<Outcome> {
    let count = plans.len();
    let queue = Arc::new(Mutex::new(plans.into_iter().rev().collect::<Vec<_>>()));
    let out = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..a.concurrency.max(1) {
            let (queue, out, done) = (queue.clone(), out.clone(), done.clone());
            s.spawn(move || {
                let client = agent(Duration::from_secs(a.timeout));
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop());
                    let Some(p) = next else { return };
                    let timeout = Duration::from_secs(a.timeout);
                    let o = one(url, target, &client, &p, a.max_new_tokens, timeout);
                    if let Ok(mut v) = out.lock() {
                        v.push(o);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        loop {
            let d = done.load(Ordering::Relaxed);
            progress(d);
            if d >= count {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut v = Arc::try_unwrap(out)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    v.sort_by_key(|o| o.plan.n);
    v
}

pub fn run(a: &CanaryArgs) -> Result<ExitCode> {
    if !(0.0..=1.0).contains(&a.disconnect_rate) {
        bail!("--disconnect-rate: {} is not in 0..1", a.disconnect_rate);
    }
    if a.prompt_tokens == 0 || a.max_new_tokens == 0 {
        bail!("--prompt-tokens and --max-new-tokens must be at least 1");
    }
    let target = Target {
        api: a.api,
        model: match a.api {
            Api::Sglang => String::new(),
            Api::Openai => openai_model(&a.url)?,
        },
    };
    let info = fetch(
        &a.url,
        "GET",
        "/get_model_info",
        None,
        Duration::from_secs(10),
    )
    .with_context(|| format!("{}/get_model_info", a.url))?;
    let context = serde_json::from_slice::<Value>(&info.body)
        .ok()
        .and_then(|v| v.get("max_context_length").and_then(Value::as_u64))
        .with_context(|| format!("{}/get_model_info: no max_context_length", a.url))?;
    // The smallest KV pool the server reports (SGLang's metric), when it is smaller than
    // the context: prompts between the two are the incident's (admitted by the context,
    // not held by the pool).
    let pool = smallest_pool(&a.url).filter(|&p| p < context);
    let t0 = Instant::now();
    let show = !a.quiet && std::io::stderr().is_terminal();
    let mut all: Vec<Outcome> = Vec::new();
    let mut n = 0usize;
    let mut round = 0u64;
    loop {
        let mut plan = |over: bool, i: usize| {
            let r = mix(a.seed ^ mix(n as u64 + 1));
            let kind = if over { "long" } else { "short" };
            let p = Planned {
                n,
                marker: format!("CANARY-{kind}{i}r{round}-{:08x}", r as u32),
                over_length: over,
                disconnect_ms: ((mix(r) % 1_000_000) as f64 / 1e6 < a.disconnect_rate)
                    .then_some((r >> 40) % 20),
                tokens: match (over, pool) {
                    (false, _) => a.prompt_tokens,
                    (true, Some(p)) if i % 2 == 1 => p as usize + 1,
                    (true, _) => context as usize + 1,
                },
            };
            n += 1;
            p
        };
        let short: Vec<Planned> = (0..a.requests).map(|i| plan(false, i)).collect();
        let long: Vec<Planned> = (0..a.over_length).map(|i| plan(true, i)).collect();
        let total = a.requests + a.over_length;
        let bar = |d: usize| {
            if show {
                let w = 30 * d / total.max(1);
                eprint!(
                    "\r[{}{}] {}/{} round {round}",
                    "#".repeat(w),
                    ".".repeat(30 - w),
                    d,
                    total
                );
                let _ = std::io::stderr().flush();
            }
        };
        let s = run_phase(&a.url, &target, short, a, &bar);
        let done_short = s.len();
        all.extend(s);
        let bar2 = |d: usize| bar(done_short + d);
        all.extend(run_phase(&a.url, &target, long, a, &bar2));
        round += 1;
        let more = a.duration.is_some_and(|d| t0.elapsed().as_secs_f64() < d);
        if !more {
            break;
        }
    }
    if show {
        eprintln!();
    }
    let wall = t0.elapsed().as_secs_f64();
    // Judge.
    let owner: BTreeMap<&str, &Outcome> = all.iter().map(|o| (o.plan.marker.as_str(), o)).collect();
    let mut leaks = Vec::new();
    let mut over_ok = Vec::new();
    let mut over_pool = Vec::new();
    for o in &all {
        let mut seen = std::collections::BTreeSet::new();
        for m in markers_in(&o.text) {
            if m != o.plan.marker && seen.insert(m) {
                let from = owner
                    .get(m)
                    .map(|f| describe(f))
                    .unwrap_or(format!("{m} (not sent by this run)"));
                leaks.push(format!(
                    "LEAK: reply to {} carried marker {m} of {from}",
                    describe(o)
                ));
            }
        }
        if o.plan.over_length && o.status == 200 {
            if o.plan.tokens as u64 > context {
                over_ok.push(format!("OVER-LENGTH ANSWERED 200: {}", describe(o)));
            } else {
                over_pool.push(format!(
                    "WARNING: a prompt over the smallest pool ({} tokens) answered 200: {}",
                    pool.unwrap_or(0),
                    describe(o)
                ));
            }
        }
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in &all {
        let k = match o.status {
            0 => "disconnected".to_string(),
            1 => "transport-error".to_string(),
            s => s.to_string(),
        };
        *counts.entry(k).or_default() += 1;
    }
    let mut lat: Vec<f64> = all
        .iter()
        .filter(|o| o.status >= 100)
        .map(|o| o.latency.as_secs_f64() * 1e3)
        .collect();
    lat.sort_by(|x, y| x.total_cmp(y));
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() as f64 - 1.0) * p).round() as usize]
        }
    };
    let answered = lat.len();
    println!(
        "canary: {} requests ({} over-length) in {wall:.2} s = {:.0} req/s; status {}",
        all.len(),
        all.iter().filter(|o| o.plan.over_length).count(),
        answered as f64 / wall.max(1e-9),
        counts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "canary: latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        pct(0.5),
        pct(0.9),
        pct(0.99)
    );
    if let Some(p) = pool {
        println!(
            "canary: context {context} tokens, smallest pool {p} tokens: over-length prompts \
             alternate {} and {} tokens",
            context + 1,
            p + 1
        );
    }
    for l in leaks.iter().chain(&over_ok).chain(&over_pool) {
        println!("{l}");
    }
    let failed = !leaks.is_empty() || !over_ok.is_empty();
    println!(
        "canary: {}",
        if failed {
            format!(
                "FAIL ({} foreign markers, {} over-length prompts answered 200)",
                leaks.len(),
                over_ok.len()
            )
        } else {
            "PASS (no reply carried another request's marker; every over-length prompt refused)"
                .into()
        }
    );
    if let Some(path) = &a.json {
        let report = json!({
            "url": a.url, "seed": a.seed, "context": context,
            "requests": all.len(), "wall_s": wall,
            "status": counts,
            "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
            "leaks": leaks, "over_length_answered_200": over_ok,
            "over_pool_answered_200": over_pool, "smallest_pool": pool,
            "pass": !failed,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("--json {}", path.display()))?;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The smallest KV pool (SGLang's `sglang:max_total_num_tokens`) the server reports; a
/// router that does not pass `/metrics` on (SGLang's) is asked for its workers
/// (`GET /workers`), and each worker for its own.
fn smallest_pool(url: &str) -> Option<u64> {
    let pools = |u: &str| {
        fetch(u, "GET", "/metrics", None, Duration::from_secs(10))
            .ok()
            .filter(|r| r.status == 200)
            .map(|r| crate::preflight::pool_metrics(&r.text()))
            .filter(|p| !p.is_empty())
    };
    if let Some(p) = pools(url) {
        return p.into_iter().map(|(_, v)| v).min();
    }
    crate::preflight::router_workers(url)
        .ok()?
        .iter()
        .filter_map(|w| pools(w))
        .flatten()
        .map(|(_, v)| v)
        .min()
}

/// The first model of an OpenAI API's `/v1/models`.
fn openai_model(url: &str) -> Result<String> {
    let r = fetch(url, "GET", "/v1/models", None, Duration::from_secs(10))
        .with_context(|| format!("{url}/v1/models"))?;
    serde_json::from_slice::<Value>(&r.body)
        .ok()
        .and_then(|v| {
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .with_context(|| format!("{url}/v1/models: no model (status {})", r.status))
}

fn describe(o: &Outcome) -> String {
    format!(
        "request #{} ({}, {} tokens, marker {}, status {})",
        o.plan.n,
        if o.plan.over_length {
            "over-length"
        } else {
            "short"
        },
        o.plan.tokens,
        o.plan.marker,
        o.status
    )
}
