//! Nothing lost at shutdown under load: one `kvsim serve --http` server (router,
//! prefill and decode nodes in one process, its trace written per node), several
//! client threads sending `/generate` requests over kept-alive connections, and
//! SIGTERM while the load is running. Then every request is accounted for:
//!
//! - from the clients' side each request ends in exactly one of: a 200 whose tokens
//!   are computed over the request's own ids (echo attention: every output id is one
//!   of the prompt's), a clean refusal (503: intake closed, the server is shutting
//!   down), or no HTTP answer at all (the connection was refused, reset or closed
//!   with no reply);
//! - from the server's side (the router's trace, `n0-e0.jsonl`): every `submit` has
//!   exactly one `response`, and none has two;
//! - cross-checked: the clients got exactly as many 200s as the trace shows 200
//!   responses, and at least as many replies of each other status (a 503 refused at
//!   the closed intake, before it is submitted, is not in the trace). So a request
//!   that got no HTTP answer is one the server never answered: had it been answered
//!   (a `response` in the trace) and its reply lost on the way out (the process
//!   exiting before its front wrote it), the trace would show more 200s than the
//!   clients got;
//! - the server exits 0 having drained (`kvsim serve: drained`, every pool whole) and
//!   `kvsim audit` over its traces is clean, with liveness judged (`run end: drained`).
//!
//! What makes it fail: a request answered twice or never (trace counts), a reply lost
//! after the server answered it (client 200s below the trace's), a 200 carrying tokens
//! that are not the request's own, a status other than 200 or 503, a server that does
//! not drain or exits non-zero, or an audit finding. What it cannot tell apart: a
//! request refused before it was read (connection refused, or reset with the request
//! unread) from one read and dropped before the front submitted it; both are "never
//! accepted", which is what the trace's `submit` count pins.

mod cli;

use cli::{kvsim, text, tmp_in, Served};
use kvsim_runtime::http_client::{agent, fetch_with};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LOOPBACK: &str = "tests/serve/loopback.toml";
const THREADS: usize = 6;
/// Requests per client thread at most (the load ends earlier when the server is gone).
const PER_THREAD: usize = 1000;
/// SIGTERM once this many requests were answered 200.
const TERM_AFTER: usize = 2500;

/// How one request ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    /// 200 with tokens from the request's own ids.
    Ok,
    /// 200 with a token not among the request's ids (a wrong reply).
    Foreign(String),
    /// Another HTTP status.
    Status(u16),
    /// No HTTP reply: the error's text.
    NoReply(String),
}

fn client(base: &str, t: usize, ok: &AtomicUsize, stop: &AtomicBool) -> Vec<Seen> {
    let a = agent(Duration::from_secs(30));
    let mut seen = Vec::new();
    for i in 0..PER_THREAD {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let ids: Vec<u64> = (0..8)
            .map(|k| ((t * 1000 + i * 8 + k) % 60_000) as u64 + 1)
            .collect();
        let body = serde_json::json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}});
        let s = match fetch_with(
            &a,
            base,
            "POST",
            "/generate",
            Some(body.to_string().as_bytes()),
        ) {
            Ok(r) if r.status == 200 => {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let own = v["output_ids"].as_array().is_some_and(|o| {
                    o.len() == 2 && o.iter().all(|x| ids.contains(&x.as_u64().unwrap_or(0)))
                });
                if own {
                    ok.fetch_add(1, Ordering::Relaxed);
                    Seen::Ok
                } else {
                    Seen::Foreign(format!("ids {ids:?}: {}", r.text()))
                }
            }
            Ok(r) => Seen::Status(r.status),
            Err(e) => Seen::NoReply(e.to_string()),
        };
        let gone = matches!(s, Seen::NoReply(_));
        seen.push(s);
        // The server is gone (its process exited): nothing more can be accepted.
        if gone {
            break;
        }
    }
    seen
}

/// Count the router trace's `submit` and `response` records per request id.
fn trace_counts(path: &std::path::Path) -> (BTreeMap<u64, (u32, u32)>, BTreeMap<u64, u64>) {
    let text = std::fs::read_to_string(path).expect("the router's trace");
    let mut per: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
    let mut statuses: BTreeMap<u64, u64> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        match v["type"].as_str() {
            Some("submit") => {
                let req = v["req"].as_u64().expect("submit.req");
                per.entry(req).or_default().0 += 1;
            }
            Some("response") => {
                let req = v["req"].as_u64().expect("response.req");
                per.entry(req).or_default().1 += 1;
                let st = v["status"].as_u64().expect("response.status");
                *statuses.entry(st).or_default() += 1;
            }
            _ => {}
        }
    }
    (per, statuses)
}

