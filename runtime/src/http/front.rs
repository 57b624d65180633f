//! The router's front: what the router's process gives it ([`FrontParts`]), serving
//! it ([`spawn_http_front`]), and which endpoint answers each request. Not the
//! endpoints' own work (`generate`, [`crate::http::openai`], [`crate::http::metrics`]).

use crate::client::StatusFn;
use crate::http::conn::{read_body, spawn_server, Handler};
use crate::http::generate::generate;
use crate::http::info::{model_info, FrontInfo};
use crate::http::limits::FrontLimits;
use crate::http::metrics;
use crate::http::openai;
use crate::http::response::{error, full, json_reply, Out};
use crate::http::state::{FrontCounters, NodesFn, Prompts, Shared};
use crate::node::event::NodeEvent;
use crate::server::options::PromptMode;
use crate::sync::atomic::AtomicU64;
use crate::sync::mpsc::Sender;
use crate::sync::thread;
use crate::sync::{Arc, Mutex};
use crate::tokenizer::Vocab;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::Value;
use std::net::TcpListener;

/// What the router process gives the front.
pub struct FrontParts<K> {
    pub router: Sender<NodeEvent<K>>,
    pub status: StatusFn,
    pub nodes: NodesFn,
    /// Request ids (shared with the line-JSON endpoint).
    pub next: Arc<AtomicU64>,
    pub info: FrontInfo,
    pub limits: FrontLimits,
    pub prompts: PromptMode,
}

/// Serve HTTP on `listener` (until the process ends), submitting to the router's loop.
pub fn spawn_http_front<K: Send + 'static>(
    listener: TcpListener,
    parts: FrontParts<K>,
) -> std::io::Result<thread::JoinHandle<()>> {
    let shared = Arc::new(Shared {
        router: parts.router,
        status: parts.status,
        nodes: parts.nodes,
        next: parts.next,
        info: parts.info,
        vocab: Mutex::new(Vocab::new()),
        prompts: Mutex::new(Prompts::default()),
        counters: FrontCounters::default(),
        limits: parts.limits,
        canary: parts.prompts == PromptMode::Canary,
    });
    let max = shared.limits.max_connections;
    let handler: Handler = Arc::new(move |req| {
        let sh = shared.clone();
        Box::pin(async move { route(&sh, req).await })
    });
    spawn_server(listener, "http-front", max, handler)
}

const PATHS: [&str; 9] = [
    "/generate",
    "/health",
    "/health_generate",
    "/get_model_info",
    "/get_server_info",
    "/metrics",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
];

async fn route<K: Send + 'static>(sh: &Arc<Shared<K>>, req: Request<Incoming>) -> Response<Out> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/health" | "/health_generate") => full(200, "text/plain", ""),
        (&Method::GET, "/get_model_info") => json_reply(200, &model_info(&sh.info)),
        (&Method::GET, "/get_server_info") => {
            let sh2 = sh.clone();
            let status = tokio::task::spawn_blocking(move || (sh2.status)())
                .await
                .unwrap_or(Value::Null);
            let mut v = sh.info.server_info.clone();
            if let Some(o) = v.as_object_mut() {
                o.insert("status".into(), status);
            }
            json_reply(200, &v)
        }
        (&Method::GET, "/metrics") => {
            let sh2 = sh.clone();
            let nodes = tokio::task::spawn_blocking(move || (sh2.nodes)())
                .await
                .unwrap_or_default();
            full(
                200,
                metrics::CONTENT_TYPE,
                metrics::render(sh.info.page_size, &sh.counters, &nodes),
            )
        }
        (&Method::GET, "/v1/models") => json_reply(200, &openai::models(&sh.info)),
        (&Method::POST, "/generate") => match read_body(req, sh.limits.read_deadline).await {
            Ok(b) => generate(sh, &b).await,
            Err(r) => r,
        },
        (&Method::POST, "/v1/completions" | "/v1/chat/completions") => {
            match read_body(req, sh.limits.read_deadline).await {
                Ok(b) => openai::serve(sh, &path, &b).await,
                Err(r) => r,
            }
        }
        (_, p) if PATHS.contains(&p) => {
            error(405, &format!("method {method} not allowed on {path}"))
        }
        _ => error(404, &format!("no endpoint {path}")),
    }
}
