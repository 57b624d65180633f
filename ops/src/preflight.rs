//! `kvsim preflight`: the incident write-ups' four gate conditions for a disaggregated
//! deployment, read from running servers (SGLang's or `kvsim serve`'s HTTP front), from
//! numbers given by hand, or from a scenario before it is ever started.
//!
//! 1. `pool>=context`: every prefill and decode node's KV pool (tokens) holds the
//!    advertised context (`sglang:max_total_num_tokens` against
//!    `/get_model_info`'s `max_context_length`);
//! 2. `deferred-release`: deferred KV release on, on both roles;
//! 3. `transfer-batch`: transfer batches bounded (`mooncake_transfer_batch_max` <=
//!    `--batch-max`, 64 by default);
//! 4. `kv-checksum`: `disaggregation_enable_kv_checksum` on at decode.
//!
//! Exit 0 when every condition passes, 1 when one fails, 2 when a server is
//! unreachable or its answer lacks a number or is malformed (the line names which).

use anyhow::{bail, Context, Result};
use clap::Args;
use kvsim_runtime::http_client::fetch;
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct PreflightArgs {
    /// A running server's base URL (one per prefill/decode node, or the router's).
    #[arg(long, value_name = "URL")]
    pub url: Vec<String>,
    /// An SGLang router's base URL: its workers (`GET /workers`) are each checked.
    #[arg(long, value_name = "URL")]
    pub router: Vec<String>,
    /// Check a pool size (tokens) given by hand; needs --context.
    #[arg(long, value_name = "N", requires = "context")]
    pub pool: Option<u64>,
    /// The context length for --pool.
    #[arg(long, value_name = "N", requires = "pool")]
    pub context: Option<u64>,
    /// Check a scenario's configuration (every node), without starting anything.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// The largest transfer batch (pages) that counts as bounded.
    #[arg(long, default_value_t = 64)]
    pub batch_max: u64,
    /// Seconds to wait for each server.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

/// One node's numbers, wherever they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    /// `prefill`, `decode` or another mode string.
    pub mode: String,
    pub pool: u64,
    pub context: u64,
    pub deferred_release: Option<bool>,
    pub batch_max: Option<u64>,
    pub kv_checksum: Option<bool>,
}

/// One PASS/FAIL line.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub pass: bool,
    pub line: String,
}

/// The four conditions over some nodes.
pub fn judge(nodes: &[NodeFacts], batch_bound: u64) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut push = |pass: bool, line: String| {
        out.push(Verdict {
            pass,
            line: format!("{} {line}", if pass { "PASS" } else { "FAIL" }),
        })
    };
    for n in nodes {
        let ok = n.pool >= n.context;
        push(
            ok,
            format!(
                "pool>=context    {} ({}): pool {} {} context {}",
                n.name,
                n.mode,
                n.pool,
                if ok { ">=" } else { "<" },
                n.context
            ),
        );
    }
    for n in nodes {
        if n.mode == "prefill" || n.mode == "decode" {
            let on = n.deferred_release == Some(true);
            push(
                on,
                format!(
                    "deferred-release {} ({}): deferred_release {} (want on)",
                    n.name,
                    n.mode,
                    onoff(n.deferred_release)
                ),
            );
        }
    }
    for n in nodes {
        let b = n.batch_max;
        let ok = b.is_some_and(|b| b >= 1 && b <= batch_bound);
        push(
            ok,
            format!(
                "transfer-batch   {} ({}): mooncake_transfer_batch_max {} {} bound {batch_bound}",
                n.name,
                n.mode,
                b.map(|b| b.to_string())
                    .unwrap_or("unset (unbounded)".into()),
                if ok { "<=" } else { ">" }
            ),
        );
    }
    for n in nodes.iter().filter(|n| n.mode == "decode") {
        let on = n.kv_checksum == Some(true);
        push(
            on,
            format!(
                "kv-checksum      {} ({}): disaggregation_enable_kv_checksum {} (want on)",
                n.name,
                n.mode,
                onoff(n.kv_checksum)
            ),
        );
    }
    out
}

fn onoff(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "unset",
    }
}

/// A flag's value in a server-info object: a bool, or a number (0 = off).
fn flag(o: &Value, key: &str) -> Option<bool> {
    match o.get(key)? {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => Some(n.as_f64() != Some(0.0)),
        Value::String(s) => Some(matches!(s.as_str(), "true" | "1" | "on")),
        _ => None,
    }
}

