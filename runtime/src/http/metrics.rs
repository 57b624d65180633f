//! `/metrics`: the OpenMetrics text of `prometheus-client`, built on each scrape from
//! the typed status of every node ([`NodeStatus`]) and the front's own counters.
//!
//! SGLang's `sglang:max_total_num_tokens` per node (tokens), and kvsim's own: pages
//! free, held and quarantined per node, quarantined rooms, live requests, refusals,
//! and the front's requests, refusals, disconnects and replies by status. Counters
//! carry the `_total` suffix the format gives them.

use crate::http::state::FrontCounters;
use crate::node::status::NodeStatus;
use crate::sync::atomic::Ordering;
use kvsim_engine::node::Role;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The scrape's content type (OpenMetrics text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

fn labels(n: &NodeStatus) -> NodeLabels {
    let role = match n.role {
        Role::Router => "router",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    };
    NodeLabels {
        node: n.node.0.to_string(),
        role: role.to_string(),
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A gauge family over nodes with a pool.
fn pool_gauge(
    reg: &mut Registry,
    nodes: &[NodeStatus],
    name: &str,
    help: &str,
    value: impl Fn(&NodeStatus, u64, u64) -> u64,
) {
    let f = Family::<NodeLabels, Gauge>::default();
    for n in nodes {
        if let (Some(free), Some(cap)) = (n.free_pages, n.pool_pages) {
            f.get_or_create(&labels(n))
                .set(to_i64(value(n, cap as u64, free as u64)));
        }
    }
    reg.register(name, help, f);
}

/// A counter family over nodes with a pool.
fn pool_counter(
    reg: &mut Registry,
    nodes: &[NodeStatus],
    name: &str,
    help: &str,
    value: impl Fn(&NodeStatus) -> u64,
) {
    let f = Family::<NodeLabels, Counter>::default();
    for n in nodes.iter().filter(|n| n.pool_pages.is_some()) {
        f.get_or_create(&labels(n)).inc_by(value(n));
    }
    reg.register(name, help, f);
}

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// The scrape's text: the pools' gauges, the nodes' counters, then the front's.
pub fn render(page_size: u64, c: &FrontCounters, nodes: &[NodeStatus]) -> String {
    let mut reg = Registry::default();
    register_pools(&mut reg, nodes, page_size.max(1));
    register_node_counts(&mut reg, nodes);
    register_front(&mut reg, c);
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out = "# the metrics could not be encoded\n".into();
    }
    out
}

/// Each node's pool (SGLang's pool size in tokens, free, held and quarantined pages,
/// quarantined rooms) and its live requests.
fn register_pools(reg: &mut Registry, nodes: &[NodeStatus], page: u64) {
    pool_gauge(
        reg,
        nodes,
        "sglang:max_total_num_tokens",
        "KV pool size in tokens",
        |_, cap, _| cap * page,
    );
    pool_gauge(
        reg,
        nodes,
        "kvsim_pool_pages_free",
        "Free KV pages",
        |_, _, f| f,
    );
    pool_gauge(
        reg,
        nodes,
        "kvsim_pool_pages_held",
        "KV pages held (allocated, in flight or quarantined)",
        |_, c, f| c.saturating_sub(f),
    );
    pool_gauge(
        reg,
        nodes,
        "kvsim_pool_pages_quarantined",
        "KV pages quarantined until their writer's drain ack (part of held)",
        |n, _, _| n.quarantined_pages as u64,
    );
    pool_gauge(
        reg,
        nodes,
        "kvsim_quarantined_rooms",
        "Rooms whose pages are quarantined until the writer's drain ack",
        |n, _, _| n.quarantined as u64,
    );
    pool_gauge(
        reg,
        nodes,
        "kvsim_drain_acks_outstanding",
        "Quarantined room uses waiting for the writer's drain ack",
        |n, _, _| n.quarantined as u64,
    );
    let live = Family::<NodeLabels, Gauge>::default();
    for n in nodes {
        live.get_or_create(&labels(n)).set(to_i64(n.live as u64));
    }
    reg.register("kvsim_live_requests", "Requests in flight per node", live);
}

/// Each node's refusals and failures: tag mismatches, refused KV writes, failed
/// transfers.
fn register_node_counts(reg: &mut Registry, nodes: &[NodeStatus]) {
    pool_counter(
        reg,
        nodes,
        "kvsim_tag_mismatches_refused",
        "Decode reads refused because a page's tag did not match",
        |n| n.counts.tag_mismatches,
    );
    pool_counter(
        reg,
        nodes,
        "kvsim_kv_writes_refused",
        "KV writes the receiving node refused",
        |n| n.counts.kv_refused,
    );
    pool_counter(
        reg,
        nodes,
        "kvsim_transfers_failed",
        "KV writes whose completion reported failure (writer side)",
        |n| n.counts.transfers_failed,
    );
}

/// The HTTP front's own counters: requests, refusals at the front, disconnects and
/// replies by status.
fn register_front(reg: &mut Registry, c: &FrontCounters) {
    let load = |a: &crate::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    counter(
        reg,
        "kvsim_http_requests",
        "Generation requests (/generate and the OpenAI API)",
        load(&c.requests),
    );
    counter(
        reg,
        "kvsim_http_rejected_by_front",
        "Bodies refused by the front (400) before reaching the engine",
        load(&c.rejected_by_front),
    );
    counter(
        reg,
        "kvsim_http_disconnects",
        "Clients that closed before their reply (request cancelled)",
        load(&c.disconnects),
    );
    let by = Family::<StatusLabels, Counter>::default();
    if let Ok(m) = c.by_status.lock() {
        for (s, n) in m.iter() {
            by.get_or_create(&StatusLabels {
                status: s.to_string(),
            })
            .inc_by(*n);
        }
    }
    reg.register("kvsim_http_responses", "Replies by status", by);
}
