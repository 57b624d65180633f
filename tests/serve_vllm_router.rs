//! kvsim's vLLM-kind prefill and decode processes behind vLLM's real router
//! (`vllm-router` 0.1.17 from PyPI, its Rust gateway, in `--vllm-pd-disaggregation`
//! mode), all on loopback: each node serves vLLM's worker API (`kvsim serve --node N
//! --worker-http ADDR` of a scenario under `vllm-router`), prefill its side channel at
//! its bootstrap address. The router sends prefill the request with
//! `kv_transfer_params {do_remote_decode: true}`, then decode the original request
//! with prefill's reply's params; decode READs prefill's pages over the nodes'
//! connection and notifies prefill, which frees them (or its lease expires).
//!
//! Through it: `kvsim canary --api openai` (clean, with client disconnects; with a
//! lease shorter than the router's hop from prefill to decode, the leak found in the
//! replies and by the audit), bad `kv_transfer_params` refused 400 naming the field,
//! then SIGTERM (every pool whole) and `kvsim audit` over every node's trace.
//!
//! The router comes pinned from kvsim-testenv (`target/vllm-router`, installed on
//! first use): without it the test says SKIPPED, and fails instead under
//! `KVSIM_REQUIRE_VLLM_ROUTER=1` (set by `cargo xtask test`).

mod cli;

use cli::{kvsim, text, tmp_in, Served};
use kvsim_runtime::http_client::fetch;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const CLEAN: &str = "tests/serve/vllm.toml";
const SHORT_LEASE: &str = "tests/serve/vllm-short-lease.toml";
const T: Duration = cli::SERVE_WAIT;

/// A free loopback port (bound and released: the processes bind it next).
fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The real router, killed when dropped.
struct Router {
    child: Child,
    url: String,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A vLLM-kind prefill and decode process and the router in front.
struct Bed {
    prefill: Served,
    decode: Served,
    prefill_http: String,
    decode_http: String,
    router: Router,
    traces: PathBuf,
}

fn start_bed(exe: &Path, tag: &str, sc: &str) -> Bed {
    let dir = tmp_in("vllm-router", tag);
    let traces = dir.join("traces");
    let _ = std::fs::remove_dir_all(&traces);
    std::fs::create_dir_all(&traces).unwrap();
    let (n1, n2, side, ph, dh, rp, mp) = (port(), port(), port(), port(), port(), port(), port());
    let peers = dir.join("peers");
    std::fs::write(
        &peers,
        format!("n1 127.0.0.1:{n1}\nn2 127.0.0.1:{n2}\nbootstrap n1 127.0.0.1:{side}\n"),
    )
    .unwrap();
    let node = |n: &str, http: u16| {
        let (peers, traces) = (peers.display().to_string(), traces.display().to_string());
        let http = format!("127.0.0.1:{http}");
        let args = [
            sc,
            "--node",
            n,
            "--peers",
            &peers,
            "--worker-http",
            &http,
            "--trace-json",
            &traces,
        ];
        let mut s = Served::start(&args);
        s.wait_for("worker http", kvsim::serve::worker_of);
        s.wait_for("vLLM's protocol", |l| {
            l.contains("Vllm's protocol").then_some(())
        });
        s
    };
    let (prefill, decode) = (node("n1", ph), node("n2", dh));
    let (prefill_http, decode_http) = (
        format!("http://127.0.0.1:{ph}"),
        format!("http://127.0.0.1:{dh}"),
    );
    let log = std::fs::File::create(dir.join("router.log")).unwrap();
    let child = Command::new(exe)
        .args(["--host", "127.0.0.1", "--port", &rp.to_string()])
        .args([
            "--vllm-pd-disaggregation",
            "--prefill",
            &prefill_http,
            "none",
        ])
        .args(["--decode", &decode_http, "--policy", "round_robin"])
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &mp.to_string()])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("the router starts");
    let router = Router {
        child,
        url: format!("http://127.0.0.1:{rp}"),
    };
    // The router answers once it serves (it asks a worker for the models).
    let end = Instant::now() + T;
    while !fetch(&router.url, "GET", "/v1/models", None, T).is_ok_and(|r| r.status == 200) {
        assert!(Instant::now() < end, "the router never served /v1/models");
        std::thread::sleep(Duration::from_millis(100));
    }
    Bed {
        prefill,
        decode,
        prefill_http,
        decode_http,
        router,
        traces,
    }
}