/// The values of `sglang:max_total_num_tokens` in a Prometheus text, with labels.
pub fn pool_metrics(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter(|l| l.starts_with("sglang:max_total_num_tokens"))
        .filter_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            let v = v.trim().parse::<f64>().ok()?;
            let labels = name
                .strip_prefix("sglang:max_total_num_tokens")
                .unwrap_or("")
                .to_string();
            Some((labels, v as u64))
        })
        .collect()
}

fn label(labels: &str, key: &str) -> Option<String> {
    let i = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let rest = &labels[i..];
    Some(rest[..rest.find('"')?].to_string())
}

/// The workers an SGLang router lists (`GET /workers`: each one's `url`).
pub fn router_workers(url: &str) -> Result<Vec<String>> {
    let r = fetch(url, "GET", "/workers", None, Duration::from_secs(10))?;
    if r.status != 200 {
        bail!("{url}/workers: status {}", r.status);
    }
    let v: Value = serde_json::from_slice(&r.body)
        .with_context(|| format!("{url}/workers: malformed JSON"))?;
    let list = v["workers"]
        .as_array()
        .with_context(|| format!("{url}/workers: no workers list"))?;
    Ok(list
        .iter()
        .filter_map(|w| w["url"].as_str().map(str::to_string))
        .collect())
}

/// Read one server's nodes. `Err` is a reason for exit 2.
pub fn read_server(url: &str, timeout: Duration) -> Result<Vec<NodeFacts>> {
    let get = |path: &str| -> Result<String> {
        let r = fetch(url, "GET", path, None, timeout)?;
        if r.status != 200 {
            bail!("{url}{path}: status {}", r.status);
        }
        Ok(r.text())
    };
    let json = |path: &str| -> Result<Value> {
        serde_json::from_str(&get(path)?).with_context(|| format!("{url}{path}: malformed JSON"))
    };
    let model = json("/get_model_info")?;
    let context = model
        .get("max_context_length")
        .and_then(Value::as_u64)
        .with_context(|| format!("{url}/get_model_info: no max_context_length"))?;
    let info = json("/get_server_info")?;
    let pools = pool_metrics(&get("/metrics")?);
    if pools.is_empty() {
        bail!("{url}/metrics: no sglang:max_total_num_tokens metric");
    }
    match info.get("nodes").and_then(Value::as_array) {
        // kvsim serve's router: one entry per node, pools per node in the metric.
        Some(nodes) => nodes
            .iter()
            .map(|n| node_of_kvsim(url, n, &pools, context))
            .collect(),
        // One SGLang server: one pool.
        None => {
            let pool = pools.iter().map(|(_, v)| *v).min().unwrap_or(0);
            let (name, mode) = (url.to_string(), mode_of(&info));
            Ok(vec![facts_of(&info, name, mode, pool, context)])
        }
    }
}

/// A server-info object's `disaggregation_mode` (`null` when absent).
fn mode_of(o: &Value) -> String {
    o.get("disaggregation_mode")
        .and_then(Value::as_str)
        .unwrap_or("null")
        .to_string()
}

/// One node's facts from its server-info object (SGLang's flag names, and kvsim's).
fn facts_of(o: &Value, name: String, mode: String, pool: u64, context: u64) -> NodeFacts {
    NodeFacts {
        name,
        mode,
        pool,
        context,
        deferred_release: flag(o, "deferred_release")
            .or_else(|| flag(o, "disaggregation_deferred_kv_release")),
        batch_max: o
            .get("mooncake_transfer_batch_max")
            .and_then(Value::as_u64)
            .or_else(|| {
                o.get("disaggregation_transfer_batch_max")
                    .and_then(Value::as_u64)
            }),
        kv_checksum: flag(o, "disaggregation_enable_kv_checksum"),
    }
}

/// One node of `kvsim serve`'s `/get_server_info` `nodes`, its pool from the metric
/// labelled with its number.
fn node_of_kvsim(url: &str, n: &Value, pools: &[(String, u64)], context: u64) -> Result<NodeFacts> {
    let id = n
        .get("node")
        .and_then(Value::as_str)
        .with_context(|| format!("{url}/get_server_info: a node without `node`"))?;
    let num = id.trim_start_matches('n');
    let pool = pools
        .iter()
        .find(|(l, _)| label(l, "node").as_deref() == Some(num))
        .map(|(_, v)| *v)
        .with_context(|| format!("{url}/metrics: no sglang:max_total_num_tokens for node {id}"))?;
    Ok(facts_of(
        n,
        format!("{url} {id}"),
        mode_of(n),
        pool,
        context,
    ))
}