#[test]
fn sigterm_under_load_answers_every_accepted_request_once() {
    let dir = tmp_in("shutdown", "traces");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.display().to_string();
    let mut s = Served::start(&[LOOPBACK, "--http", "127.0.0.1:0", "--trace-json", &dir_s]);
    let h = s.wait_for("http front", kvsim::serve::http_of);
    let base = format!("http://{h}");
    let (ok, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let t0 = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (base, ok, stop) = (base.clone(), ok.clone(), stop.clone());
            std::thread::spawn(move || client(&base, t, &ok, &stop))
        })
        .collect();
    // SIGTERM under load: once enough were answered (bounded wait).
    let end = Instant::now() + Duration::from_secs(60);
    while ok.load(Ordering::Relaxed) < TERM_AFTER {
        assert!(
            Instant::now() < end,
            "only {} answered 200 in 60 s",
            ok.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let at_term = ok.load(Ordering::Relaxed);
    let term_at = t0.elapsed();
    let (out, exited_ok) = s.stop("-TERM");
    stop.store(true, Ordering::Relaxed);
    let mut seen: Vec<Seen> = Vec::new();
    for w in workers {
        seen.extend(w.join().expect("a client thread"));
    }
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for x in &seen {
        let k = match x {
            Seen::Ok => "200".to_string(),
            Seen::Foreign(_) => "200 FOREIGN".to_string(),
            Seen::Status(s) => s.to_string(),
            Seen::NoReply(_) => "no reply".to_string(),
        };
        *tally.entry(k).or_default() += 1;
    }
    let no_reply: Vec<&Seen> = seen
        .iter()
        .filter(|x| matches!(x, Seen::NoReply(_)))
        .collect();
    eprintln!(
        "shutdown under load: {} requests sent by {THREADS} clients; SIGTERM at {:.2} s after \
         {at_term} answered 200; clients saw {tally:?}; no-reply errors: {no_reply:?}",
        seen.len(),
        term_at.as_secs_f64()
    );
    assert!(exited_ok, "kvsim serve did not exit 0:\n{out}");
    assert!(out.contains("kvsim serve: drained"), "{out}");
    assert!(out.contains("32 of 32 pages free, 0 held"), "{out}");
    assert!(out.contains("128 of 128 pages free, 0 held"), "{out}");
    let foreign: Vec<&Seen> = seen
        .iter()
        .filter(|x| matches!(x, Seen::Foreign(_)))
        .collect();
    assert!(foreign.is_empty(), "200s with foreign tokens: {foreign:?}");
    let odd: Vec<&Seen> = seen
        .iter()
        .filter(|x| matches!(x, Seen::Status(s) if *s != 503))
        .collect();
    assert!(odd.is_empty(), "statuses other than 200 and 503: {odd:?}");
    // At most one request per client thread can end with no reply: it stops there.
    assert!(no_reply.len() <= THREADS, "{no_reply:?}");

    // The server's side: every submitted request answered exactly once.
    let (per, statuses) = trace_counts(&dir.join("n0-e0.jsonl"));
    let submitted = per.values().filter(|(s, _)| *s > 0).count();
    let bad: Vec<(&u64, &(u32, u32))> = per.iter().filter(|(_, c)| **c != (1, 1)).collect();
    eprintln!(
        "shutdown under load: the router's trace: {submitted} submitted, responses by status \
         {statuses:?}"
    );
    assert!(
        bad.is_empty(),
        "requests not submitted and answered exactly once (submits, responses): {bad:?}"
    );
    // Cross-check: every 200 the server sent reached its client; every other status in
    // the trace reached a client too (the clients may have more 503s: those refused at
    // the closed intake are not submitted).
    let client_200 = tally.get("200").copied().unwrap_or(0);
    assert_eq!(
        statuses.get(&200).copied().unwrap_or(0),
        client_200 as u64,
        "200s in the trace vs 200s the clients got"
    );
    for (st, n) in &statuses {
        let got = tally.get(&st.to_string()).copied().unwrap_or(0) as u64;
        assert!(
            got >= *n,
            "status {st}: {n} in the trace, {got} at the clients"
        );
    }
    assert_eq!(
        submitted as u64,
        statuses.values().sum::<u64>(),
        "submitted vs answered"
    );

    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("trace dir")
        .map(|e| e.expect("an entry").path().display().to_string())
        .collect();
    files.sort();
    let mut args = vec!["audit"];
    args.extend(files.iter().map(String::as_str));
    let o = kvsim(&args);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(0), "{report}");
    assert!(report.contains("verdict: CLEAN"), "{report}");
    assert!(report.contains("run end: drained"), "{report}");
}
