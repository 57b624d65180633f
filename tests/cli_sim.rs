//! The simulator's subcommands as a user runs them: output, files and exit codes
//! (0 clean, 1 a violation, 2 bad usage).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The PATH with the built `kvsim`'s folder first: printed replay commands then
/// read `kvsim ...` (without it, `cargo run --release -- ...`).
fn path_with_kvsim() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_kvsim"))
        .parent()
        .expect("a folder")
        .to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&rest))).expect("a PATH")
}

fn kvsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .env("PATH", path_with_kvsim())
        .args(args)
        .output()
        .expect("kvsim runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const MIXED: &str = "scenarios/mixed-faults.toml";
const INCIDENT: &str = "gate-checks-finished-only,no-length-agreement";

#[test]
fn sweep_exit_codes_and_summary() {
    let clean = kvsim(&["sweep", MIXED, "--seeds", "0..6", "--quiet"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    let t = text(&clean);
    for want in [
        "seeds run       6",
        "violations      none",
        "seeds/s",
        "events/s",
        "faster than real time",
    ] {
        assert!(t.contains(want), "missing `{want}`:\n{t}");
    }
    let bad = kvsim(&[
        "sweep", MIXED, "--seeds", "0..6", "--quiet", "--bugs", INCIDENT,
    ]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(text(&bad).contains(&format!("kvsim replay {MIXED} --seed 0 --bugs {INCIDENT}")));
    for usage in [
        vec!["sweep", MIXED, "--seeds", "9..3"],
        vec!["sweep", MIXED, "--shard", "0/2"],
        vec!["sweep", MIXED, "--bugs", "no-such-bug"],
        vec!["sweep", "scenarios/no-such.toml"],
        vec!["sweep", MIXED, "--no-such-flag"],
        vec!["replay", MIXED],
        vec!["replay", MIXED, "--seed", "1", "--reduce", "keep=x"],
    ] {
        let o = kvsim(&usage);
        assert_eq!(o.status.code(), Some(2), "{usage:?}: {}", text(&o));
    }
}

#[test]
fn shards_merge_into_the_whole_sweep() {
    let (a, b) = (tmp("s1.json"), tmp("s2.json"));
    for (k, f) in [("1/2", &a), ("2/2", &b)] {
        let o = kvsim(&[
            "sweep",
            MIXED,
            "--seeds",
            "0..8",
            "--shard",
            k,
            "--quiet",
            "--json",
            f.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let merged = tmp("all.json");
    let o = kvsim(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let whole: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    assert_eq!(whole["seeds_run"], 8);
    assert_eq!(whole["shards"].as_array().unwrap().len(), 2);
    // The same shard twice is refused.
    let o = kvsim(&["merge", a.to_str().unwrap(), a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn replay_prints_the_draw_the_trace_and_the_report() {
    let json = tmp("trace.jsonl");
    let o = kvsim(&[
        "replay",
        MIXED,
        "--seed",
        "0",
        "--bugs",
        INCIDENT,
        "--check-determinism",
        "--trace-json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.starts_with("swarm draw for seed 0 of mixed-faults:"),
        "{t}"
    );
    for want in [
        "== full trace ==",
        "FAILURE: mixed-faults seed 0",
        "first finding at",
        "causal trace",
        "determinism: ran twice, same trace byte for byte",
        &format!("replay (full trace): kvsim replay {MIXED} --seed 0 --bugs {INCIDENT}"),
    ] {
        assert!(t.contains(want), "missing `{want}`");
    }
    let lines = std::fs::read_to_string(&json).unwrap();
    assert!(lines.lines().count() > 1000);
    assert!(lines.lines().any(|l| l.contains("\"type\":\"violation\"")));

    let shrunk = kvsim(&[
        "replay", MIXED, "--seed", "0", "--bugs", INCIDENT, "--brief", "--shrink",
    ]);
    assert_eq!(shrunk.status.code(), Some(1));
    let t = text(&shrunk);
    assert!(t.contains("== shrinking =="), "{t}");
    assert!(t.contains("--reduce '"), "{t}");

    let clean = kvsim(&["replay", MIXED, "--seed", "0", "--brief"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    assert!(text(&clean).contains("verdict: CLEAN"));
}
