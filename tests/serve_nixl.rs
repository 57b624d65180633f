//! `kvsim serve --transport nixl`: KV over NVIDIA's NIXL library (the pinned
//! `nixl-cu12` wheel's UCX backend over TCP on loopback; runtime/src/nixl/). The same
//! checks as the TCP transport's serve tests: a canary load answered clean, every
//! pool whole after SIGTERM, the audit of the server's own traces clean; and with the
//! incident's bug switches, the leak, which the audit names. A machine without the
//! wheel, or a `kvsim` built without the `nixl` feature, skips (a failure under
//! `KVSIM_REQUIRE_NIXL=1`, which `cargo xtask test` sets).

mod cli;

use cli::{kvsim, text, tmp_in, Served};
use kvsim_runtime::{Answer, Client, Reply};
use std::path::{Path, PathBuf};

const LOOPBACK: &str = "tests/serve/loopback.toml";
const INCIDENT_SC: &str = "tests/serve/incident.toml";

/// The server's environment for NIXL: the wheel's libraries, UCX over TCP on `lo`.
fn nixl_env(test: &str) -> Option<Vec<(&'static str, String)>> {
    let lib = kvsim_testenv::nixl_lib_dir(test, cfg!(feature = "nixl"))?;
    Some(vec![
        ("LD_LIBRARY_PATH", lib.display().to_string()),
        ("UCX_TLS", "tcp".to_string()),
        ("UCX_NET_DEVICES", "lo".to_string()),
    ])
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = tmp_in("serve-nixl", name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn audit(dir: &Path) -> (String, Option<i32>) {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("trace dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "one trace file per node: {files:?}");
    let mut args = vec!["audit"];
    args.extend(files.iter().map(String::as_str));
    let out = kvsim(&args);
    (text(&out), out.status.code())
}

fn reply(a: Answer) -> Reply {
    match a {
        Answer::Reply(r) => r,
        Answer::Error(e) => panic!("the server refused the request: {e}"),
    }
}

/// The defended engine over NIXL under the canary's load (several clients, over-length
/// prompts, disconnects): no reply carries another request's marker, every
/// over-length prompt gets 400, SIGTERM drains with every page of both pools free,
/// and the audit of the server's traces (the landings recorded at each transfer's
/// completion) is clean.
#[test]
fn nixl_serve_is_clean_and_every_pool_whole_after_sigterm() {
    let Some(env) = nixl_env("nixl_serve_is_clean_and_every_pool_whole_after_sigterm") else {
        return;
    };
    let dir = fresh_dir("clean");
    let dir_s = dir.display().to_string();
    let args = [LOOPBACK, "--gpu", "host", "--transport", "nixl"];
    let mut s = Served::start_env(
        &[&args[..], &["--prompts", "canary", "--trace-json", &dir_s]].concat(),
        &env,
    );
    let addr = s.endpoint().to_string();
    let o = kvsim(&["canary-client", &addr, "--seconds", "3", "--seed", "41"]);
    let load = text(&o);
    assert!(o.status.success(), "{load}");
    assert!(load.contains("\"foreign_marker\":0"), "{load}");
    assert!(load.contains("\"over_length_200\":0"), "{load}");
    assert!(load.contains("\"200\":"), "no request answered 200: {load}");

    let (out, ok) = s.stop("-TERM");
    assert!(ok, "kvsim serve did not drain cleanly:\n{out}");
    assert!(out.contains("32 of 32 pages free, 0 held"), "{out}");
    assert!(out.contains("128 of 128 pages free, 0 held"), "{out}");
    let (report, code) = audit(&dir);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("verdict: CLEAN"), "{report}");
    assert!(report.contains("run end: drained"), "{report}");
}

/// The incident's bug switches over NIXL: the over-length prompt gets 200 carrying the
/// earlier request's marker (the leak), and the audit names it (S3) and exits 1.
#[test]
fn nixl_serve_with_the_incident_bugs_leaks_and_audit_names_it() {
    let Some(env) = nixl_env("nixl_serve_with_the_incident_bugs_leaks_and_audit_names_it") else {
        return;
    };
    let dir = fresh_dir("leak");
    let dir_s = dir.display().to_string();
    let bugs = "gate-checks-finished-only,no-length-agreement";
    let args = [INCIDENT_SC, "--gpu", "host", "--transport", "nixl"];
    let rest = [
        "--prompts",
        "canary",
        "--bugs",
        bugs,
        "--trace-json",
        &dir_s,
    ];
    let mut s = Served::start_env(&[&args[..], &rest[..]].concat(), &env);
    let addr = s.endpoint();
    let mut c = Client::connect(addr, cli::SERVE_WAIT).unwrap();
    let first = reply(c.request(300, 4).unwrap());
    assert_eq!(first.status, 200);
    let over = reply(c.request(700, 8).unwrap());
    assert_eq!(
        over.status, 200,
        "the bugs let the over-length prompt through"
    );
    let owners: Vec<u64> = over
        .tokens
        .iter()
        .filter_map(|t| kvsim_oracle::canary::owner(*t))
        .map(|r| r.0)
        .collect();
    assert!(
        owners.contains(&first.req),
        "the leak: request {} must echo request {}'s marker: {over:?}",
        over.req,
        first.req
    );
    let (out, _) = s.stop("-INT");
    assert!(out.contains("pages each pool holds at exit"), "{out}");
    let (report, code) = audit(&dir);
    assert_eq!(code, Some(1), "{report}");
    assert!(report.contains("VIOLATED S3"), "{report}");
}
