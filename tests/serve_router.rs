//! kvsim's prefill and decode processes behind SGLang's real router
//! (`sglang-router` 0.3.2 from PyPI, its Rust gateway, in `--pd-disaggregation` mode),
//! all on loopback: each node serves SGLang's worker API (`kvsim serve --node N
//! --worker-http ADDR`), prefill its bootstrap endpoint; the router pairs the halves
//! with its own random 63-bit rooms. Through it: `kvsim canary` (clean on the defended
//! engine, with client disconnects at drawn points; the incident bugs' leak found),
//! a room the router's retry must replace, then `kvsim audit` over every node's trace
//! and every pool whole at exit.
//!
//! The router comes from `KVSIM_PYTHON`'s environment (`.ci/run` installs it pinned in
//! a virtual environment): without it the test says SKIPPED, and fails instead under
//! `KVSIM_REQUIRE_PY_CLIENTS=1`.

mod cli;

use cli::{kvsim, router_python, text, tmp_in, Served, LEAK_LOAD};
use kvsim_runtime::http_client::fetch;
use serde_json::Value;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOOPBACK: &str = "tests/serve/loopback.toml";
const INCIDENT_SC: &str = "tests/serve/incident.toml";
const BUGS: &str = "gate-checks-finished-only,no-length-agreement";
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

/// A prefill and a decode process in worker mode, and the router in front.
struct Bed {
    prefill: Served,
    decode: Served,
    prefill_http: String,
    decode_http: String,
    router: Router,
    traces: std::path::PathBuf,
    /// Each node's `kvsim serve` arguments (prefill's, decode's), for a restart.
    args: [Vec<String>; 2],
    /// The router's output.
    router_log: std::path::PathBuf,
}

/// What a bed's nodes get besides the scenario and the bugs: arguments for prefill
/// alone, arguments for both nodes, and their environment.
#[derive(Default)]
struct Extra<'a> {
    prefill: &'a [&'a str],
    both: &'a [&'a str],
    env: &'a [(&'a str, String)],
}

