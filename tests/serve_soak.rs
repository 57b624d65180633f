//! A soak of one `kvsim serve --http` server: many requests over kept-alive
//! connections, every reply checked (200, computed over the request's own ids), and
//! the server's resident memory read at the start and the end. No request limit over
//! a server's life: the canary scheme's 65,535 does not apply to the request's own
//! tokens.
//!
//! The default test sends 4,000 requests; the full soak (120,000, several minutes in
//! a debug build on two cores) is ignored by default:
//!   cargo test --release --test serve_soak -- --ignored --nocapture

mod cli;

use cli::Served;
use kvsim_runtime::http_client::{agent, fetch_with};
use serde_json::Value;
use std::time::Duration;

const LOOPBACK: &str = "tests/serve/loopback.toml";
const THREADS: usize = 8;

/// Resident memory of a process, in KiB (`VmRSS` of /proc; `None` off Linux).
fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Send `n` requests from each of [`THREADS`] threads; every reply must be 200 with
/// tokens from the request's own ids.
fn load(base: &str, n: usize, salt: usize) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let a = agent(Duration::from_secs(30));
                for i in 0..n {
                    let ids: Vec<u64> = (0..8)
                        .map(|k| ((salt + t * 7 + i + k) % 5000) as u64 + 1)
                        .collect();
                    let body = serde_json::json!({"input_ids": ids,
                        "sampling_params": {"max_new_tokens": 2}});
                    let r = fetch_with(
                        &a,
                        base,
                        "POST",
                        "/generate",
                        Some(body.to_string().as_bytes()),
                    )
                    .expect("a reply");
                    assert_eq!(r.status, 200, "{}", r.text());
                    let v: Value = serde_json::from_slice(&r.body).unwrap();
                    let own = v["output_ids"].as_array().is_some_and(|o| {
                        o.len() == 2 && o.iter().all(|x| ids.contains(&x.as_u64().unwrap_or(0)))
                    });
                    assert!(
                        own,
                        "reply not computed over the request's ids {ids:?}: {v}"
                    );
                }
            });
        }
    });
}

fn soak(total: usize) {
    let mut s = Served::start(&[LOOPBACK, "--http", "127.0.0.1:0"]);
    let h = s.wait_for("http front", kvsim::serve::http_of);
    let base = format!("http://{h}");
    let pid = s.child.id();
    // Warm up (allocator arenas, the vocabulary, connection state), then measure.
    load(&base, 250, 0);
    let start = rss_kib(pid);
    let per = total.div_ceil(THREADS);
    load(&base, per, 1);
    let end = rss_kib(pid);
    let sent = 250 * THREADS + per * THREADS;
    eprintln!("soak: {sent} requests; RSS at start {start:?} KiB, at end {end:?} KiB");
    if let (Some(a), Some(b)) = (start, end) {
        assert!(
            b <= a + 32 * 1024,
            "resident memory grew from {a} KiB to {b} KiB over {sent} requests"
        );
    }
    let (out, ok) = s.stop("-TERM");
    assert!(ok && out.contains("drained"), "{out}");
}

#[test]
fn a_server_answers_thousands_of_requests_with_memory_bounded() {
    soak(4000);
}

#[test]
#[ignore = "the full soak: more than 100,000 requests (minutes); see the module doc"]
fn a_server_answers_over_100000_requests_with_memory_bounded() {
    soak(120_000);
}
