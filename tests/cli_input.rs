//! Input the CLI must refuse or survive (issue 14): seed ranges that do not fit in
//! memory, streaming sweeps that stop on a failure, a time budget or Ctrl-C, shards
//! that hold no seed, merges that miss shards or mix shard counts, oversized files.
//! Each test runs the built `kvsim` binary as a user would.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

mod cli;

use cli::{kvsim, root, text, INCIDENT, MIXED};

fn tmp(name: &str) -> PathBuf {
    cli::tmp_in("input", name)
}
const HUGE: &str = "0..1000000000000000000";

#[test]
fn a_huge_range_streams_to_the_first_failure() {
    // Before streaming, this built 10^18 plans first and aborted on the allocation.
    let o = kvsim(&[
        "sweep", MIXED, "--seeds", HUGE, "--first", "--quiet", "--bugs", INCIDENT,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // The failure comes first, with its replay command, before the summary.
    assert!(out.starts_with("FAIL seed 0: "), "{out}");
    let replay = format!("replay: kvsim replay {MIXED} --seed 0 --bugs {INCIDENT}");
    assert!(
        out.lines().nth(1).is_some_and(|l| l.contains(&replay)),
        "{out}"
    );
    assert!(out.contains("stopped         first failure"), "{out}");
    assert!(out.contains("seeds run       1\n"), "{out}");

    // --until-failure needs no range at all.
    let o = kvsim(&[
        "sweep",
        MIXED,
        "--until-failure",
        "--quiet",
        "--bugs",
        INCIDENT,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("FAIL seed 0: "));
}

#[test]
fn a_time_budget_stops_a_clean_sweep_and_says_where_to_resume() {
    let o = kvsim(&["sweep", MIXED, "--time-budget", "1s", "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("stopped         time budget spent"), "{t}");
    assert!(t.contains("resume with --seeds "), "{t}");
    assert!(t.contains("violations      none in the seeds run"), "{t}");
    for bad in ["0s", "5 parsecs", "x", "99999999999h"] {
        let o = kvsim(&["sweep", MIXED, "--time-budget", bad, "--quiet"]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        assert!(text(&o).contains("--time-budget"), "{}", text(&o));
    }
}

#[cfg(unix)]
#[test]
fn ctrl_c_prints_what_was_found_and_the_seeds_covered() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .args(["sweep", MIXED, "--seeds", HUGE, "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvsim starts");
    // The first stderr line comes once the handler is in place.
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("a line");
    assert!(line.contains("Ctrl-C stops and summarises"), "{line}");
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let o = child.wait_with_output().expect("kvsim exits");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(130), "{out}");
    assert!(out.contains("stopped         interrupted"), "{out}");
    assert!(out.contains("resume with --seeds "), "{out}");
    assert!(out.contains("coverage "), "{out}");
}

#[test]
fn runs_that_check_nothing_are_refused() {
    for (args, want) in [
        (
            vec!["sweep", MIXED, "--seeds", "0..4", "--shard", "1000/1000"],
            "holds no seed",
        ),
        (
            vec!["sweep", MIXED, "--seeds", "0..4", "--jobs", "5000"],
            "--jobs",
        ),
        (
            vec!["sweep", MIXED, "--seeds", "18446744073709551615"],
            "kvsim replay --seed 18446744073709551615",
        ),
    ] {
        let o = kvsim(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
}

#[test]
fn merge_reports_coverage_and_refuses_mixed_shard_counts() {
    let mut files = Vec::new();
    // Seeds 0..6 reach every path mixed-faults declares in `reach` (0..4 do not), and
    // a complete merge judges them.
    for k in ["1/2", "2/2", "1/3"] {
        let f = tmp(&format!("shard-{}.json", k.replace('/', "of")));
        let o = kvsim(&[
            "sweep",
            MIXED,
            "--seeds",
            "0..6",
            "--shard",
            k,
            "--quiet",
            "--json",
            f.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        files.push(f);
    }
    let [a, b, c] = [0, 1, 2].map(|i| files[i].to_str().unwrap().to_string());
    // One shard of two: not a pass.
    let o = kvsim(&["merge", &a]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("3 of 6 seeds covered; missing shards 2/2"),
        "{t}"
    );
    assert!(!t.contains("violations      none\n"), "{t}");
    // Both: complete.
    let o = kvsim(&["merge", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("6 of 6 seeds covered"), "{}", text(&o));
    // Shards of different N overlap: refused, not double-counted.
    let o = kvsim(&["merge", &a, &b, &c]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a shard of 2"), "{}", text(&o));
}

#[cfg(unix)]
#[test]
fn endless_input_files_are_refused_after_a_bound() {
    for args in [vec!["run", "/dev/zero"], vec!["merge", "/dev/zero"]] {
        let o = kvsim(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("larger than"), "{args:?}: {}", text(&o));
    }
}

#[test]
fn expensive_runs_and_bad_configs_say_so_once_before_starting() {
    let f = tmp("expensive.toml");
    std::fs::write(
        &f,
        "name = \"x\"\n[topology]\nprefill_pool_pages = [262144]\ndecode_pool_pages = [262144]\n\
         [[requests]]\ntenant = 1\nprompt_len = 16777216\nrepeat = 65000\n",
    )
    .unwrap();
    let path = f.to_str().unwrap();
    for args in [
        vec!["run", path],
        vec!["sweep", path, "--seeds", "0..2"],
        vec!["replay", path, "--seed", "0"],
    ] {
        let o = kvsim(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("--allow-expensive"), "{}", text(&o));
    }
    let bad = tmp("bad-config.toml");
    std::fs::write(
        &bad,
        "name = \"b\"\n[engine]\nchunk_pages = 0\n[topology]\nprefill_pool_pages = [16]\n\
         decode_pool_pages = [16]\n[[requests]]\ntenant = 1\nprompt_len = 10\n",
    )
    .unwrap();
    let o = kvsim(&["run", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(
        text(&o).matches("must be at least 1").count(),
        1,
        "{}",
        text(&o)
    );
}

#[test]
fn misleading_verdicts_are_usage_errors() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = busy.local_addr().expect("its address").to_string();
    for (args, want) in [
        (vec!["check", "--depth", "0"], "--depth"),
        (vec!["check", "--threads", "100000"], "--threads"),
        (vec!["check", "--threads", "0"], "--threads"),
        (vec!["check", "--explore", &addr], "cannot listen"),
        (vec!["bugs", "--seeds", "0"], "--seeds"),
        (
            vec!["replay", MIXED, "--seed", "0", "--reduce", "keep=99999"],
            "keep=99999",
        ),
        (
            vec!["replay", MIXED, "--seed", "0", "--reduce", "keep="],
            "no request",
        ),
    ] {
        let o = kvsim(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
    drop(busy);
}

#[test]
fn replay_commands_paste_without_kvsim_on_the_path() {
    let o = Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .env("PATH", "/nonexistent")
        .args([
            "sweep", MIXED, "--seeds", "0..2", "--quiet", "--bugs", INCIDENT,
        ])
        .output()
        .expect("kvsim runs");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains(&format!(
            "replay: cargo run --release -- replay {MIXED} --seed 0"
        )),
        "{t}"
    );
    assert!(!t.contains("kvsim replay"), "{t}");
}

#[test]
fn list_names_every_bug_model_invariant_path_and_scenario() {
    for (what, want) in [
        ("bugs", "gate-checks-finished-only"),
        ("models", "crash-race-small"),
        ("invariants", "S9"),
        ("paths", "drain-after-timeout"),
        ("scenarios", "scenarios/mixed-faults.toml"),
    ] {
        let o = kvsim(&["list", what]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o));
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(t.contains(want), "{what}: {t}");
        // One line each, every one with a description after its name.
        for line in t.lines() {
            assert!(line.split_whitespace().count() >= 3, "{what}: `{line}`");
        }
    }
    let o = kvsim(&["list", "everything"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// `kvsim ... | head`: a reader that closes the pipe early ends the command quietly
/// (killed by SIGPIPE, as `cat` is), never with a panic in `println!` (exit 101 and a
/// "failed printing to stdout" message).
#[test]
fn a_closed_stdout_pipe_ends_the_command_without_a_panic() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .args(["run", "scenarios/mixed-faults.toml", "--trace"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvsim runs");
    // Read a little of the trace (more than a pipe holds is printed), then hang up.
    let mut out = child.stdout.take().expect("piped");
    let mut first = [0u8; 256];
    out.read_exact(&mut first).expect("the trace starts");
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .expect("stderr reads");
    let status = child.wait().expect("kvsim ends");
    assert!(
        !err.contains("panicked") && !err.contains("failed printing"),
        "a closed pipe made kvsim panic: {err}"
    );
    assert_ne!(status.code(), Some(101), "exit 101 is a panic: {err}");
}