fn start_bed(py: &str, tag: &str, sc: &str, bugs: Option<&str>, extra: Extra<'_>) -> Bed {
    let dir = tmp_in("router", tag);
    let traces = dir.join("traces");
    let _ = std::fs::remove_dir_all(&traces);
    std::fs::create_dir_all(&traces).unwrap();
    let (n1, n2, boot, ph, dh, rp, mp) = (port(), port(), port(), port(), port(), port(), port());
    let peers = dir.join("peers");
    std::fs::write(
        &peers,
        format!("n1 127.0.0.1:{n1}\nn2 127.0.0.1:{n2}\nbootstrap n1 127.0.0.1:{boot}\n"),
    )
    .unwrap();
    let node = |n: &str, http: u16, more: &[&str]| {
        let (peers, traces) = (peers.display().to_string(), traces.display().to_string());
        let http = format!("127.0.0.1:{http}");
        let mut args = vec![
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
        if let Some(b) = bugs {
            args.extend(["--bugs", b]);
        }
        args.extend(more);
        args.extend(extra.both);
        let mut s = Served::start_env(&args, extra.env);
        s.wait_for("worker http", kvsim::serve::worker_of);
        (s, args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    };
    let ((prefill, p_args), (decode, d_args)) =
        (node("n1", ph, extra.prefill), node("n2", dh, &[]));
    let (prefill_http, decode_http) = (
        format!("http://127.0.0.1:{ph}"),
        format!("http://127.0.0.1:{dh}"),
    );
    let router_log = dir.join("router.log");
    let log = std::fs::File::create(&router_log).unwrap();
    let child = Command::new(py)
        .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
        .args(["--port", &rp.to_string(), "--pd-disaggregation"])
        .args(["--prefill", &prefill_http, &boot.to_string()])
        .args(["--decode", &decode_http, "--policy", "round_robin"])
        .args([
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &mp.to_string(),
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("the router starts");
    let router = Router {
        child,
        url: format!("http://127.0.0.1:{rp}"),
    };
    // The router lists both workers once it has probed them.
    let end = Instant::now() + T;
    loop {
        let w = fetch(&router.url, "GET", "/workers", None, T)
            .ok()
            .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok());
        let stats = w.as_ref().map(|w| &w["stats"]);
        if stats.is_some_and(|s| s["prefill_count"] == 1 && s["decode_count"] == 1) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the router never listed both workers: {w:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Bed {
        prefill,
        decode,
        prefill_http,
        decode_http,
        router,
        traces,
        args: [p_args, d_args],
        router_log,
    }
}

/// Wait until a worker's node is quiescent (every page free, nothing live).
fn wait_whole(http: &str) {
    let end = Instant::now() + T;
    loop {
        let m = fetch(http, "GET", "/metrics", None, T)
            .map(|r| r.text())
            .unwrap_or_default();
        let free = m.lines().find(|l| l.starts_with("kvsim_pool_pages_free{"));
        let held = m.lines().find(|l| l.starts_with("kvsim_pool_pages_held{"));
        let live = m.lines().find(|l| l.starts_with("kvsim_live_requests{"));
        if held.is_some_and(|l| l.ends_with(" 0")) && live.is_some_and(|l| l.ends_with(" 0")) {
            return;
        }
        assert!(
            Instant::now() < end,
            "{http} never whole: {free:?} {held:?} {live:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stop both nodes (each must drain: every pool whole) and audit every trace.
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
    let mut args = vec!["canary", "--url", url, "--quiet"];
    args.extend(extra);
    let o = kvsim(&args);
    (o.status.code().unwrap_or(-1), text(&o))
}

#[test]
fn the_real_router_drives_kvsim_prefill_and_decode() {
    let Some(py) = router_python("the_real_router_drives_kvsim_prefill_and_decode") else {
        return;
    };
    let bed = start_bed(&py, "clean", LOOPBACK, None, Extra::default());
    // The workers answer SGLang's probes.
    let info = fetch(&bed.prefill_http, "GET", "/get_server_info", None, T).unwrap();
    let info: Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(info["disaggregation_mode"], "prefill", "{info}");
    assert!(info["disaggregation_bootstrap_port"].is_u64(), "{info}");
    let (rc, out) = canary(
        &bed.router.url,
        &[
            "--requests",
            "32",
            "--over-length",
            "4",
            "--disconnect-rate",
            "0.25",
            "--seed",
            "3",
        ],
    );
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("canary: PASS") && out.contains("400: 4"),
        "{out}"
    );
    assert!(out.contains("disconnected"), "{out}");
    // A stream through the router arrives token by token.
    let r = fetch(
        &bed.router.url,
        "POST",
        "/generate",
        Some(br#"{"text":"a b c d","stream":true,"sampling_params":{"max_new_tokens":3}}"#),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let events = r.text().matches("data: ").count();
    assert_eq!(events, 5, "three tokens, the end, [DONE]: {}", r.text());
    // The engine's reason reaches the client: prefill's admission refusal, through
    // decode's answer and the router.
    let long = format!(r#"{{"text":"{}"}}"#, vec!["x"; 513].join(" "));
    let r = fetch(
        &bed.router.url,
        "POST",
        "/generate",
        Some(long.as_bytes()),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("prompt of 513 tokens exceeds the admission limit of 512"),
        "{}",
        r.text()
    );
    // SGLang's batch form, sent to both workers as a PD router sends it (this router
    // version refuses a list `text` itself, 422): one room per element, answers in
    // order.
    let boot = info["disaggregation_bootstrap_port"].as_u64().unwrap();
    let batch = format!(
        r#"{{"text":["CANARY-b1 a b","CANARY-b2 c d e"],"sampling_params":{{"max_new_tokens":2}},
            "bootstrap_host":["127.0.0.1","127.0.0.1"],"bootstrap_port":[{boot},{boot}],
            "bootstrap_room":[101,102]}}"#
    );
    let (p_url, b2) = (bed.prefill_http.clone(), batch.clone());
    let pre =
        std::thread::spawn(move || fetch(&p_url, "POST", "/generate", Some(b2.as_bytes()), T));
    let r = fetch(
        &bed.decode_http,
        "POST",
        "/generate",
        Some(batch.as_bytes()),
        T,
    )
    .unwrap();
    assert_eq!(pre.join().unwrap().unwrap().status, 200);
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let texts: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(
        texts.len() == 2 && texts[0].contains("CANARY-b1") && texts[1].contains("CANARY-b2"),
        "{v}"
    );
    // The OpenAI API through the router: completions and a chat stream.
    let r = fetch(
        &bed.router.url,
        "POST",
        "/v1/completions",
        Some(br#"{"model":"kvsim/serve-loopback","prompt":"CANARY-oa a b c","max_tokens":3}"#),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("CANARY-oa"),
        "{v}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    let r = fetch(
        &bed.router.url,
        "POST",
        "/v1/chat/completions",
        Some(br#"{"model":"kvsim/serve-loopback","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi there"}]}"#),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let chunks = r.text().matches("chat.completion.chunk").count();
    assert_eq!(chunks, 4, "the role, two tokens, the end: {}", r.text());
    // Nothing the router sends is trusted: a bootstrap address that names no prefill
    // node, and a room already in use, are refused at once.
    let body = |room: u64, port: u16| {
        format!(
            r#"{{"text":"a b","bootstrap_host":"127.0.0.1","bootstrap_port":{port},"bootstrap_room":{room}}}"#
        )
    };
    let r = fetch(
        &bed.decode_http,
        "POST",
        "/generate",
        Some(body(7, 1).as_bytes()),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("names no prefill node"), "{}", r.text());
    // A prefill half whose decode never registers ends in bounded time, holding nothing.
    let r = fetch(
        &bed.prefill_http,
        "POST",
        "/generate",
        Some(body(9, 1).as_bytes()),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    wait_whole(&bed.prefill_http);
    wait_whole(&bed.decode_http);
    // Preflight through the router: it asks for the workers and checks each one
    // (the loopback scenario's prefill pool is smaller than its context: FAIL); given
    // the router as a server, it hints at --router.
    let o = kvsim(&["preflight", "--router", &bed.router.url]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("FAIL pool>=context") && out.contains("pool 512 < context 1024"),
        "{out}"
    );
    assert!(
        out.contains("pool 2048 >= context 1024"),
        "decode checked too: {out}"
    );
    let o = kvsim(&["preflight", "--url", &bed.router.url]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("HINT:") && text(&o).contains("--router"),
        "{}",
        text(&o)
    );
    let (rc, audit) = stop_and_audit(bed);
    assert_eq!(rc, 0, "the audit over every node's trace is clean: {audit}");
}

#[test]
fn the_incident_leak_is_found_through_the_real_router() {
    let Some(py) = router_python("the_incident_leak_is_found_through_the_real_router") else {
        return;
    };
    let bed = start_bed(&py, "incident", INCIDENT_SC, Some(BUGS), Extra::default());
    let (rc, out) = canary(&bed.router.url, &LEAK_LOAD);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("LEAK: reply to request"), "{out}");
    let _ = Path::new(&bed.traces);
    let (rc, audit) = stop_and_audit(bed);
    assert_ne!(rc, 0, "the audit finds the incident: {audit}");
}

/// A prefill half that fails (503, twice): the router retries with a new room each
/// time, the third attempt answers 200, and every abandoned half ends (decode's is
/// told prefill's status) with the audit clean.
#[test]
fn a_failed_half_is_retried_with_a_new_room() {
    let Some(py) = router_python("a_failed_half_is_retried_with_a_new_room") else {
        return;
    };
    let bed = start_bed(
        &py,
        "retry",
        LOOPBACK,
        None,
        Extra {
            prefill: &["--worker-fail-first", "2"],
            ..Extra::default()
        },
    );
    let r = fetch(
        &bed.router.url,
        "POST",
        "/generate",
        Some(br#"{"text":"CANARY-retry a b c","sampling_params":{"max_new_tokens":2}}"#),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("CANARY-retry"), "{}", r.text());
    let m = fetch(&bed.prefill_http, "GET", "/metrics", None, T)
        .unwrap()
        .text();
    assert!(
        m.contains("kvsim_http_responses_total{status=\"503\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("kvsim_http_responses_total{status=\"200\"} 1"),
        "{m}"
    );
    let d = fetch(&bed.decode_http, "GET", "/metrics", None, T)
        .unwrap()
        .text();
    assert!(
        d.contains("kvsim_http_requests_total 3"),
        "three rooms at decode: {d}"
    );
    wait_whole(&bed.prefill_http);
    wait_whole(&bed.decode_http);
    let (rc, audit) = stop_and_audit(bed);
    assert_eq!(rc, 0, "{audit}");
}

/// The one-process form: every node in one `kvsim serve`, a worker listener per
/// prefill and decode node, behind the same router.
#[test]
fn one_process_serves_a_worker_per_node_behind_the_router() {
    let Some(py) = router_python("one_process_serves_a_worker_per_node_behind_the_router") else {
        return;
    };
    let dir = tmp_in("router", "one");
    let traces = dir.join("traces");
    let _ = std::fs::remove_dir_all(&traces);
    std::fs::create_dir_all(&traces).unwrap();
    let (boot, ph, dh, rp, mp) = (port(), port(), port(), port(), port());
    let workers = format!("n1=127.0.0.1:{ph},n2=127.0.0.1:{dh}");
    let bootstrap = format!("n1=127.0.0.1:{boot}");
    let t = traces.display().to_string();
    let mut s = Served::start(&[
        LOOPBACK,
        "--worker-http",
        &workers,
        "--bootstrap",
        &bootstrap,
        "--trace-json",
        &t,
    ]);
    s.wait_for("worker http", kvsim::serve::worker_of);
    s.wait_for("worker http", kvsim::serve::worker_of);
    let child = Command::new(&py)
        .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
        .args(["--port", &rp.to_string(), "--pd-disaggregation"])
        .args([
            "--prefill",
            &format!("http://127.0.0.1:{ph}"),
            &boot.to_string(),
        ])
        .args([
            "--decode",
            &format!("http://127.0.0.1:{dh}"),
            "--policy",
            "round_robin",
        ])
        .args([
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &mp.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the router starts");
    let router = Router {
        child,
        url: format!("http://127.0.0.1:{rp}"),
    };
    let end = Instant::now() + T;
    while !fetch(&router.url, "GET", "/workers", None, T)
        .is_ok_and(|r| r.text().contains("\"decode_count\":1"))
    {
        assert!(Instant::now() < end, "the router never listed both workers");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (rc, out) = canary(&router.url, &["--requests", "16", "--over-length", "2"]);
    assert_eq!(rc, 0, "{out}");
    wait_whole(&format!("http://127.0.0.1:{ph}"));
    wait_whole(&format!("http://127.0.0.1:{dh}"));
    drop(router);
    let (out, ok) = s.stop("-TERM");
    assert!(ok && out.contains("kvsim serve: drained"), "{out}");
    let files: Vec<String> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    let mut args = vec!["audit"];
    args.extend(files.iter().map(String::as_str));
    let o = kvsim(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// How one request of the load through the router ended.
#[derive(Debug, Clone)]
enum Got {
    /// 200 whose text is made of the request's own words (echo attention).
    Own,
    /// 200 whose text is not the request's own (a wrong reply).
    Wrong(String),
    /// Another status, and the body's start.
    Status(u16, String),
    /// No HTTP reply.
    NoReply(String),
}

/// One request of the load: when it was sent, when it ended, how.
#[derive(Debug, Clone)]
struct Shot {
    sent: Instant,
    done: Instant,
    got: Got,
}

/// A steady load through the router: `threads` clients, one request at a time each,
/// every prompt of words unique to it, until `stop`; every outcome recorded.
fn steady_load(
    url: &str,
    threads: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    shots: &std::sync::Arc<std::sync::Mutex<Vec<Shot>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    use std::sync::atomic::Ordering;
    (0..threads)
        .map(|t| {
            let (url, stop, shots) = (url.to_string(), stop.clone(), shots.clone());
            std::thread::spawn(move || {
                let a = kvsim_runtime::http_client::agent(Duration::from_secs(30));
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let words: Vec<String> = ["K", "a", "b", "c"]
                        .iter()
                        .map(|w| format!("{w}{t}x{i}"))
                        .collect();
                    let body = serde_json::json!({"text": words.join(" "),
                        "sampling_params": {"max_new_tokens": 4}})
                    .to_string();
                    let sent = Instant::now();
                    let r = kvsim_runtime::http_client::fetch_with(
                        &a,
                        &url,
                        "POST",
                        "/generate",
                        Some(body.as_bytes()),
                    );
                    let got = match r {
                        Ok(r) if r.status == 200 => {
                            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                            let text = v["text"].as_str().unwrap_or("");
                            let own = !text.is_empty()
                                && text
                                    .split_whitespace()
                                    .all(|w| words.iter().any(|x| x == w));
                            if own {
                                Got::Own
                            } else {
                                Got::Wrong(format!("{words:?}: {}", r.text()))
                            }
                        }
                        Ok(r) => Got::Status(r.status, r.text().chars().take(160).collect()),
                        Err(e) => Got::NoReply(e.to_string()),
                    };
                    let failed = !matches!(got, Got::Own);
                    shots.lock().expect("the shots").push(Shot {
                        sent,
                        done: Instant::now(),
                        got,
                    });
                    if failed {
                        // A failing deployment answers fast: do not spin.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

/// The router's view of its workers: (url, worker_type, is_healthy) each.
fn router_workers(url: &str) -> Vec<(String, String, bool)> {
    let w = fetch(url, "GET", "/workers", None, Duration::from_secs(2))
        .ok()
        .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .unwrap_or(Value::Null);
    w["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    (
                        w["url"].as_str().unwrap_or("").to_string(),
                        w["worker_type"].as_str().unwrap_or("").to_string(),
                        w["is_healthy"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the router's log says about its workers (colour codes, times and request ids
/// removed): each distinct warning or error, and each note of a worker's health or
/// circuit, with how often.
fn router_says(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut plain = String::with_capacity(text.len());
    let mut esc = false;
    for c in text.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => plain.push(c),
        }
    }
    let mut said: Vec<(String, usize)> = Vec::new();
    for l in plain.lines() {
        if l.contains("tokenizer") || l.contains("status_code=") || l.contains("started processing")
        {
            continue;
        }
        // `DATE TIME LEVEL span{...}: module: file:line: message`: the level and message.
        let level = l.split_whitespace().nth(2).unwrap_or("");
        let msg = l.rsplit(".rs:").next().unwrap_or(l);
        let msg = msg.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':');
        // Start-up's steps aside: what it says about workers' health and circuits.
        let about = ["ircuit", "ealth", "emov", "navailable"];
        if level == "INFO" && !about.iter().any(|a| msg.contains(a)) {
            continue;
        }
        let key = format!("{level}{}", msg.chars().take(200).collect::<String>());
        match said.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => said.push((key, 1)),
        }
    }
    said.into_iter()
        .map(|(k, n)| format!("{n} x {k}"))
        .collect()
}

/// How long a killed worker stays down before its restart: past the router's retries
/// of one request (five, 50 ms growing by 1.5x), within decode's drain-ack budget (40
/// asks 50 ms apart: a quarantine waiting on a dead prefill's ack stops decode loudly
/// past it, for good).
const DOWN: Duration = Duration::from_millis(1000);

/// One kill of a worker under the load: SIGKILL, restart at `epoch` on the same
/// addresses, and the time until a request sent after the restart is answered 200
/// (bounded). What the clients saw from the kill on is returned for the caller.
fn kill_and_restart(
    bed: &mut Bed,
    which: usize,
    epoch: u32,
    shots: &std::sync::Arc<std::sync::Mutex<Vec<Shot>>>,
) -> (Instant, Instant, Duration) {
    let name = ["prefill", "decode"][which];
    let victim = if which == 0 {
        &mut bed.prefill
    } else {
        &mut bed.decode
    };
    victim.signal("-KILL");
    let killed = Instant::now();
    let _ = victim.child.wait();
    // Down for a while, then restarted on the same addresses, as a supervisor would.
    std::thread::sleep(DOWN);
    let down = router_workers(&bed.router.url);
    let mut args: Vec<&str> = bed.args[which].iter().map(String::as_str).collect();
    let e = epoch.to_string();
    args.extend(["--epoch", &e]);
    let mut s = Served::start(&args);
    s.wait_for("worker http", kvsim::serve::worker_of);
    s.wait_for("running", |l| {
        l.contains("kvsim serve: running").then_some(())
    });
    let ready = Instant::now();
    let old = if which == 0 {
        std::mem::replace(&mut bed.prefill, s)
    } else {
        std::mem::replace(&mut bed.decode, s)
    };
    drop(old);
    // While it recovers: what the router lists.
    let mut views = vec![(-0.0, down), (0.0, router_workers(&bed.router.url))];
    // Recovery: a request sent after the restart answered 200 (bounded: the router's
    // circuit breaker may hold a worker out for its 60 s default).
    let end = ready + Duration::from_secs(150);
    let recovered = loop {
        let first = shots
            .lock()
            .expect("the shots")
            .iter()
            .filter(|s| s.sent >= ready && matches!(s.got, Got::Own))
            .map(|s| s.done)
            .min();
        if let Some(t) = first {
            break t;
        }
        assert!(
            Instant::now() < end,
            "no request sent after the {name}'s restart was answered 200 within {:?}; the \
             router said:\n{}",
            end - ready,
            router_says(&bed.router_log).join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
        if views.len() < 40 {
            let at = ready.elapsed().as_secs_f64();
            let v = router_workers(&bed.router.url);
            if views.last().map(|l| &l.1) != Some(&v) {
                views.push((at, v));
            }
        }
    };
    eprintln!(
        "{name} killed: restarted as epoch {epoch} {:.3} s after the kill; the router's \
         workers (s after the restart, -0 while down: url, type, healthy): {views:?}",
        (ready - killed).as_secs_f64()
    );
    (killed, ready, recovered - ready)
}

/// Workers killed and restarted behind the real router, under a steady load: the
/// decode process is SIGKILLed mid-load and restarted at once on the same addresses
/// with `--epoch 1`, then the same is done to the prefill process. Clients send
/// through the router throughout (three threads, one request at a time each, every
/// prompt's words unique to it).
///
/// Asserted: no 200 ever carries a reply that is not the request's own (every word
/// of a 200's text is one of its prompt's; the canary after recovery finds no foreign
/// marker); after each restart a request sent after it is answered 200 within a bound
/// (the recovery time, printed, with the router's view of its workers and what its
/// log says); at the end SIGTERM drains both nodes (every pool whole) and `kvsim
/// audit` over every trace (both incarnations of each node) is clean.
///
/// A killed process writes no end to its trace, and what it had not flushed is lost;
/// its events reach the file before any message they caused leaves the node
/// (write-ahead), so the file never misses a cause of what another node saw. The
/// restarted incarnation appends the end of its predecessor's file (`killed`) and
/// starts its own with the `crash` (listing the writes the dead one had posted and
/// not seen complete) and `restart` records, so the audit judges the dead incarnation
/// up to its last flushed record and the node's run on from there. What the audit
/// cannot judge: anything the killed process did after its last flush that no other
/// node saw (by write-ahead, nothing that left the process).
///
/// What makes it fail: a 200 carrying another request's words; a worker the router
/// never uses again after its restart (no 200 within the bound); a pool not whole or
/// a node that does not drain; an audit finding (e.g. a room never cleared because a
/// killed half's end was never learned, L2; or a write landing in pages their room
/// no longer owns, S2).
#[test]
fn workers_killed_and_restarted_behind_the_real_router() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let Some(py) = router_python("workers_killed_and_restarted_behind_the_real_router") else {
        return;
    };
    let mut bed = start_bed(&py, "kill", LOOPBACK, None, Extra::default());
    let (stop, shots) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let load = steady_load(&bed.router.url, 3, &stop, &shots);
    // Steady state first: answered 200s before the kill.
    let warm = |n: usize| {
        let end = Instant::now() + T;
        loop {
            let ok = shots
                .lock()
                .expect("the shots")
                .iter()
                .filter(|s: &&Shot| matches!(s.got, Got::Own))
                .count();
            if ok >= n {
                return;
            }
            assert!(Instant::now() < end, "only {ok} answered 200 before a kill");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    warm(100);
    let (k1, r1, rec1) = kill_and_restart(&mut bed, 1, 1, &shots);
    let n = shots.lock().expect("the shots").len();
    warm(n + 100);
    let (k2, r2, rec2) = kill_and_restart(&mut bed, 0, 1, &shots);
    let n = shots.lock().expect("the shots").len();
    warm(n + 100);
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().expect("a load thread");
    }
    let shots = shots.lock().expect("the shots").clone();
    // What the clients saw, per phase.
    let tally = |from: Instant, to: Instant| {
        let mut m: std::collections::BTreeMap<String, usize> = Default::default();
        for s in shots.iter().filter(|s| s.done >= from && s.done < to) {
            let k = match &s.got {
                Got::Own => "200".to_string(),
                Got::Wrong(_) => "200 WRONG".to_string(),
                Got::Status(st, body) => format!("{st} {}", &body[..body.len().min(90)]),
                Got::NoReply(e) => format!("no reply: {}", &e[..e.len().min(90)]),
            };
            *m.entry(k).or_default() += 1;
        }
        m
    };
    let first = shots.iter().map(|s| s.sent).min().expect("a request");
    let last = shots.iter().map(|s| s.done).max().expect("a request") + Duration::from_secs(1);
    eprintln!(
        "kill/restart behind the router: {} requests; before the decode kill: {:?}",
        shots.len(),
        tally(first, k1)
    );
    eprintln!(
        "  decode: killed, restarted after {:.3} s, recovered (a request sent after the \
         restart answered 200) {:.3} s after the restart; from the kill to the prefill \
         kill: {:?}",
        (r1 - k1).as_secs_f64(),
        rec1.as_secs_f64(),
        tally(k1, k2)
    );
    eprintln!(
        "  prefill: killed, restarted after {:.3} s, recovered {:.3} s after the restart; \
         from the kill to the end: {:?}",
        (r2 - k2).as_secs_f64(),
        rec2.as_secs_f64(),
        tally(k2, last)
    );
    let says = router_says(&bed.router_log);
    eprintln!(
        "  the router's log, each message with its count:\n{}",
        says.join("\n")
    );
    let wrong: Vec<&str> = shots
        .iter()
        .filter_map(|s| match &s.got {
            Got::Wrong(w) => Some(w.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "200s with a reply not their own: {wrong:?}"
    );
    // After recovery the canary through the router: clean.
    let (rc, out) = canary(&bed.router.url, &["--requests", "32", "--over-length", "4"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("canary: PASS"), "{out}");
    wait_whole(&bed.prefill_http);
    wait_whole(&bed.decode_http);
    // Each killed incarnation's file was ended by its successor.
    for f in ["n1-e0.jsonl", "n2-e0.jsonl"] {
        let t = std::fs::read_to_string(bed.traces.join(f)).expect("the killed one's trace");
        assert!(
            t.lines()
                .last()
                .is_some_and(|l| l.contains("incarnation 0 was killed")),
            "{f} does not end with its successor's note"
        );
    }
    let (rc, audit) = stop_and_audit(bed);
    assert_eq!(rc, 0, "the audit over every incarnation's trace: {audit}");
}

/// Issue 41: SGLang's real router in front of kvsim's prefill and decode workers whose
/// KV moves over NVIDIA's NIXL library (`--transport nixl`, UCX over TCP on loopback):
/// the canary passes through the router (every over-length prompt 400, no reply with
/// another request's marker), both workers end whole, and the audit of their traces is
/// clean. Skips where the NIXL wheel or the `nixl` feature is missing (a failure under
/// `KVSIM_REQUIRE_NIXL=1`).
#[test]
fn the_real_router_drives_prefill_and_decode_over_nixl() {
    let name = "the_real_router_drives_prefill_and_decode_over_nixl";
    let Some(py) = router_python(name) else {
        return;
    };
    let Some(lib) = kvsim_testenv::nixl_lib_dir(name, cfg!(feature = "nixl")) else {
        return;
    };
    let env = [
        ("LD_LIBRARY_PATH", lib.display().to_string()),
        ("UCX_TLS", "tcp".to_string()),
        ("UCX_NET_DEVICES", "lo".to_string()),
    ];
    let extra = Extra {
        both: &["--gpu", "host", "--transport", "nixl"],
        env: &env,
        ..Extra::default()
    };
    let bed = start_bed(&py, "nixl", LOOPBACK, None, extra);
    let load = ["--requests", "32", "--over-length", "4", "--seed", "41"];
    let (rc, out) = canary(&bed.router.url, &load);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("canary: PASS") && out.contains("400: 4"),
        "{out}"
    );
    wait_whole(&bed.prefill_http);
    wait_whole(&bed.decode_http);
    let (code, report) = stop_and_audit(bed);
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("verdict: CLEAN"), "{report}");
}
