//! The canary: a concurrent, seeded load of marked requests, judged from outside.
//!
//! `kvsim canary` ([`run`]) speaks to any server with SGLang's `POST /generate` (a
//! real SGLang deployment or `kvsim serve --http`) or the OpenAI API;
//! `kvsim canary-client` ([`run_line`]) to `kvsim serve`'s line endpoint, where a
//! request's marker is the canary token sequence of its id (`kvsim_oracle::canary`).
//! Both draw the same plan ([`Round`]), run it on the same workers ([`run_phase`]) and
//! judge the same two facts: a 200 reply carrying another request's marker (a leak) and
//! an over-length prompt answered 200 (the incident). Only the transport and the
//! report differ.
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
use kvsim_engine::gpu::splitmix64 as mix;
use kvsim_runtime::http_client::{agent, base_addr, fetch, fetch_with, host_port, send_to};
use kvsim_runtime::{Answer, Client};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
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
    /// `max_new_tokens` of every request. Each new token of a reply echoes one prompt
    /// position, spread evenly over the prompt, so more new tokens read more of an
    /// over-length prompt's pages (and make a leak likelier to show in the reply).
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
    /// The markers of other requests the reply carried, each once, in order.
    foreign: Vec<String>,
}

/// The seeded plan of one round: `requests` short prompts, then `over_length` prompts
/// past the server's limit; each request's marker and disconnect point are drawn from
/// the seed and its number, so a seed names the whole load.
struct Round<'a> {
    seed: u64,
    round: u64,
    disconnect_rate: f64,
    /// The prompt length of the `i`-th short (`false`) or over-length (`true`)
    /// request, given its draw.
    tokens: &'a dyn Fn(bool, usize, u64) -> usize,
}

impl Round<'_> {
    /// The next request, number `*n` of the run.
    fn plan(&self, n: &mut usize, over: bool, i: usize) -> Planned {
        let r = mix(self.seed ^ mix(*n as u64 + 1));
        let kind = if over { "long" } else { "short" };
        let p = Planned {
            n: *n,
            marker: format!("CANARY-{kind}{i}r{}-{:08x}", self.round, r as u32),
            over_length: over,
            disconnect_ms: ((mix(r) % 1_000_000) as f64 / 1e6 < self.disconnect_rate)
                .then_some((r >> 40) % 20),
            tokens: (self.tokens)(over, i, r),
        };
        *n += 1;
        p
    }

    /// `short` short requests and `long` over-length ones.
    fn plans(&self, n: &mut usize, short: usize, long: usize) -> (Vec<Planned>, Vec<Planned>) {
        let s = (0..short).map(|i| self.plan(n, false, i)).collect();
        let l = (0..long).map(|i| self.plan(n, true, i)).collect();
        (s, l)
    }
}

fn markers_in(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|w| w.starts_with("CANARY-"))
        .collect()
}

/// The markers in `text` other than `own`, each once.
fn foreign_markers(text: &str, own: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    markers_in(text)
        .into_iter()
        .filter(|m| *m != own && seen.insert(*m))
        .map(str::to_string)
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
        foreign: foreign_markers(&text, &p.marker),
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

/// How a phase's workers connect and send.
struct Transport<'a, C> {
    /// One worker's connection state.
    connect: &'a (dyn Fn() -> C + Sync),
    send: &'a (dyn Fn(&mut C, &Planned) -> Outcome + Sync),
    /// No request starts after this instant (the rest of the phase is not sent).
    until: Option<Instant>,
}

