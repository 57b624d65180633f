//! What a server advertises about its size: its context (`/get_model_info`) and its
//! smallest KV pool (`/metrics`, through a router's workers when it passes none on).
//! Reading only; judging replies against them is [`super::report`]'s.

use anyhow::{Context, Result};
use kvsim_runtime::http_client::fetch;
use serde_json::Value;
use std::time::Duration;

/// What the server advertises: its context (`/get_model_info`) and, when smaller, its
/// smallest KV pool in tokens: prompts between the two are the incident's (admitted by
/// the context, not held by the pool).
pub(super) struct Limits {
    pub(super) context: u64,
    pub(super) pool: Option<u64>,
}

pub(super) fn read_limits(url: &str) -> Result<Limits> {
    let info = fetch(url, "GET", "/get_model_info", None, Duration::from_secs(10))
        .with_context(|| format!("{url}/get_model_info"))?;
    let context = serde_json::from_slice::<Value>(&info.body)
        .ok()
        .and_then(|v| v.get("max_context_length").and_then(Value::as_u64))
        .with_context(|| format!("{url}/get_model_info: no max_context_length"))?;
    let pool = smallest_pool(url).filter(|&p| p < context);
    Ok(Limits { context, pool })
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
