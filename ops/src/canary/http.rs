//! `kvsim canary` over HTTP: SGLang's `POST /generate` or the OpenAI API's
//! `/v1/completions`, one request per planned canary, rounds until `--duration` is
//! spent, then the verdict ([`super::report`]). The line endpoint's canary is
//! [`super::line`]'s.

use crate::canary::args::{Api, CanaryArgs};
use crate::canary::limits::{read_limits, Limits};
use crate::canary::phase::{run_phase, Transport};
use crate::canary::plan::{foreign_markers, Outcome, Planned, Round};
use crate::canary::report::{print_report, write_json, Findings, Tally};
use anyhow::{bail, Context, Result};
use kvsim_runtime::http_client::{agent, base_addr, fetch, fetch_with, host_port, send_to};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
