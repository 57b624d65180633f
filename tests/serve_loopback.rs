//! `kvsim serve` for real, on loopback: the engine's nodes on threads and TCP, clients
//! over the line-JSON endpoint, SIGTERM/SIGINT, and `kvsim audit` over the per-node
//! traces the server wrote itself. Every wait has a timeout; ports are ephemeral.

mod cli;

use cli::{kvsim, root, text, tmp_in, Served};
use kvsim_engine::ids::RequestId;
use kvsim_runtime::{Answer, Client, Reply};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

const LOOPBACK: &str = "tests/serve/loopback.toml";
const INCIDENT_SC: &str = "tests/serve/incident.toml";
const T: Duration = cli::SERVE_WAIT;

fn reply(a: Answer) -> Reply {
    match a {
        Answer::Reply(r) => r,
        Answer::Error(e) => panic!("the server refused the request: {e}"),
    }
}

/// Which requests' prompts the reply's tokens came from (canary markers).
fn owners(r: &Reply) -> Vec<RequestId> {
    let mut o: Vec<RequestId> = r
        .tokens
        .iter()
        .filter_map(|t| kvsim_oracle::canary::owner(*t))
        .collect();
    o.dedup();
    o
}

fn traces(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("trace dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

fn audit(dir: &Path) -> (String, Option<i32>) {
    let files = traces(dir);
    let mut args = vec!["audit".to_string()];
    args.extend(files.iter().map(|p| p.display().to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kvsim(&refs);
    (text(&out), out.status.code())
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = tmp_in("serve", name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The defended engine served for real: normal and over-length prompts from several
/// clients at once and a client that disconnects mid-request; every over-length prompt
/// gets 400, no reply carries another request's marker, SIGTERM drains with every pool
/// page free, and the audit of the server's own traces is clean.
#[test]
fn serve_answers_clients_and_its_trace_audits_clean() {
    let dir = fresh_dir("clean");
    let dir_s = dir.display().to_string();
    let mut s = Served::start(&[LOOPBACK, "--prompts", "canary", "--trace-json", &dir_s]);
    let addr = s.endpoint();

    let mut c = Client::connect(addr, T).unwrap();
    let status = c.status().unwrap();
    assert_eq!(status["bugs"], serde_json::json!([]), "{status}");
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );

    // Four clients at once, each with fitting and over-length prompts (the prefill
    // pool holds 512 tokens).
    let workers: Vec<_> = (0..4)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, T).unwrap();
                let mut got = Vec::new();
                for i in 0..6u64 {
                    let over = (i + w) % 3 == 0;
                    let len = if over { 600 + 40 * i } else { 20 + 37 * i + w };
                    let r = reply(c.request(len, 1 + (i as u32 % 8)).unwrap());
                    got.push((over, len, r));
                }
                got
            })
        })
        .collect();
    // A client that goes away mid-request: its request is cancelled, not leaked.
    {
        let mut gone = Client::connect(addr, T).unwrap();
        let _ = gone.raw_send(r#"{"prompt_len": 400, "max_new_tokens": 16}"#);
    }
    // A line that is not a request is refused with the reason.
    match c.raw(r#"{"prompt_len": "x"}"#).unwrap() {
        Answer::Error(e) => assert!(
            e.contains("prompt_len") || e.contains("invalid type"),
            "{e}"
        ),
        Answer::Reply(r) => panic!("a bad line got a reply: {r:?}"),
    }
    let mut n_ok = 0;
    for w in workers {
        for (over, len, r) in w.join().expect("client thread") {
            if over {
                assert_eq!(r.status, 400, "over-length prompt of {len} tokens: {r:?}");
                assert!(r.tokens.is_empty());
            } else {
                assert_eq!(r.status, 200, "prompt of {len} tokens: {r:?}");
                n_ok += 1;
                let own = RequestId(r.req);
                assert!(
                    owners(&r).iter().all(|o| *o == own),
                    "reply to {own} carries another request's marker: {r:?}"
                );
            }
        }
    }
    assert!(n_ok >= 12, "only {n_ok} fitting requests answered 200");

    let (out, ok) = s.stop("-TERM");
    assert!(ok, "kvsim serve did not drain cleanly:\n{out}");
    assert!(
        out.contains("drained; pages each pool holds at exit"),
        "{out}"
    );
    assert!(out.contains("32 of 32 pages free, 0 held"), "{out}");
    assert!(out.contains("128 of 128 pages free, 0 held"), "{out}");

    assert_eq!(traces(&dir).len(), 3, "one trace file per node");
    let (report, code) = audit(&dir);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("verdict: CLEAN"), "{report}");
    assert!(report.contains("run end: drained"), "{report}");
    validates(&traces(&dir));
}

/// Every line of the server's trace files validates against the strict JSON Schema
/// (`docs/trace.schema.json`).
fn validates(files: &[PathBuf]) {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../docs/trace.schema.json")).expect("schema");
    let v = jsonschema::validator_for(&schema).expect("the schema compiles");
    for f in files {
        let text = std::fs::read_to_string(f).expect("trace");
        for (i, l) in text.lines().enumerate() {
            let value: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            if let Err(e) = v.validate(&value) {
                panic!("{} line {}: {e}\n{l}", f.display(), i + 1);
            }
        }
    }
}

