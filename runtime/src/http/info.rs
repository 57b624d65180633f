//! The deployment's fixed facts a front serves ([`FrontInfo`], made from the
//! server's options by [`front_info`]) and `/get_model_info`'s body. Not the nodes'
//! live status (asked of each loop).

use crate::server::options::ServeOptions;
use serde_json::{json, Value};

/// What the front serves besides generation: fixed facts about the deployment.
#[derive(Clone, Debug)]
pub struct FrontInfo {
    pub model_path: String,
    pub context_len: u64,
    pub max_new_tokens_limit: u32,
    /// The smallest pool of any node, in tokens.
    pub min_pool_tokens: u64,
    /// Tokens per page.
    pub page_size: u64,
    /// `/get_server_info`'s body.
    pub server_info: Value,
}

/// `/get_model_info`'s body.
pub fn model_info(info: &FrontInfo) -> Value {
    json!({
        "model_path": info.model_path,
        "tokenizer_path": null,
        "is_generation": true,
        "max_context_length": info.context_len,
    })
}

/// The deployment facts the front serves, from the server's options. Flag names follow
/// SGLang where it has one (`disaggregation_enable_kv_checksum`, `page_size`,
/// `context_length`, `max_total_num_tokens`) and the write-ups' pre-flight gate where
/// it has not (`deferred_release`, `mooncake_transfer_batch_max`).
pub fn front_info(opts: &ServeOptions) -> FrontInfo {
    let cfg = &opts.cfg;
    let d = &cfg.defenses;
    let page = u64::from(cfg.page_size);
    let nodes: Vec<Value> = opts
        .topology
        .nodes()
        .into_iter()
        .filter_map(|(id, role, pool)| {
            let pool = pool?;
            let mode = match role {
                kvsim_engine::node::Role::Prefill => "prefill",
                kvsim_engine::node::Role::Decode => "decode",
                _ => return None,
            };
            Some(json!({
                "node": id.to_string(),
                "disaggregation_mode": mode,
                "max_total_num_tokens": u64::from(pool) * page,
                "pool_pages": pool,
                "context_length": cfg.context_len,
                "page_size": cfg.page_size,
                "deferred_release": d.deferred_release,
                "mooncake_transfer_batch_max": cfg.chunk_pages,
                "disaggregation_enable_kv_checksum": d.verify_on_completion,
            }))
        })
        .collect();
    let min_pool = nodes
        .iter()
        .filter_map(|n| n["max_total_num_tokens"].as_u64())
        .min()
        .unwrap_or(0);
    let bugs: Vec<&str> = cfg.bugs.iter().map(|b| b.name()).collect();
    FrontInfo {
        model_path: format!("kvsim/{}", opts.scenario),
        context_len: cfg.context_len,
        max_new_tokens_limit: cfg.max_new_tokens_limit,
        min_pool_tokens: min_pool,
        page_size: page,
        server_info: json!({
            "model_path": format!("kvsim/{}", opts.scenario),
            "disaggregation_mode": "router",
            "context_length": cfg.context_len,
            "page_size": cfg.page_size,
            "max_total_num_tokens": min_pool,
            "deferred_release": d.deferred_release,
            "mooncake_transfer_batch_max": cfg.chunk_pages,
            "disaggregation_enable_kv_checksum": d.verify_on_completion,
            "allow_auto_truncate": cfg.allow_auto_truncate,
            "kvsim_defenses": {
                "admission_check": d.admission_check,
                "verify_on_completion": d.verify_on_completion,
                "deferred_release": d.deferred_release,
                "page_tags": d.page_tags,
                "preflight": d.preflight,
                "router_cancels_both": d.router_cancels_both,
                "zero_on_free": d.zero_on_free,
            },
            "kvsim_bugs": bugs,
            "nodes": nodes,
        }),
    }
}
