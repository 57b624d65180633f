//! `kvsim canary-client`: the canary against `kvsim serve`'s line endpoint, where a
//! request's marker is the canary token sequence of its id, and its JSON report
//! ([`CanaryReport`]). The HTTP canary is [`super::http`]'s.

use crate::canary::phase::{run_phase, Transport};
use crate::canary::plan::{Outcome, Planned, Round};
use anyhow::{bail, Result};
use clap::Args;
use kvsim_engine::gpu::splitmix64 as mix;
use kvsim_runtime::{Answer, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