/// Run planned requests on `concurrency` workers, each with its own connection state,
/// reporting the count done to `progress` (when given) every 100 ms.
fn run_phase<C>(
    plans: Vec<Planned>,
    concurrency: usize,
    transport: &Transport<'_, C>,
    progress: Option<&dyn Fn(usize)>,
) -> Vec<Outcome> {
    let count = plans.len();
    let (connect, send, until) = (transport.connect, transport.send, transport.until);
    let queue = Arc::new(Mutex::new(plans.into_iter().rev().collect::<Vec<_>>()));
    let out = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            let (queue, out, done) = (queue.clone(), out.clone(), done.clone());
            s.spawn(move || {
                let mut client = connect();
                loop {
                    if until.is_some_and(|t| Instant::now() >= t) {
                        // Past the deadline: what is left is not sent.
                        let left = queue.lock().map(|mut q| q.drain(..).count()).unwrap_or(0);
                        done.fetch_add(left, Ordering::Relaxed);
                        return;
                    }
                    let next = queue.lock().ok().and_then(|mut q| q.pop());
                    let Some(p) = next else { return };
                    let o = send(&mut client, &p);
                    if let Ok(mut v) = out.lock() {
                        v.push(o);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if let Some(progress) = progress {
            loop {
                let d = done.load(Ordering::Relaxed);
                progress(d);
                if d >= count {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    let mut v = Arc::try_unwrap(out)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    v.sort_by_key(|o| o.plan.n);
    v
}

/// What the server advertises: its context (`/get_model_info`) and, when smaller, its
/// smallest KV pool in tokens: prompts between the two are the incident's (admitted by
/// the context, not held by the pool).
struct Limits {
    context: u64,
    pool: Option<u64>,
}

fn read_limits(url: &str) -> Result<Limits> {
    let info = fetch(url, "GET", "/get_model_info", None, Duration::from_secs(10))
        .with_context(|| format!("{url}/get_model_info"))?;
    let context = serde_json::from_slice::<Value>(&info.body)
        .ok()
        .and_then(|v| v.get("max_context_length").and_then(Value::as_u64))
        .with_context(|| format!("{url}/get_model_info: no max_context_length"))?;
    let pool = smallest_pool(url).filter(|&p| p < context);
    Ok(Limits { context, pool })
}

/// The progress bar on stderr (a terminal only): `d` of `total` done in `round`.
fn show_progress(d: usize, total: usize, round: u64) {
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

/// Every round of the HTTP canary: the short requests, then the over-length ones
/// (alternately one past the context and one past the smallest pool), until
/// `--duration` is spent (one round without it). The outcomes and the wall time.
fn http_rounds(a: &CanaryArgs, target: &Target, limits: &Limits) -> (Vec<Outcome>, f64) {
    let t0 = Instant::now();
    let show = !a.quiet && std::io::stderr().is_terminal();
    let (context, pool) = (limits.context, limits.pool);
    let tokens = |over: bool, i: usize, _: u64| match (over, pool) {
        (false, _) => a.prompt_tokens,
        (true, Some(p)) if i % 2 == 1 => p as usize + 1,
        (true, _) => context as usize + 1,
    };
    let timeout = Duration::from_secs(a.timeout);
    let connect = || agent(timeout);
    let send = |client: &mut ureq::Agent, p: &Planned| {
        one(&a.url, target, client, p, a.max_new_tokens, timeout)
    };
    let transport = Transport {
        connect: &connect,
        send: &send,
        until: None,
    };
    let (mut all, mut n, mut round) = (Vec::new(), 0usize, 0u64);
    loop {
        let plan = Round {
            seed: a.seed,
            round,
            disconnect_rate: a.disconnect_rate,
            tokens: &tokens,
        };
        let (short, long) = plan.plans(&mut n, a.requests, a.over_length);
        let total = a.requests + a.over_length;
        let bar = |d: usize| {
            if show {
                show_progress(d, total, round);
            }
        };
        let s = run_phase(short, a.concurrency, &transport, Some(&bar));
        let done_short = s.len();
        all.extend(s);
        let bar2 = |d: usize| bar(done_short + d);
        all.extend(run_phase(long, a.concurrency, &transport, Some(&bar2)));
        round += 1;
        if !a.duration.is_some_and(|d| t0.elapsed().as_secs_f64() < d) {
            break;
        }
    }
    if show {
        eprintln!();
    }
    (all, t0.elapsed().as_secs_f64())
}

/// What the HTTP canary judged: each line names the requests involved.
struct Findings {
    /// A reply carried another request's marker.
    leaks: Vec<String>,
    /// An over-length prompt (past the context) answered 200: the incident.
    over_ok: Vec<String>,
    /// A prompt past the smallest pool but within the context answered 200 (a warning).
    over_pool: Vec<String>,
}

impl Findings {
    fn judge(all: &[Outcome], limits: &Limits) -> Findings {
        let owner: BTreeMap<&str, &Outcome> =
            all.iter().map(|o| (o.plan.marker.as_str(), o)).collect();
        let mut f = Findings {
            leaks: Vec::new(),
            over_ok: Vec::new(),
            over_pool: Vec::new(),
        };
        for o in all {
            for m in &o.foreign {
                let from = owner
                    .get(m.as_str())
                    .map(|f| describe(f))
                    .unwrap_or(format!("{m} (not sent by this run)"));
                f.leaks.push(format!(
                    "LEAK: reply to {} carried marker {m} of {from}",
                    describe(o)
                ));
            }
            if o.plan.over_length && o.status == 200 {
                if o.plan.tokens as u64 > limits.context {
                    f.over_ok
                        .push(format!("OVER-LENGTH ANSWERED 200: {}", describe(o)));
                } else {
                    f.over_pool.push(format!(
                        "WARNING: a prompt over the smallest pool ({} tokens) answered 200: {}",
                        limits.pool.unwrap_or(0),
                        describe(o)
                    ));
                }
            }
        }
        f
    }

    fn failed(&self) -> bool {
        !self.leaks.is_empty() || !self.over_ok.is_empty()
    }
}

/// The outcomes' counts by status (`disconnected`, `transport-error`, or the HTTP
/// status) and the answered requests' latency percentiles (p50, p90, p99, in ms).
struct Tally {
    counts: BTreeMap<String, usize>,
    answered: usize,
    pct: [f64; 3],
}

impl Tally {
    fn of(all: &[Outcome]) -> Tally {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for o in all {
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
        Tally {
            answered: lat.len(),
            pct: [pct(0.5), pct(0.9), pct(0.99)],
            counts,
        }
    }
}

/// The HTTP canary's report on stdout.
fn print_report(all: &[Outcome], wall: f64, limits: &Limits, t: &Tally, f: &Findings) {
    println!(
        "canary: {} requests ({} over-length) in {wall:.2} s = {:.0} req/s; status {}",
        all.len(),
        all.iter().filter(|o| o.plan.over_length).count(),
        t.answered as f64 / wall.max(1e-9),
        t.counts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "canary: latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        t.pct[0], t.pct[1], t.pct[2]
    );
    if let Some(p) = limits.pool {
        println!(
            "canary: context {} tokens, smallest pool {p} tokens: over-length prompts \
             alternate {} and {} tokens",
            limits.context,
            limits.context + 1,
            p + 1
        );
    }
    for l in f.leaks.iter().chain(&f.over_ok).chain(&f.over_pool) {
        println!("{l}");
    }
    println!(
        "canary: {}",
        if f.failed() {
            format!(
                "FAIL ({} foreign markers, {} over-length prompts answered 200)",
                f.leaks.len(),
                f.over_ok.len()
            )
        } else {
            "PASS (no reply carried another request's marker; every over-length prompt refused)"
                .into()
        }
    );
}

/// `--json`: the report as one JSON object.
fn write_json(
    path: &std::path::Path,
    a: &CanaryArgs,
    (all, wall): (&[Outcome], f64),
    limits: &Limits,
    t: &Tally,
    f: &Findings,
) -> Result<()> {
    let report = json!({
        "url": a.url, "seed": a.seed, "context": limits.context,
        "requests": all.len(), "wall_s": wall,
        "status": t.counts,
        "latency_ms": {"p50": t.pct[0], "p90": t.pct[1], "p99": t.pct[2]},
        "leaks": f.leaks, "over_length_answered_200": f.over_ok,
        "over_pool_answered_200": f.over_pool, "smallest_pool": limits.pool,
        "pass": !f.failed(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("--json {}", path.display()))
}

/// `kvsim canary`: read the server's limits, run the rounds, judge, report. Exit 1 on
/// a leak or an over-length prompt answered 200.
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
    let limits = read_limits(&a.url)?;
    let (all, wall) = http_rounds(a, &target, &limits);
    let findings = Findings::judge(&all, &limits);
    let tally = Tally::of(&all);
    print_report(&all, wall, &limits, &tally, &findings);
    if let Some(path) = &a.json {
        write_json(path, a, (&all, wall), &limits, &tally, &findings)?;
    }
    Ok(if findings.failed() {
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

/// `kvsim canary-client`: the canary against `kvsim serve`'s line endpoint.
#[derive(Args, Debug)]
pub struct LineCanaryArgs {
    /// The client endpoint of a running `kvsim serve`.
    pub addr: SocketAddr,
    /// How long to keep sending.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u64,
    /// Seed of the workload (prompt lengths, over-length prompts, disconnects).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompts longer than this are over-length (the scenario's prefill pool, in
    /// tokens): they must get 400, never 200.
    #[arg(long, default_value_t = 512)]
    pub limit: u64,
}

/// Short requests per round of the line canary, and over-length ones (one in five).
const LINE_SHORT: usize = 64;
const LINE_LONG: usize = 16;
/// Share of the line canary's requests whose client goes away mid-request.
const LINE_DISCONNECTS: f64 = 0.1;

/// What a line canary load saw (printed as `canary: {json}`).
#[derive(Debug, Default, serde::Serialize)]
pub struct CanaryReport {
    pub requests: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub over_length: u64,
    pub over_length_400: u64,
    /// Over-length prompts answered 200: the incident.
    pub over_length_200: u64,
    /// 200 replies carrying another request's marker: a leak.
    pub foreign_marker: u64,
    pub disconnects: u64,
    pub connection_errors: u64,
}

impl CanaryReport {
    fn of(all: &[Outcome]) -> CanaryReport {
        let mut r = CanaryReport::default();
        for o in all {
            match o.status {
                0 => r.disconnects += 1,
                1 => r.connection_errors += 1,
                s => {
                    r.requests += 1;
                    *r.by_status.entry(s).or_default() += 1;
                    if o.plan.over_length {
                        r.over_length += 1;
                        r.over_length_400 += u64::from(s == 400);
                        r.over_length_200 += u64::from(s == 200);
                    }
                    r.foreign_marker += u64::from(s == 200 && !o.foreign.is_empty());
                }
            }
        }
        r
    }
}

/// One request on the line endpoint: a prompt of `p.tokens` tokens, which the server
/// fills with the canary sequence of the request's id, so every token of a reply names
/// the request whose KV it came from. A drawn disconnect sends on a connection of its
/// own and closes it at the drawn point.
fn one_line(addr: SocketAddr, client: &mut Option<Client>, p: &Planned) -> Outcome {
    let t = Instant::now();
    let done = |status: u16, foreign: Vec<String>| Outcome {
        plan: p.clone(),
        status,
        latency: t.elapsed(),
        foreign,
    };
    let max_new = 1 + (p.n % 16) as u32;
    if let Some(ms) = p.disconnect_ms {
        let Ok(mut c) = Client::connect(addr, Duration::from_secs(5)) else {
            return done(1, Vec::new());
        };
        let line = format!(
            "{{\"prompt_len\": {}, \"max_new_tokens\": {max_new}}}",
            p.tokens
        );
        let _ = c.raw_send(&line);
        std::thread::sleep(Duration::from_millis(ms));
        return done(0, Vec::new());
    }
    let c = match client {
        Some(c) => c,
        None => match Client::connect(addr, Duration::from_secs(30)) {
            Ok(c) => client.insert(c),
            Err(_) => {
                // No endpoint (a partition, a restart): back off before the next try.
                std::thread::sleep(Duration::from_millis(50));
                return done(1, Vec::new());
            }
        },
    };
    match c.request(p.tokens as u64, max_new) {
        Ok(Answer::Reply(reply)) => {
            let mut seen = BTreeSet::new();
            let foreign = reply
                .tokens
                .iter()
                .filter_map(|t| kvsim_oracle::canary::owner(*t))
                .filter(|o| o.0 != reply.req && seen.insert(o.0))
                .map(|o| format!("{o}"))
                .collect();
            done(reply.status, foreign)
        }
        Ok(Answer::Error(_)) | Err(_) => {
            *client = None;
            done(1, Vec::new())
        }
    }
}

/// `kvsim canary-client`: rounds of [`LINE_SHORT`] short prompts (drawn lengths up to
/// 16 under `--limit`) and [`LINE_LONG`] over-length ones (1 to 400 tokens past it) on
/// `--concurrency` clients for `--seconds`, a tenth of them disconnecting mid-request.
/// Prints `canary: {json}` ([`CanaryReport`]); exit 1 when a 200 reply carried another
/// request's marker or an over-length prompt was answered 200.
pub fn run_line(a: &LineCanaryArgs) -> Result<ExitCode> {
    if a.limit <= 16 {
        bail!("--limit {}: must be over 16 tokens", a.limit);
    }
    let tokens = |over: bool, _: usize, r: u64| {
        let draw = mix(r ^ 0x5EED);
        if over {
            (a.limit + 1 + draw % 400) as usize
        } else {
            (1 + draw % (a.limit - 16)) as usize
        }
    };
    let connect = || None;
    let send = |client: &mut Option<Client>, p: &Planned| one_line(a.addr, client, p);
    let concurrency = usize::try_from(a.concurrency).unwrap_or(usize::MAX);
    let end = Instant::now() + Duration::from_secs(a.seconds);
    let transport = Transport {
        connect: &connect,
        send: &send,
        until: Some(end),
    };
    let (mut all, mut n, mut round) = (Vec::new(), 0usize, 0u64);
    while Instant::now() < end {
        let plan = Round {
            seed: a.seed,
            round,
            disconnect_rate: LINE_DISCONNECTS,
            tokens: &tokens,
        };
        let (short, long) = plan.plans(&mut n, LINE_SHORT, LINE_LONG);
        all.extend(run_phase(short, concurrency, &transport, None));
        all.extend(run_phase(long, concurrency, &transport, None));
        round += 1;
    }
    let total = CanaryReport::of(&all);
    println!("canary: {}", serde_json::to_string(&total)?);
    Ok(if total.foreign_marker > 0 || total.over_length_200 > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