/// Loads a scenario file as `kvsim run` does (the CLI's loader).
pub type LoadScenario<'a> = &'a dyn Fn(&std::path::Path) -> Result<kvsim_sim::scenario::Scenario>;

/// A scenario's nodes, as the server would start them.
pub fn scenario_facts(path: &std::path::Path, load: LoadScenario) -> Result<Vec<NodeFacts>> {
    let sc = load(path)?;
    let plan =
        kvsim_sim::plan::Plan::build(&sc, sc.seed, None, &kvsim_sim::plan::Reduction::default())?;
    let cfg = &plan.engine;
    let page = u64::from(cfg.page_size);
    let mut out = Vec::new();
    let first_decode = plan.prefill_pools.len() + 1;
    for (i, &p) in plan.prefill_pools.iter().enumerate() {
        out.push((format!("n{}", i + 1), "prefill", p));
    }
    for (i, &p) in plan.decode_pools.iter().enumerate() {
        out.push((format!("n{}", first_decode + i), "decode", p));
    }
    Ok(out
        .into_iter()
        .map(|(name, mode, pages)| NodeFacts {
            name: format!("{} {name}", path.display()),
            mode: mode.into(),
            pool: u64::from(pages) * page,
            context: cfg.context_len,
            deferred_release: Some(cfg.defenses.deferred_release),
            batch_max: Some(u64::from(cfg.chunk_pages)),
            kv_checksum: Some(cfg.defenses.verify_on_completion),
        })
        .collect())
}

pub fn run(a: &PreflightArgs, load: LoadScenario) -> Result<ExitCode> {
    if a.url.is_empty() && a.router.is_empty() && a.pool.is_none() && a.scenario.is_none() {
        bail!(
            "give --url URL (one or more), --router URL, --pool N --context N, or --scenario FILE"
        );
    }
    let mut verdicts = Vec::new();
    if let (Some(pool), Some(context)) = (a.pool, a.context) {
        let ok = pool >= context;
        verdicts.push(Verdict {
            pass: ok,
            line: format!(
                "{} pool>=context    given by hand: pool {pool} {} context {context}",
                if ok { "PASS" } else { "FAIL" },
                if ok { ">=" } else { "<" }
            ),
        });
    }
    if let Some(path) = &a.scenario {
        verdicts.extend(judge(&scenario_facts(path, load)?, a.batch_max));
    }
    let mut unreachable = Vec::new();
    let mut urls = a.url.clone();
    for r in &a.router {
        match router_workers(r) {
            Ok(w) if !w.is_empty() => urls.extend(w),
            Ok(_) => unreachable.push(format!("ERROR {r}/workers: the router lists no workers")),
            Err(e) => unreachable.push(format!("ERROR {e:#}")),
        }
    }
    for url in &urls {
        match read_server(url, Duration::from_secs(a.timeout)) {
            Ok(nodes) => verdicts.extend(judge(&nodes, a.batch_max)),
            Err(e) => {
                // A router (SGLang's does not pass /metrics on): say where to look.
                let hint = match router_workers(url) {
                    Ok(w) if !w.is_empty() => format!(
                        "\n  HINT: {url} is a router; check its workers with --router {url} \
                         (or --url {})",
                        w.join(" --url ")
                    ),
                    _ => String::new(),
                };
                unreachable.push(format!("ERROR {e:#}{hint}"));
            }
        }
    }
    for v in &verdicts {
        println!("{}", v.line);
    }
    for u in &unreachable {
        println!("{u}");
    }
    let failed = verdicts.iter().filter(|v| !v.pass).count();
    println!(
        "preflight: {} passed, {failed} failed, {} servers not read",
        verdicts.len() - failed,
        unreachable.len()
    );
    Ok(if !unreachable.is_empty() {
        ExitCode::from(2)
    } else if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incident_numbers_fail_and_name_both() {
        let n = NodeFacts {
            name: "p".into(),
            mode: "prefill".into(),
            pool: 681280,
            context: 1048576,
            deferred_release: Some(true),
            batch_max: Some(65),
            kv_checksum: None,
        };
        let v = judge(&[n], 64);
        assert!(v[0].line.contains("pool 681280 < context 1048576"), "{v:?}");
        assert!(!v[0].pass && v[1].pass && !v[2].pass);
        assert_eq!(v.len(), 3, "kv-checksum is judged at decode only");
        let m = pool_metrics("# x\nsglang:max_total_num_tokens{node=\"1\"} 512\n");
        assert_eq!(m, vec![("{node=\"1\"}".to_string(), 512)]);
        assert_eq!(label(&m[0].0, "node").as_deref(), Some("1"));
    }
}
