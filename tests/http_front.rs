//! The SGLang-compatible HTTP front of `kvsim serve`, `kvsim preflight`, `kvsim canary`,
//! and the incident write-ups' own scripts (tests/writeups/), all on loopback with
//! ephemeral ports. Every wait has a timeout.

mod cli;

use cli::{kvsim, python_with, root, text, tmp_in, Served, LEAK_LOAD};
use kvsim_runtime::http_client::fetch;
use kvsim_runtime::Client;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

const LOOPBACK: &str = "tests/serve/loopback.toml";
const INCIDENT_SC: &str = "tests/serve/incident.toml";
const BUGS: &str = "gate-checks-finished-only,no-length-agreement";
const T: Duration = cli::SERVE_WAIT;

/// A running `kvsim serve --http` (the shared [`Served`] process, stopped with SIGTERM)
/// with its HTTP front's base URL and its line endpoint.
struct HttpServed {
    s: Served,
    http: String,
    client: SocketAddr,
}

impl HttpServed {
    fn start(args: &[&str]) -> HttpServed {
        let mut all = args.to_vec();
        all.extend(["--http", "127.0.0.1:0"]);
        let mut s = Served::start(&all);
        let client = s.endpoint();
        let h = s.wait_for("http front", kvsim::serve::http_of);
        HttpServed {
            s,
            http: format!("http://{h}"),
            client,
        }
    }