/// Wait until a worker's node is quiescent (no page held, nothing live): a lease
/// whose reader never came holds its pages until it expires.
fn wait_whole(http: &str) {
    let end = Instant::now() + T;
    loop {
        let m = fetch(http, "GET", "/metrics", None, T)
            .map(|r| r.text())
            .unwrap_or_default();
        let held = m.lines().find(|l| l.starts_with("kvsim_pool_pages_held{"));
        let live = m.lines().find(|l| l.starts_with("kvsim_live_requests{"));
        if held.is_some_and(|l| l.ends_with(" 0")) && live.is_some_and(|l| l.ends_with(" 0")) {
            return;
        }
        assert!(
            Instant::now() < end,
            "{http} never whole: {held:?} {live:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stop the router, then both nodes (each must drain: every pool whole), and audit
/// every trace: the audit's exit status and report.
fn stop_and_audit(bed: Bed) -> (i32, String) {
    let Bed {
        prefill,
        decode,
        traces,
        router,
        ..
    } = bed;
    drop(router);
    for s in [prefill, decode] {
        let (out, ok) = s.stop("-TERM");
        assert!(ok && out.contains("kvsim serve: drained"), "{out}");
        assert!(out.contains(" 0 held; 0 live, 0 quarantined"), "{out}");
    }
    let files: Vec<String> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    let mut args = vec!["audit"];
    args.extend(files.iter().map(String::as_str));
    let o = kvsim(&args);
    (o.status.code().unwrap_or(-1), text(&o))
}

fn canary(url: &str, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["canary", "--url", url, "--api", "openai", "--quiet"];
    args.extend(extra);
    let o = kvsim(&args);
    (o.status.code().unwrap_or(-1), text(&o))
}

fn post(url: &str, path: &str, body: &Value) -> (u16, String) {
    let b = body.to_string();
    let r = fetch(url, "POST", path, Some(b.as_bytes()), T).expect("an answer");
    (r.status, r.text())
}

/// Prefill's reply's params for a prompt, asked of the prefill worker directly.
fn prefill_params(bed: &Bed, prompt: &str) -> Value {
    let body = json!({"prompt": prompt, "max_tokens": 1,
                      "kv_transfer_params": {"do_remote_decode": true}});
    let (st, t) = post(&bed.prefill_http, "/v1/completions", &body);
    assert_eq!(st, 200, "{t}");
    let v: Value = serde_json::from_str(&t).unwrap();
    v["kv_transfer_params"].clone()
}

/// Bad `kv_transfer_params` at each worker: 400 naming the field, nothing started.
fn bad_params_are_refused(bed: &Bed) {
    let (st, t) = post(
        &bed.prefill_http,
        "/v1/completions",
        &json!({"prompt": "a b", "max_tokens": 1}),
    );
    assert!(
        st == 400 && t.contains("kv_transfer_params: missing"),
        "{st} {t}"
    );
    let (st, t) = post(
        &bed.prefill_http,
        "/v1/completions",
        &json!({"prompt": "a b", "kv_transfer_params": {"do_remote_prefill": true}}),
    );
    assert!(st == 400 && t.contains("do_remote_decode"), "{st} {t}");
    let good = prefill_params(bed, "CANARY-bad a b c");
    assert_eq!(good["do_remote_prefill"], true, "{good}");
    assert_eq!(good["transfer_mode"], "pull", "{good}");
    let cases: [(&str, Value, &str); 6] = [
        ("do_remote_prefill", json!("yes"), "is not a boolean"),
        (
            "remote_engine_id",
            json!("kvsim-n1-e7"),
            "is not the engine at",
        ),
        (
            "remote_block_ids",
            json!([[9999]]),
            "block 9999 is not one of",
        ),
        ("remote_request_id", json!("cmpl-1"), "is no request id"),
        ("remote_port", json!(1), "names no prefill node"),
        ("kvsim_block_gens", json!([]), "kvsim_block_gens"),
    ];
    for (field, value, says) in cases {
        let mut p = good.clone();
        p[field] = value;
        let body = json!({"prompt": "CANARY-bad a b c", "max_tokens": 2, "kv_transfer_params": p});
        let (st, t) = post(&bed.decode_http, "/v1/completions", &body);
        assert!(
            st == 400 && t.contains(field) && t.contains(says),
            "{field}: {st} {t}"
        );
    }
    // The good params once: decode reads the pages and answers with the prompt's words.
    let body = json!({"prompt": "CANARY-bad a b c", "max_tokens": 2, "kv_transfer_params": good});
    let (st, t) = post(&bed.decode_http, "/v1/completions", &body);
    assert!(st == 200 && t.contains("CANARY-bad"), "{st} {t}");
    // And again: the room is used; the lease is gone.
    let (st, t) = post(&bed.decode_http, "/v1/completions", &body);
    assert_ne!(st, 200, "a request id read twice: {t}");
}

#[test]
fn the_real_vllm_router_drives_kvsim_vllm_prefill_and_decode() {
    let name = "the_real_vllm_router_drives_kvsim_vllm_prefill_and_decode";
    let Some(exe) = kvsim_testenv::vllm_router(name) else {
        return;
    };
    let bed = start_bed(&exe, "clean", CLEAN);
    for w in [&bed.prefill_http, &bed.decode_http] {
        let r = fetch(w, "GET", "/health", None, T).unwrap();
        assert_eq!(r.status, 200, "{w}/health");
    }
    let load = [
        "--requests",
        "32",
        "--over-length",
        "4",
        "--disconnect-rate",
        "0.25",
        "--seed",
        "3",
    ];
    let (rc, out) = canary(&bed.router.url, &load);
    assert_eq!(rc, 0, "{out}");
    // Every request the canary kept answered 200 (32, less the 8 it disconnected),
    // every over-length one 400.
    assert!(
        out.contains("canary: PASS") && out.contains("status 200: 24, 400: 4"),
        "{out}"
    );
    // A chat completion through the router, whole and streamed.
    let chat = json!({"model": "kvsim/serve-vllm", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "CANARY-chat hi there"}]});
    let (st, t) = post(&bed.router.url, "/v1/chat/completions", &chat);
    assert!(st == 200 && t.contains("\"chat.completion\""), "{st} {t}");
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (st, t) = post(&bed.router.url, "/v1/chat/completions", &streamed);
    assert_eq!(st, 200, "{t}");
    assert_eq!(t.matches("chat.completion.chunk").count(), 4, "{t}");
    bad_params_are_refused(&bed);
    wait_whole(&bed.prefill_http);
    wait_whole(&bed.decode_http);
    let (rc, audit) = stop_and_audit(bed);
    assert_eq!(rc, 0, "the audit over every node's trace is clean: {audit}");
    assert!(audit.contains("drained (liveness judged)"), "{audit}");
}

/// A lease shorter than the router's hop from prefill's 200 to decode's start (vLLM's
/// lease is a timing assumption; the aws-samples/aws-do-eks#84 shape): prefill frees
/// the pages before decode READs them, the next request's prefill takes them, and
/// decode reads its KV. The replies carry other requests' markers (the canary) and
/// the audit names S2 (the READ served from pages the room no longer owned).
#[test]
fn a_lease_shorter_than_the_routers_hop_leaks_through_the_real_vllm_router() {
    let name = "a_lease_shorter_than_the_routers_hop_leaks_through_the_real_vllm_router";
    let Some(exe) = kvsim_testenv::vllm_router(name) else {
        return;
    };
    let bed = start_bed(&exe, "short-lease", SHORT_LEASE);
    let load = ["--requests", "64", "--over-length", "0", "--seed", "5"];
    let (rc, out) = canary(&bed.router.url, &load);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("LEAK: reply to request"), "{out}");
    let (rc, audit) = stop_and_audit(bed);
    assert_ne!(rc, 0, "the audit finds the leak: {audit}");
    assert!(audit.contains("VIOLATED S2"), "{audit}");
}