/// The incident's bug switches on a deployment without page tags: the server says so
/// loudly, the over-length prompt gets 200 carrying the earlier request's marker, and
/// the audit of the server's traces names the leak (S3) and exits 1.
#[test]
fn serve_with_the_incident_bugs_leaks_and_audit_names_it() {
    let dir = fresh_dir("leak");
    let dir_s = dir.display().to_string();
    let bugs = "gate-checks-finished-only,no-length-agreement";
    let mut s = Served::start(&[
        INCIDENT_SC,
        "--prompts",
        "canary",
        "--bugs",
        bugs,
        "--trace-json",
        &dir_s,
    ]);
    s.wait_for("bug warning", |l| {
        l.contains("WARNING: BUG SWITCHES ON: gate-checks-finished-only,no-length-agreement")
            .then_some(())
    });
    let addr = s.endpoint();
    let mut c = Client::connect(addr, T).unwrap();
    let status = c.status().unwrap();
    assert!(
        status["warning"]
            .as_str()
            .is_some_and(|w| w.contains("BUG SWITCHES ON")),
        "{status}"
    );
    let first = reply(c.request(300, 4).unwrap());
    assert_eq!(first.status, 200);
    let over = reply(c.request(700, 8).unwrap());
    assert_eq!(
        over.status, 200,
        "the bugs let the over-length prompt through"
    );
    assert!(
        owners(&over).contains(&RequestId(first.req)),
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

/// Determinism where it can exist: one client, no faults, one request at a time; the
/// server's replies equal, token for token, the simulator's run of the same requests on
/// the same scenario, with the symbolic and with the host (f32) backend.
#[test]
fn serve_replies_match_the_simulator_token_for_token() {
    for (gpu, backend) in [
        ("symbolic", kvsim_sim::Backend::Symbolic),
        ("host", kvsim_sim::Backend::Host),
    ] {
        replies_match_the_simulator(gpu, backend);
    }
}

fn replies_match_the_simulator(gpu: &str, backend: kvsim_sim::Backend) {
    let work: [(u64, u32); 6] = [(40, 4), (300, 8), (700, 4), (17, 1), (511, 16), (96, 16)];
    let mut s = Served::start(&[LOOPBACK, "--prompts", "canary", "--gpu", gpu]);
    let addr = s.endpoint();
    let mut c = Client::connect(addr, T).unwrap();
    let served: BTreeMap<u64, (u16, Vec<u32>)> = work
        .iter()
        .map(|&(len, n)| {
            let r = reply(c.request(len, n).unwrap());
            (r.req, (r.status, r.tokens))
        })
        .collect();
    let (out, ok) = s.stop("-TERM");
    assert!(ok, "{out}");

    let sc = kvsim_sim::scenario::Scenario::load(&root().join(LOOPBACK)).unwrap();
    let mut plan =
        kvsim_sim::plan::Plan::build(&sc, sc.seed, None, &kvsim_sim::plan::Reduction::default())
            .unwrap();
    plan.requests = work
        .iter()
        .enumerate()
        .map(
            |(i, &(prompt_len, max_new_tokens))| kvsim_sim::scenario::PlannedRequest {
                req: RequestId(i as u64),
                tenant: kvsim_engine::ids::TenantId(0),
                prompt_len,
                max_new_tokens,
                // One at a time, as the single client sends them.
                at_ns: i as u64 * 1_000_000_000,
                cancel: None,
            },
        )
        .collect();
    plan.partitions.clear();
    plan.crashes.clear();
    plan.deadline_ns = plan.deadline_ns.max(work.len() as u64 * 1_000_000_000 * 2);
    let sim = kvsim_sim::run_plan(&plan, backend, false);
    assert!(sim.clean(), "the simulator's run is not clean");
    let simulated: BTreeMap<u64, (u16, Vec<u32>)> = sim
        .replies
        .iter()
        .map(|(req, rs)| {
            assert_eq!(rs.len(), 1, "one reply per request");
            (req.0, (rs[0].status.0, rs[0].tokens.clone()))
        })
        .collect();
    assert_eq!(served, simulated, "--gpu {gpu}");
    assert!(served.values().any(|(st, t)| *st == 200 && t.len() == 16));
    assert!(served.values().any(|(st, _)| *st == 400));
}

/// `--gpu cuda` probes CUDA device 0 before anything starts. Without a device (this
/// CI machine: `KVSIM_EXPECT_NO_GPU=1`) it refuses at once, exit status 2 (an error), with the
/// probe's reason and nothing served; with one, its replies equal the simulator's host
/// backend token for token (CudaGpu answers as HostGpu does). Each half prints
/// `SKIPPED: ...` where the machine cannot run it.
#[test]
fn serve_on_cuda_refuses_without_a_device_and_matches_host_with_one() {
    use kvsim_cuda::probe::{cuda_device, Probe};
    use kvsim_testenv::skip_expected;
    let expect_none = std::env::var("KVSIM_EXPECT_NO_GPU").as_deref() == Ok("1");
    match cuda_device() {
        Probe::Present { devices } => {
            assert!(
                !expect_none,
                "KVSIM_EXPECT_NO_GPU=1 but the probe found {devices} device(s)"
            );
            skip_expected(
                "serve_on_cuda (refusal)",
                "a CUDA device is present, so the refusal is not run",
            );
            replies_match_the_simulator("cuda", kvsim_sim::Backend::Host);
        }
        Probe::Absent(why) => {
            skip_expected(
                "serve_on_cuda (replies)",
                &format!("no CUDA device ({why}), so serving on CudaGpu is not run"),
            );
            let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvsim"))
                .current_dir(root())
                .args(["serve", LOOPBACK, "--gpu", "cuda"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("kvsim serve starts");
            let end = Instant::now() + cli::SERVE_WAIT;
            while child.try_wait().expect("try_wait").is_none() {
                if Instant::now() > end {
                    let _ = child.kill();
                    panic!("kvsim serve --gpu cuda did not refuse without a device");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = child.wait_with_output().expect("its output");
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{t}");
            assert!(
                t.contains("--gpu cuda: cannot use the CUDA backend: no CUDA device: "),
                "{t}"
            );
            assert!(
                t.contains(&why),
                "the probe's reason `{why}` is not named:\n{t}"
            );
            assert!(!t.contains("client endpoint"), "it served:\n{t}");
        }
    }
}

/// A free loopback port (bound, then released for the child to bind).
fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// One process per node, on loopback, with a peers file; SIGKILL of the decode process
/// and a restart with a new epoch: requests before and after are answered with their
/// own KV only, a request during the outage fails (never 200 with foreign tokens), every
/// process drains at SIGTERM, and the audit over every incarnation's trace is clean.
#[test]
fn serve_one_process_per_node_survives_a_decode_kill_and_restart() {
    let dir = fresh_dir("procs");
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.display().to_string();
    let addrs: Vec<SocketAddr> = (0..4).map(|_| free_port()).collect();
    let peers = dir.join("peers.txt");
    std::fs::write(
        &peers,
        format!(
            "# node addresses\nn0 {}\nn1 {}\nn2 {}\nclient {}\n",
            addrs[0], addrs[1], addrs[2], addrs[3]
        ),
    )
    .unwrap();
    let peers_s = peers.display().to_string();
    let node = |n: &str, epoch: &str| {
        Served::start(&[
            LOOPBACK,
            "--prompts",
            "canary",
            "--node",
            n,
            "--peers",
            &peers_s,
            "--epoch",
            epoch,
            "--trace-json",
            &dir_s,
        ])
    };
    let connected = |s: &mut Served| {
        s.wait_for("connected", |l| {
            l.contains("connected to every peer").then_some(())
        })
    };
    let (mut router, mut prefill, mut decode) = (node("n0", "0"), node("n1", "0"), node("n2", "0"));
    for s in [&mut router, &mut prefill, &mut decode] {
        connected(s);
    }
    let addr = router.endpoint();
    assert_eq!(addr, addrs[3]);
    let mut c = Client::connect(addr, T).unwrap();
    let check = |c: &mut Client, len: u64| {
        let r = reply(c.request(len, 8).unwrap());
        assert_eq!(r.status, 200, "{r:?}");
        assert!(owners(&r).iter().all(|o| o.0 == r.req), "{r:?}");
    };
    for len in [30, 200, 480] {
        check(&mut c, len);
    }
    assert_eq!(reply(c.request(900, 8).unwrap()).status, 400);

    decode.signal("-KILL");
    let _ = decode.child.wait();
    drop(decode);
    let during = reply(c.request(100, 8).unwrap());
    assert_ne!(during.status, 200, "decode is down: {during:?}");

    let mut decode = node("n2", "1");
    connected(&mut decode);
    // The router's link to n2 reconnects on its backoff (at most a second): until
    // then a request fails, and never carries another request's tokens.
    let end = Instant::now() + T;
    loop {
        let r = reply(c.request(200, 8).unwrap());
        assert!(owners(&r).iter().all(|o| o.0 == r.req), "{r:?}");
        if r.status == 200 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the restarted decode never served: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for len in [200, 30, 480, 64] {
        check(&mut c, len);
    }
    drop(c);
    let mut outs = Vec::new();
    for s in [router, prefill, decode] {
        let (out, ok) = s.stop("-TERM");
        assert!(ok, "{out}");
        assert!(out.contains("drained"), "{out}");
        outs.push(out);
    }
    let all = outs.join("\n");
    assert!(all.contains("32 of 32 pages free, 0 held"), "{all}");
    assert!(all.contains("128 of 128 pages free, 0 held"), "{all}");
    assert!(all.contains("n2 Decode (epoch 1)"), "{all}");
    assert_eq!(traces(&dir).len(), 4, "n0, n1, and two incarnations of n2");
    let (report, code) = audit(&dir);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("verdict: CLEAN"), "{report}");
}