    /// Wait until every node is quiescent (nothing in flight, every page free).
    fn wait_quiescent(&self) -> Value {
        let mut c = Client::connect(self.client, T).expect("line endpoint");
        let end = Instant::now() + T;
        loop {
            let st = c.status().expect("status line");
            let nodes = st["nodes"].as_array().cloned().unwrap_or_default();
            let quiet = !nodes.is_empty()
                && nodes.iter().all(|n| {
                    n["live"] == 0 && n["quarantined"] == 0 && n["free_pages"] == n["pool_pages"]
                });
            if quiet {
                return st;
            }
            assert!(Instant::now() < end, "the server never quiesced: {st}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, wait for the exit; (stdout, exited 0).
    fn stop(self) -> (String, bool) {
        self.s.stop("-TERM")
    }
}

fn get(base: &str, path: &str) -> (u16, String) {
    let r = fetch(base, "GET", path, None, T).expect("GET answered");
    (r.status, r.text())
}

fn post(base: &str, body: &str) -> (u16, String) {
    let r = fetch(base, "POST", "/generate", Some(body.as_bytes()), T).expect("POST answered");
    (r.status, r.text())
}

/// Send raw bytes and read until the server closes (the request must make it close:
/// `Connection: close`, or an error that closes).
fn raw(base: &str, bytes: &[u8]) -> String {
    let addr = kvsim_runtime::http_client::base_addr(base).unwrap();
    let mut s = TcpStream::connect_timeout(&addr, T).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Read one response off a kept-alive connection: (status, head, body).
fn read_response(s: &mut TcpStream) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).expect("a response head"),
            1,
            "closed mid-head"
        );
        buf.push(b[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

fn words(n: usize) -> String {
    vec!["x"; n].join(" ")
}

#[test]
fn generate_echoes_markers_streams_and_serves_sglang_endpoints() {
    let s = HttpServed::start(&[LOOPBACK]);
    let h = s.http.clone();
    let (st, model) = get(&h, "/get_model_info");
    assert_eq!(st, 200);
    let model: Value = serde_json::from_str(&model).unwrap();
    assert_eq!(model["max_context_length"], 1024, "{model}");
    assert!(model["model_path"].is_string());
    let (st, info) = get(&h, "/get_server_info");
    assert_eq!(st, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    let nodes = info["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{info}");
    assert_eq!(nodes[0]["disaggregation_mode"], "prefill");
    assert_eq!(nodes[0]["max_total_num_tokens"], 512);
    assert_eq!(nodes[1]["disaggregation_mode"], "decode");
    assert_eq!(nodes[1]["disaggregation_enable_kv_checksum"], true);
    assert_eq!(info["mooncake_transfer_batch_max"], 4);
    assert_eq!(info["deferred_release"], true);
    let (st, metrics) = get(&h, "/metrics");
    assert_eq!(st, 200);
    assert!(
        metrics.contains("sglang:max_total_num_tokens{node=\"1\",role=\"prefill\"} 512"),
        "{metrics}"
    );
    assert!(metrics.contains("kvsim_pool_pages_free{node=\"2\",role=\"decode\"} 128"));
    assert!(
        metrics.contains("kvsim_pool_pages_quarantined{node=\"2\",role=\"decode\"} 0"),
        "{metrics}"
    );
    assert_eq!(get(&h, "/health").0, 200);
    assert_eq!(get(&h, "/nope").0, 404);

    // The marker comes back as the same text when the engine echoes position 0.
    let marker = "CANARY-small-1a2b3c4d";
    let (st, body) = post(
        &h,
        &format!(
            r#"{{"text":"{marker} {}","sampling_params":{{"max_new_tokens":4}}}}"#,
            words(40)
        ),
    );
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["text"].as_str().unwrap().starts_with(marker), "{v}");
    assert_eq!(v["meta_info"]["prompt_tokens"], 41);
    assert_eq!(v["meta_info"]["completion_tokens"], 4);
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "length");
    // The write-ups' body.
    let (st, body) = post(
        &h,
        &format!(
            r#"{{"model":"glm-5.3","max_tokens":3,"prompt":"CANARY-w-1 {}"}}"#,
            words(10)
        ),
    );
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("CANARY-w-1"), "{body}");
    // input_ids: the engine computes over the client's own ids (echo attention over
    // them), and the text is read from the ids it made.
    let (st, body) = post(
        &h,
        r#"{"input_ids":[5,6,7,900000],"sampling_params":{"max_new_tokens":2}}"#,
    );
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let out: Vec<u64> = v["output_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert!(
        out.len() == 2 && out.iter().all(|t| [5, 6, 7, 900000].contains(t)),
        "{v}"
    );
    assert!(v["text"].as_str().unwrap().contains("<id:"), "{v}");
    // Streaming: cumulative events (one per token, then the end with its finish
    // reason), then [DONE].
    let (st, body) = post(
        &h,
        r#"{"text":"a b c d e f g h","stream":true,"sampling_params":{"max_new_tokens":3}}"#,
    );
    assert_eq!(st, 200);
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.len(), 5, "{body}");
    assert_eq!(events[4], "[DONE]");
    let last: Value = serde_json::from_str(events[3]).unwrap();
    assert_eq!(last["meta_info"]["completion_tokens"], 3);
    assert_eq!(
        last["meta_info"]["finish_reason"]["type"], "length",
        "{last}"
    );
    assert_eq!(last["text"].as_str().unwrap().split(' ').count(), 3);
    // Over prefill's pool (512 tokens): its admission check refuses it with 400, and
    // the client reads the engine's words (prefill's reason, through the router).
    let (st, body) = post(&h, &format!(r#"{{"text":"{}"}}"#, words(700)));
    assert_eq!(st, 400, "{body}");
    assert!(
        body.contains("prompt of 700 tokens exceeds the admission limit of 512"),
        "{body}"
    );
    s.wait_quiescent();
    let (out, ok) = s.stop();
    assert!(ok && out.contains("drained"), "{out}");
}

#[test]
fn bad_requests_get_4xx_naming_the_field_and_leak_no_page() {
    let s = HttpServed::start(&[LOOPBACK]);
    let h = s.http.clone();
    let cases: Vec<(String, &str)> = vec![
        ("not json".into(), "body: not JSON"),
        ("[1,2]".into(), "body: must be a JSON object"),
        ("{}".into(), "give exactly one of text, input_ids, prompt"),
        (r#"{"text":"a","prompt":"b"}"#.into(), "got text, prompt"),
        (r#"{"text":""}"#.into(), "text: the prompt is empty"),
        (r#"{"text":"   "}"#.into(), "text: the prompt is empty"),
        (r#"{"prompt":""}"#.into(), "prompt: the prompt is empty"),
        (r#"{"text":5}"#.into(), "text: must be a string"),
        (r#"{"text":["a","b"]}"#.into(), "text: a batch"),
        (
            r#"{"input_ids":"abc"}"#.into(),
            "input_ids: must be an array",
        ),
        (
            r#"{"input_ids":[]}"#.into(),
            "input_ids: the prompt is empty",
        ),
        (r#"{"input_ids":[1,-2]}"#.into(), "input_ids: element 1"),
        (r#"{"input_ids":[1,1e99]}"#.into(), "input_ids: element 1"),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":-1}}"#.into(),
            "sampling_params.max_new_tokens: -1 is outside 1..=16",
        ),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":0}}"#.into(),
            "sampling_params.max_new_tokens: 0 is outside",
        ),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":1000000000000}}"#.into(),
            "sampling_params.max_new_tokens: 1000000000000 is outside",
        ),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":"many"}}"#.into(),
            "sampling_params.max_new_tokens: must be an integer",
        ),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":2.5}}"#.into(),
            "sampling_params.max_new_tokens: must be an integer",
        ),
        (
            r#"{"text":"a","sampling_params":7}"#.into(),
            "sampling_params: must be an object",
        ),
        (
            r#"{"prompt":"a","max_tokens":-5}"#.into(),
            "max_tokens: -5 is outside",
        ),
        (
            r#"{"text":"a","stream":"yes"}"#.into(),
            "stream: must be true or false",
        ),
        (
            r#"{"text":"a","model":3}"#.into(),
            "model: must be a string",
        ),
        // Over the context and over the pool: the engine refuses, and its reason (the
        // refusing half's, carried by the router's answer) names the limit.
        (
            format!(r#"{{"text":"{}"}}"#, words(5000)),
            "prompt of 5000 tokens",
        ),
        (
            format!(r#"{{"text":"{}"}}"#, words(513)),
            "prompt of 513 tokens",
        ),
    ];
    for (body, want) in &cases {
        let (st, answer) = post(&h, body);
        assert_eq!(st, 400, "{body:.80}: {answer}");
        assert!(
            answer.contains(want),
            "{body:.80}: want `{want}` in {answer}"
        );
        assert!(answer.contains("\"error\""), "{answer}");
        if want.starts_with("prompt of") {
            assert!(
                answer.contains("exceeds the admission limit of"),
                "the engine's words, not the front's: {answer}"
            );
        }
    }
    // Malformed HTTP: a body over the limit, a bad request line, chunked bodies.
    let big = raw(
        &h,
        b"POST /generate HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n",
    );
    assert!(
        big.starts_with("HTTP/1.1 413") && big.contains("body:"),
        "{big}"
    );
    let bad = raw(&h, b"GARBAGE\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let chunked = raw(
        &h,
        b"POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
    );
    assert!(
        chunked.starts_with("HTTP/1.1 400") && chunked.contains("body: not JSON"),
        "an empty chunked body is read, and is not JSON: {chunked}"
    );
    let wrong = raw(&h, b"PUT /generate HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(wrong.starts_with("HTTP/1.1 405"), "{wrong}");
    // A client that goes away mid-request: cancelled, not leaked.
    {
        let addr = kvsim_runtime::http_client::base_addr(&h).unwrap();
        let body = format!(
            r#"{{"text":"{}","sampling_params":{{"max_new_tokens":16}}}}"#,
            words(400)
        );
        let s =
            kvsim_runtime::http_client::send(addr, "POST", "/generate", Some(body.as_bytes()), T)
                .unwrap();
        std::thread::sleep(Duration::from_millis(2));
        drop(s);
    }
    // Every pool is whole again at quiescence, and the front counted its refusals.
    let st = s.wait_quiescent();
    assert!(st["nodes"].as_array().unwrap().len() == 3, "{st}");
    let (_, metrics) = get(&h, "/metrics");
    // The cases the engine refuses are not the front's; the empty chunked body is.
    let refused = format!("kvsim_http_rejected_by_front_total {}", cases.len() - 2 + 1);
    assert!(metrics.contains(&refused), "want `{refused}`:\n{metrics}");
    let (out, ok) = s.stop();
    assert!(ok, "{out}");
    assert!(out.contains("kvsim serve: drained"), "{out}");
}

#[test]
fn connections_keep_alive_continue_and_take_chunked_bodies() {
    let s = HttpServed::start(&[LOOPBACK]);
    let addr = kvsim_runtime::http_client::base_addr(&s.http).unwrap();
    let mut c = TcpStream::connect_timeout(&addr, T).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    let body = r#"{"text":"a b c","sampling_params":{"max_new_tokens":2}}"#;
    // Keep-alive: three requests on one connection, one of them chunked.
    for _ in 0..2 {
        write!(
            c,
            "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let (st, _, b) = read_response(&mut c);
        assert_eq!(st, 200, "{b}");
        assert_eq!(
            serde_json::from_str::<Value>(&b).unwrap()["meta_info"]["completion_tokens"],
            2
        );
    }
    let (a, b) = body.split_at(10);
    write!(
        c,
        "POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    )
    .unwrap();
    let (st, _, b) = read_response(&mut c);
    assert_eq!(st, 200, "a chunked body is read whole: {b}");
    // Expect: 100-continue: the server asks for the body, then answers.
    write!(
        c,
        "POST /generate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    let (st, head, _) = read_response(&mut c);
    assert_eq!(st, 100, "{head}");
    c.write_all(body.as_bytes()).unwrap();
    let (st, _, b) = read_response(&mut c);
    assert_eq!(st, 200, "{b}");
    // A streaming client gone after the reply's head (so the request reached the
    // engine): cancelled if it was still running; the pools are whole either way.
    let big = format!(
        r#"{{"text":"{}","stream":true,"sampling_params":{{"max_new_tokens":16}}}}"#,
        words(400)
    );
    let mut gone =
        kvsim_runtime::http_client::send(addr, "POST", "/generate", Some(big.as_bytes()), T)
            .unwrap();
    let mut head = [0u8; 12];
    gone.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    drop(gone);
    s.wait_quiescent();
    drop(c);
    let (st, m) = get(&s.http, "/metrics");
    assert_eq!(st, 200);
    assert!(m.contains("kvsim_http_requests_total 5"), "{m}");
    s.stop();
}

/// The front's limits, each at its bound: a head over 16 KiB (431), a body over
/// 16 MiB by its length or as chunks (413), a client that sends one byte a second
/// (cut off at the 10 s read deadline, in the head and in the body), connections over
/// `--http-max-connections` (503).
#[test]
fn every_limit_holds_at_its_bound() {
    use kvsim_runtime::http::{MAX_BODY, MAX_HEAD, READ_DEADLINE};
    assert_eq!((MAX_HEAD, MAX_BODY), (16 * 1024, 16 * 1024 * 1024));
    assert_eq!(READ_DEADLINE, Duration::from_secs(10));
    assert_eq!(kvsim_runtime::http::MAX_CONNECTIONS, 1024);
    let s = HttpServed::start(&[LOOPBACK, "--http-max-connections", "4"]);
    let h = s.http.clone();
    let addr = kvsim_runtime::http_client::base_addr(&h).unwrap();
    // A connection that was served (a closed one frees its place a moment after the
    // client sees it close: retried on 503 for a bounded time).
    let open = || {
        let end = Instant::now() + T;
        loop {
            let mut c = TcpStream::connect_timeout(&addr, T).unwrap();
            c.set_read_timeout(Some(T)).unwrap();
            c.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
            let (st, _, b) = read_response(&mut c);
            if st == 200 {
                return c;
            }
            assert!(st == 503 && Instant::now() < end, "{st} {b}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // A head over the limit.
    let mut big = b"GET /health HTTP/1.1\r\nX: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
    big.extend(b"\r\n\r\n");
    let r = raw(&h, &big);
    assert!(r.starts_with("HTTP/1.1 431"), "{r:.200}");
    // A head just under it is served.
    let mut ok = b"GET /health HTTP/1.1\r\nConnection: close\r\nX: ".to_vec();
    ok.extend(std::iter::repeat_n(b'a', MAX_HEAD - 200));
    ok.extend(b"\r\n\r\n");
    let r = raw(&h, &ok);
    assert!(r.starts_with("HTTP/1.1 200"), "{r:.200}");
    // A chunked body that passes the limit: 413 once it does.
    {
        let mut c = TcpStream::connect_timeout(&addr, T).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = write!(
                w,
                "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            let chunk = vec![b' '; 1 << 20];
            for _ in 0..17 {
                if write!(w, "{:x}\r\n", chunk.len()).is_err() || w.write_all(&chunk).is_err() {
                    return;
                }
                let _ = w.write_all(b"\r\n");
            }
            let _ = w.write_all(b"0\r\n\r\n");
        });
        let (st, _, b) = read_response(&mut c);
        assert_eq!(st, 413, "{b}");
        assert!(b.contains("over the limit of 16777216 bytes"), "{b}");
        drop(c);
        let _ = writer.join();
    }
    // Slow clients run alongside the rest: one byte a second, in the head and in the body.
    let slow = |prefix: &'static [u8]| {
        let mut c = TcpStream::connect_timeout(&addr, T).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(900)))
            .unwrap();
        c.write_all(prefix).unwrap();
        std::thread::spawn(move || {
            let mut sent = 0;
            let mut got = Vec::new();
            loop {
                let mut b = [0u8; 512];
                match c.read(&mut b) {
                    Ok(0) => return (sent, String::from_utf8_lossy(&got).into_owned()),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return (sent, String::from_utf8_lossy(&got).into_owned()),
                }
                if c.write_all(b"a").is_err() || sent > 60 {
                    return (sent, String::from_utf8_lossy(&got).into_owned());
                }
                sent += 1;
            }
        })
    };
    let head_slow = slow(b"POST /generate HTTP/1.1\r\nX-Slow: ");
    let body_slow = slow(b"POST /generate HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"text\":\"");
    // Connections: four are served (two slow clients, two kept alive here), the fifth
    // gets 503 until one closes.
    let mut held = vec![open(), open()];
    let r = raw(&h, b"GET /health HTTP/1.1\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 503") && r.contains("too many open connections"),
        "{r}"
    );
    // (The two slow clients hold connections too until the deadline cuts them off.)
    let (head_sent, head_got) = head_slow.join().unwrap();
    let (body_sent, body_got) = body_slow.join().unwrap();
    assert!(
        (9..=30).contains(&head_sent),
        "a head at one byte a second is cut off at 10 s: {head_sent} bytes sent, got {head_got}"
    );
    assert!(
        (9..=30).contains(&body_sent) && body_got.starts_with("HTTP/1.1 408"),
        "a body at one byte a second gets 408 at 10 s: {body_sent} bytes sent, got {body_got}"
    );
    held.pop();
    held.push(open());
    drop(held);
    s.stop();
}

#[test]
fn preflight_reads_a_running_server_a_scenario_and_hand_numbers() {
    let s = HttpServed::start(&[LOOPBACK]);
    let o = kvsim(&["preflight", "--url", &s.http]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("FAIL pool>=context") && out.contains("pool 512 < context 1024"),
        "{out}"
    );
    assert!(out.contains("pool 2048 >= context 1024"), "{out}");
    assert!(out.contains("PASS kv-checksum"), "{out}");
    assert!(
        out.contains("mooncake_transfer_batch_max 4 <= bound 64"),
        "{out}"
    );
    // A tighter batch bound fails the transfer-batch condition.
    let o = kvsim(&["preflight", "--url", &s.http, "--batch-max", "2"]);
    assert!(text(&o).contains("FAIL transfer-batch"), "{}", text(&o));
    s.stop();

    let o = kvsim(&["preflight", "--scenario", "scenarios/glm53-incident.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("pool 681280 < context 1048576"), "{out}");
    let o = kvsim(&["preflight", "--pool", "681280", "--context", "1048576"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("pool 681280 < context 1048576"));
    let o = kvsim(&["preflight", "--pool", "2097152", "--context", "1048576"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Unreachable: exit 2 naming the URL.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let o = kvsim(&["preflight", "--url", &url]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("unreachable"), "{}", text(&o));
    // A server without the pool metric: exit 2 naming the metric.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", fake.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut c in fake.incoming().map_while(Result::ok).take(3) {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let body = r#"{"max_context_length": 4096}"#;
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let o = kvsim(&["preflight", "--url", &url]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no sglang:max_total_num_tokens"),
        "{}",
        text(&o)
    );
}

#[test]
fn canary_is_clean_on_the_defended_engine_and_catches_the_incident() {
    let s = HttpServed::start(&[LOOPBACK]);
    let json = tmp_in("http-canary", "clean.json");
    let o = kvsim(&[
        "canary",
        "--url",
        &s.http,
        "--requests",
        "24",
        "--concurrency",
        "4",
        "--over-length",
        "4",
        "--disconnect-rate",
        "0.2",
        "--seed",
        "7",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("canary: PASS") && out.contains("400: 4"),
        "{out}"
    );
    assert!(
        out.contains("disconnected"),
        "seeded disconnects happen: {out}"
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["pass"], true);
    assert_eq!(report["requests"], 28, "{report}");
    // --duration keeps running rounds (fresh markers each round) until it passes.
    let o = kvsim(&[
        "canary",
        "--url",
        &s.http,
        "--requests",
        "4",
        "--over-length",
        "1",
        "--duration",
        "0.5",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = report["requests"].as_u64().unwrap();
    assert!(
        n > 5 && n.is_multiple_of(5),
        "whole rounds of 5, more than one: {report}"
    );
    let o = kvsim(&[
        "canary",
        "--url",
        &s.http,
        "--api",
        "openai",
        "--requests",
        "8",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("canary: PASS"), "{}", text(&o));
    s.wait_quiescent();
    let (o2, ok) = s.stop();
    assert!(ok, "{o2}");

    let s = HttpServed::start(&[INCIDENT_SC, "--bugs", BUGS]);
    let o = kvsim(&[&["canary", "--url", &s.http, "--quiet"][..], &LEAK_LOAD].concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("LEAK: reply to request"), "{out}");
    assert!(out.contains("carried marker CANARY-short"), "{out}");
    assert!(out.contains("OVER-LENGTH ANSWERED 200"), "{out}");
    // The same canary over the OpenAI API finds the same leak.
    let openai = ["canary", "--url", &s.http, "--api", "openai", "--quiet"];
    let o = kvsim(&[&openai[..], &LEAK_LOAD].concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("LEAK: reply to request"), "{out}");
    s.stop();

    // The same bugs with page tags on: the stale reads are refused (500), nothing
    // leaks, and /metrics counts the refusals at decode.
    // The same load that found the leak above.
    let s = HttpServed::start(&[LOOPBACK, "--bugs", BUGS]);
    let o = kvsim(&[&["canary", "--url", &s.http, "--quiet"][..], &LEAK_LOAD].concat());
    let out = text(&o);
    assert!(!out.contains("LEAK:"), "{out}");
    assert!(out.contains("500: 2"), "{out}");
    let (_, metrics) = get(&s.http, "/metrics");
    assert!(
        metrics.contains("kvsim_tag_mismatches_refused_total{node=\"2\",role=\"decode\"} 2"),
        "{metrics}"
    );
    s.stop();
}

/// The write-ups' scripts, unmodified. Their host names (`prefill:30000`,
/// `localhost:30000`) reach the server through the standard proxy variables: the
/// server's front accepts proxy-form request lines, so no name resolution or fixed
/// port is needed.
fn script(cmd: &str, file: &str, http: &str, bin: &std::path::Path) -> (bool, String) {
    let o = Command::new(cmd)
        .arg(root().join("tests/writeups").join(file))
        .current_dir(root())
        .env("HTTP_PROXY", http)
        .env("http_proxy", http)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("the script runs");
    let mut out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&o.stderr));
    (o.status.success(), out)
}

#[test]
fn the_writeups_scripts_run_unmodified() {
    // `kubectl` has no cluster here: a stand-in that says so (the script goes on).
    let bin = tmp_in("http-writeups", "bin");
    std::fs::create_dir_all(&bin).unwrap();
    let kubectl = bin.join("kubectl");
    std::fs::write(
        &kubectl,
        "#!/bin/sh\necho 'kubectl: no cluster in this test' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();

    let s = HttpServed::start(&[LOOPBACK]);
    const TEST: &str = "the_writeups_scripts_run_unmodified";
    let tools = ["curl", "jq"].map(|t| kvsim_testenv::tool(TEST, kvsim_testenv::Need::Tools, t));
    if tools.iter().all(Option::is_some) {
        let (_, out) = script("bash", "pool_check.sh", &s.http, &bin);
        assert!(
            out.lines().any(|l| l.trim() == "1024"),
            "jq prints the context: {out}"
        );
        assert!(
            out.contains("sglang:max_total_num_tokens{node=\"1\",role=\"prefill\"} 512"),
            "{out}"
        );
    }
    let Some(py) = python_with(TEST, "requests") else {
        s.stop();
        return;
    };
    let (ok, out) = script(&py, "canary.py", &s.http, &bin);
    assert!(ok, "the defended engine is clean: {out}");
    let (_, metrics) = get(&s.http, "/metrics");
    assert!(
        metrics.contains("kvsim_http_responses_total{status=\"400\"} 1"),
        "the script's 700,000-token prompt was refused: {metrics}"
    );
    s.wait_quiescent();
    s.stop();

    // The vulnerable engine: the script passes (it cannot see this leak: it searches
    // only the short reply, and the leaking reply is the long one's); kvsim canary on
    // the same server fails.
    let s = HttpServed::start(&[INCIDENT_SC, "--bugs", BUGS]);
    let (ok, out) = script(&py, "canary.py", &s.http, &bin);
    assert!(ok, "{out}");
    let (_, metrics) = get(&s.http, "/metrics");
    assert!(
        metrics.contains("kvsim_http_responses_total{status=\"200\"} 2"),
        "the over-length prompt was answered 200 and the script did not notice: {metrics}"
    );
    let o = kvsim(&["canary", "--url", &s.http, "--requests", "32", "--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("LEAK:"), "{}", text(&o));
    s.stop();
}

#[test]
fn the_openai_python_client_gets_completions_chats_and_streams() {
    let s = HttpServed::start(&[LOOPBACK]);
    let h = s.http.clone();
    // The API by hand: models, an error in OpenAI's shape.
    let (st, models) = get(&h, "/v1/models");
    assert_eq!(st, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "kvsim/serve-loopback", "{models}");
    let r = fetch(
        &h,
        "POST",
        "/v1/chat/completions",
        Some(br#"{"messages":[{"role":"user","content":"a"}],"max_tokens":"x"}"#),
        T,
    )
    .unwrap();
    assert_eq!(r.status, 400);
    let e: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(e["error"]["param"], "max_tokens", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let r = fetch(
        &h,
        "POST",
        "/v1/completions",
        Some(br#"{"max_tokens":2}"#),
        T,
    )
    .unwrap();
    assert!(
        r.text().contains("prompt: a prompt is required"),
        "{}",
        r.text()
    );
    // The engine's reason for an error (the refusing half's, through the router's
    // answer), in OpenAI's error shape and in a stream's error event.
    let long = format!(r#"{{"prompt":"{}","max_tokens":2}}"#, words(513));
    let r = fetch(&h, "POST", "/v1/completions", Some(long.as_bytes()), T).unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    let e: Value = serde_json::from_slice(&r.body).unwrap();
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("prompt of 513 tokens") && msg.contains("admission limit of 512"),
        "{e}"
    );
    let long = format!(r#"{{"text":"{}","stream":true}}"#, words(513));
    let r = fetch(&h, "POST", "/generate", Some(long.as_bytes()), T).unwrap();
    assert!(
        r.text().contains("exceeds the admission limit of 512"),
        "{}",
        r.text()
    );
    let Some(py) = python_with(
        "the_openai_python_client_gets_completions_chats_and_streams",
        "openai",
    ) else {
        s.stop();
        return;
    };
    let o = Command::new(&py)
        .arg(root().join("tests/clients/openai_client.py"))
        .arg(format!("{h}/v1"))
        .output()
        .expect("python runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let checks: BTreeMap<String, Value> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["check"].as_str().unwrap().to_string(), v))
        .collect();
    let c = &checks["completion"];
    assert!(
        c["text"].as_str().unwrap().starts_with("CANARY-oa-1"),
        "{c}"
    );
    assert_eq!(c["finish"], "length");
    assert_eq!(c["usage"]["prompt_tokens"], 5);
    assert_eq!(c["usage"]["completion_tokens"], 3);
    assert_eq!(c["usage"]["total_tokens"], 8);
    let chat = &checks["chat"];
    assert_eq!(chat["role"], "assistant");
    assert_eq!(chat["usage"]["completion_tokens"], 4, "{chat}");
    let st = &checks["completion-stream"];
    assert_eq!(
        st["deltas"].as_array().unwrap().len(),
        4,
        "three tokens and the end: {st}"
    );
    assert_eq!(st["usage"]["completion_tokens"], 3, "{st}");
    let joined: String = st["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(
        joined.split(' ').count(),
        3,
        "deltas carry only the new text: {st}"
    );
    assert_eq!(checks["chat-stream"]["parts"].as_array().unwrap().len(), 3);
    let e = &checks["error"];
    assert_eq!(e["status"], 400);
    assert_eq!(e["param"], "max_tokens", "{e}");
    s.wait_quiescent();
    s.stop();
}

/// `kvsim bench-http` drives the front with its own raw client and with ureq, JSON
/// and streamed: every request answered 200, counted.
#[test]
fn bench_http_drives_the_front_with_either_client() {
    let s = HttpServed::start(&[LOOPBACK]);
    let modes: [&[&str]; 4] = [
        &[],
        &["--stream"],
        &["--client", "ureq"],
        &["--client", "ureq", "--stream"],
    ];
    for extra in modes {
        let mut args = vec![
            "bench-http",
            &s.http,
            "--concurrency",
            "2",
            "--requests",
            "5",
            "--prompt-len",
            "8",
        ];
        args.extend(extra);
        let o = kvsim(&args);
        let out = text(&o);
        assert!(
            o.status.success() && out.contains("10 requests") && out.contains("not 200: []"),
            "{extra:?}: {out}"
        );
    }
    s.wait_quiescent();
    s.stop();
}
