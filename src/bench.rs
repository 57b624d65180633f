//! `kvsim bench-client`, `bench-http` and `bench-transfer`: load generators for a
//! running `kvsim serve`'s client endpoint and HTTP front, and the transfer path's
//! throughput against a plain TCP copy. They drive a server from outside and are no
//! part of it (its code is `serve/`); their public paths stay `kvsim::serve::*`.

use anyhow::{Context, Result};
use clap::Args;
use kvsim_runtime::{Answer, Client};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The client endpoint of a running `kvsim serve`.
    pub addr: SocketAddr,
    /// Requests per connection.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent connections (one request at a time each).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 16)]
    pub prompt_len: u64,
    #[arg(long, default_value_t = 4)]
    pub max_new_tokens: u32,
}

/// Requests/s and latency percentiles of the endpoint at one concurrency.
pub fn bench(a: &BenchArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    let workers: Vec<_> = (0..a.concurrency)
        .map(|_| {
            let (addr, n, pl, mt) = (a.addr, a.requests, a.prompt_len, a.max_new_tokens);
            std::thread::spawn(move || -> Result<(Vec<Duration>, BTreeMap<u16, usize>)> {
                let mut c = Client::connect(addr, Duration::from_secs(30))?;
                let mut lat = Vec::with_capacity(n);
                let mut not_ok = BTreeMap::new();
                for _ in 0..n {
                    let t = Instant::now();
                    match c.request(pl, mt)? {
                        Answer::Reply(r) if r.status == 200 => {}
                        Answer::Reply(r) => *not_ok.entry(r.status).or_default() += 1,
                        Answer::Error(_) => *not_ok.entry(0).or_default() += 1,
                    }
                    lat.push(t.elapsed());
                }
                Ok((lat, not_ok))
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for w in workers {
        let (lat, bad) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        all.extend(lat);
        for (s, n) in bad {
            *counts.entry(s).or_default() += n;
        }
    }
    // Status 0 stands for a line the server refused.
    let not_ok: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    let wall = t0.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3;
    println!(
        "concurrency {}: {} requests in {:.2} s = {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, not 200: [{}]",
        a.concurrency,
        all.len(),
        wall,
        all.len() as f64 / wall,
        pct(0.5),
        pct(0.99),
        not_ok.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct BenchHttpArgs {
    /// The base URL (`http://HOST:PORT`).
    pub url: String,
    /// Requests per connection.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent connections (kept alive; one request at a time each).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 16)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 4)]
    pub max_new_tokens: u32,
    /// Stream (SSE) and measure the time to the first event.
    #[arg(long)]
    pub stream: bool,
    /// The load generator's client: `raw` (its own minimal HTTP/1.1, about as cheap as
    /// the line endpoint's client) or `ureq` (the operator tools' client, several times
    /// the CPU per request, which on shared cores is taken from the server).
    #[arg(long, value_enum, default_value_t = BenchClient::Raw)]
    pub client: BenchClient,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchClient {
    Raw,
    Ureq,
}

/// One HTTP request: (latency, time to first byte of the body, status).
fn http_once(a: &ureq::Agent, url: &str, body: &str) -> Result<(Duration, Duration, u16)> {
    use std::io::Read;
    let t = Instant::now();
    let mut resp = a
        .post(url)
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .with_context(|| url.to_string())?;
    let status = resp.status().as_u16();
    let mut r = resp.body_mut().as_reader();
    let mut buf = [0u8; 4096];
    let mut first = None;
    loop {
        let n = r.read(&mut buf).with_context(|| url.to_string())?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| t.elapsed());
    }
    let total = t.elapsed();
    Ok((total, first.unwrap_or(total), status))
}

/// One load connection of `bench-http`: `--requests` requests, one at a time, through
/// `--client`: (latency, time to first byte, status) each.
fn bench_connection(
    a: &BenchHttpArgs,
    url: &str,
    body: &str,
    host: &str,
    raw: &[u8],
) -> Result<Vec<(Duration, Duration, u16)>> {
    match a.client {
        BenchClient::Ureq => {
            let agent = kvsim_runtime::http_client::agent(Duration::from_secs(30));
            (0..a.requests)
                .map(|_| http_once(&agent, url, body))
                .collect()
        }
        // The load generator's own client, deliberately: about as cheap per request as
        // the line endpoint's client (`src/raw_http.rs`).
        BenchClient::Raw => {
            let mut c = crate::raw_http::RawClient::connect(host)?;
            (0..a.requests).map(|_| c.send(raw)).collect()
        }
    }
}

/// Requests/s, latency percentiles and time to first byte (the first token's event
/// when streaming) of an HTTP `/generate` at one concurrency.
pub fn bench_http(a: &BenchHttpArgs) -> Result<ExitCode> {
    let url = format!("{}/generate", a.url.trim_end_matches('/'));
    let prompt = vec!["x"; a.prompt_len.max(1)].join(" ");
    let body = serde_json::json!({"text": prompt, "stream": a.stream,
        "sampling_params": {"max_new_tokens": a.max_new_tokens}})
    .to_string();
    let host = a
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let raw = crate::raw_http::post_request(&host, "/generate", &body);
    let t0 = Instant::now();
    let results: Vec<Result<Vec<(Duration, Duration, u16)>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..a.concurrency.max(1))
            .map(|_| {
                let (url, body, host, raw) = (&url, &body, &host, &raw);
                s.spawn(move || bench_connection(a, url, body, host, raw))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for (_, _, s) in all.iter().filter(|(_, _, s)| *s != 200) {
        *counts.entry(*s).or_default() += 1;
    }
    let not_ok: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    let mut lat: Vec<Duration> = all.iter().map(|x| x.0).collect();
    let mut first: Vec<Duration> = all.iter().map(|x| x.1).collect();
    lat.sort();
    first.sort();
    let pct = |v: &[Duration], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "concurrency {}: {} requests in {wall:.2} s = {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, \
         first byte p50 {:.2} ms p99 {:.2} ms, not 200: [{}]",
        a.concurrency,
        all.len(),
        all.len() as f64 / wall,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&first, 0.5),
        pct(&first, 0.99),
        not_ok.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct BenchTransferArgs {
    /// Tokens per page.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub page_size: u32,
    /// Pages per KV write.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub chunk: u32,
    /// Writes to land.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub writes: u32,
    /// Runs of each, alternating; the summary is the median ratio.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Also land the same writes over NIXL (UCX over loopback TCP, two agents in this
    /// process; a build with `--features nixl`, `LD_LIBRARY_PATH` at the nixl-cu12
    /// wheel's libraries; `KVSIM_NIXL_PTHR_DELAY_US` sets the receiver's progress
    /// thread delay, 100 by default; the writer's progress thread is off).
    #[arg(long)]
    pub nixl: bool,
}

/// The NIXL path's timing, when this build has it.
fn nixl_path(asked: bool) -> Result<Option<kvsim_runtime::bench::OtherPath>> {
    if !asked {
        return Ok(None);
    }
    #[cfg(feature = "nixl")]
    {
        kvsim_runtime::nixl::available().map_err(anyhow::Error::msg)?;
        kvsim_runtime::nixl::prepare_env();
        Ok(Some(kvsim_runtime::nixl::bench::time_nixl))
    }
    #[cfg(not(feature = "nixl"))]
    anyhow::bail!("--nixl: this build has no NIXL (build with `--features nixl`)")
}

/// The transfer path's GB/s against a plain TCP copy of the same bytes, run by run,
/// then the median ratio.
pub fn bench_transfer(a: &BenchTransferArgs) -> Result<ExitCode> {
    let other = nixl_path(a.nixl)?;
    let sizes = (a.chunk, a.writes, a.repeat);
    let runs = kvsim_runtime::bench::bench_transfer_with(a.page_size, sizes, other)?;
    let mut ratios = Vec::with_capacity(runs.len());
    let mut nixl = Vec::new();
    for (i, f) in runs.iter().enumerate() {
        let ratio = f.landed_bytes_per_s / f.tcp_bytes_per_s;
        let over_nixl = f.nixl_bytes_per_s.map(|n| {
            nixl.push(n / f.tcp_bytes_per_s);
            format!(
                ", NIXL {:.3} GB/s (ratio {:.3})",
                n / 1e9,
                n / f.tcp_bytes_per_s
            )
        });
        println!(
            "run {}/{}: {:.1} MB of host KV: transfer path {:.3} GB/s landed, plain TCP copy {:.3} GB/s, ratio {:.3}{}",
            i + 1,
            runs.len(),
            f.kv_bytes as f64 / 1e6,
            f.landed_bytes_per_s / 1e9,
            f.tcp_bytes_per_s / 1e9,
            ratio,
            over_nixl.unwrap_or_default()
        );
        ratios.push(ratio);
    }
    if !nixl.is_empty() {
        nixl.sort_by(f64::total_cmp);
        println!(
            "NIXL / plain TCP copy, run by run: median {:.3}, lowest {:.3}, highest {:.3}",
            nixl[nixl.len() / 2],
            nixl[0],
            nixl[nixl.len() - 1]
        );
    }
    ratios.sort_by(f64::total_cmp);
    let best = |f: fn(&kvsim_runtime::bench::TransferFigures) -> f64| {
        runs.iter().map(f).fold(0.0, f64::max)
    };
    println!(
        "page size {}, chunk {}: transfer path / plain TCP copy, run by run: median {:.3}, lowest {:.3}, highest {:.3}; best run / best run {:.3}",
        a.page_size,
        a.chunk,
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        best(|f| f.landed_bytes_per_s) / best(|f| f.tcp_bytes_per_s)
    );
    Ok(ExitCode::SUCCESS)
}
