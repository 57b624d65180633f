//! The simulator's subcommands as a user runs them: output, files and exit codes
//! (0 clean, 1 a violation, 2 bad usage, 4 a declared path no seed reached).

use std::path::PathBuf;

mod cli;

use cli::{kvsim, text, INCIDENT, MIXED};

fn tmp(name: &str) -> PathBuf {
    cli::tmp_in("cli", name)
}

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
        vec!["sweep", MIXED, "--faults", "pauze = 1"],
        vec![
            "replay",
            MIXED,
            "--seed",
            "1",
            "--faults",
            "clock_skew_permille = 950",
        ],
    ] {
        let o = kvsim(&usage);
        assert_eq!(o.status.code(), Some(2), "{usage:?}: {}", text(&o));
    }
    // A fault laid over the file's is named in the replay command of a failing seed,
    // and the replay reproduces it.
    let over = ["--faults", "clock_skew_permille = 100"];
    let mut args = vec![
        "sweep", MIXED, "--seeds", "0..1", "--quiet", "--bugs", INCIDENT,
    ];
    args.extend(over);
    let o = kvsim(&args);
    assert!(
        text(&o).contains("--faults 'clock_skew_permille = 100'"),
        "{}",
        text(&o)
    );
    let mut args = vec![
        "replay", MIXED, "--seed", "0", "--bugs", INCIDENT, "--brief",
    ];
    args.extend(over);
    let r = kvsim(&args);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    assert!(text(&r).contains("clock-skew n0 "), "{}", text(&r));
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

    // --shrink: the minimal failing case first (its first finding and causal
    // trace), then the seed as drawn without its full trace; --trace-json writes the
    // shrunk run's trace, which is shorter than the drawn run's.
    let small = tmp("shrunk.jsonl");
    let shrunk = kvsim(&[
        "replay",
        MIXED,
        "--seed",
        "0",
        "--bugs",
        INCIDENT,
        "--shrink",
        "--trace-json",
        small.to_str().unwrap(),
    ]);
    assert_eq!(shrunk.status.code(), Some(1));
    let t = text(&shrunk);
    assert!(
        t.starts_with("== minimal failing case ==\nshrunk in "),
        "{t}"
    );
    let drawn = t
        .find("== the seed as drawn ==")
        .expect("the drawn seed follows");
    let minimal = &t[..drawn];
    for want in [
        "FAILURE: mixed-faults seed 0",
        "first finding at",
        "causal trace",
        "--reduce '",
    ] {
        assert!(
            minimal.contains(want),
            "the minimal case lacks `{want}`: {minimal}"
        );
    }
    assert!(
        !t.contains("== full trace =="),
        "the full trace only on request"
    );
    assert!(t.contains("trace: the shrunk run's"), "{t}");
    let small_lines = std::fs::read_to_string(&small).unwrap().lines().count();
    assert!(
        small_lines > 1 && small_lines < lines.lines().count(),
        "shrunk trace {small_lines} lines, drawn {}",
        lines.lines().count()
    );
    let full = kvsim(&[
        "replay",
        MIXED,
        "--seed",
        "0",
        "--bugs",
        INCIDENT,
        "--shrink",
        "--full-trace",
    ]);
    let t = text(&full);
    let (head, tail) = t.split_at(t.find("== the seed as drawn ==").unwrap());
    assert!(!head.contains("== full trace ==") && tail.contains("== full trace =="));

    let clean = kvsim(&["replay", MIXED, "--seed", "0", "--brief"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    assert!(text(&clean).contains("verdict: CLEAN"));
}

/// The end of a sweep says which fault kinds fired, at which phases clients
/// cancelled and which engine paths were hit, and warns about what the scenario
/// configures and the sweep never reached.
#[test]
fn a_sweep_ends_with_its_coverage_and_warns_about_what_it_never_reached() {
    let o = kvsim(&["sweep", MIXED, "--seeds", "0..40", "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    for want in [
        "  faults fired    ",
        "loss ",
        "  cancel phases   ",
        "  engine paths    ",
        "Quarantined ",
        "not hit: ",
    ] {
        assert!(t.contains(want), "missing `{want}`: {t}");
    }
    assert!(!t.contains("WARNING"), "{t}");

    // Rare write failures and one short request per seed: write failures and late
    // writes are drawn on and never fire in these seeds, and the paths the scenario
    // exists to reach are not reached: the sweep is clean, and fails on that (exit 4).
    let scenario = std::fs::read_to_string(cli::root().join("scenarios/transfer-failures.toml"))
        .unwrap()
        .replace("write_fail_permille = 150", "write_fail_permille = 1")
        .replace("requests = 64", "requests = 1")
        .replace("prompt_len = [64, 2500]", "prompt_len = [64, 100]");
    assert!(scenario.contains("requests = 1") && scenario.contains("permille = 1\n"));
    let rare = tmp("rare-faults.toml");
    std::fs::write(&rare, scenario).unwrap();
    let o = kvsim(&[
        "sweep",
        rare.to_str().unwrap(),
        "--seeds",
        "0..4",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("WARNING         fault kind `write-fail` drawn on in 4 seeds never fired"),
        "{t}"
    );
    assert!(t.contains("violations      none"), "{t}");
    assert!(t.contains("; NOT REACHED: send-failed"), "{t}");
    assert!(t.contains("error: declared paths `send-failed`, "), "{t}");
}

/// One verdict rule (`kvsim_oracle::fails`) in every command: a seed fails only on a
/// violation; detections are counted and shown. On the defended engine `data-faults`
/// seed 0 has only detections: `run`, `replay`, `sweep`, `merge` and `audit` all exit 0
/// and say so (before, `sweep` printed `FAIL seed 0: S4 detected` and exited 1 while
/// `run` exited 0).
#[test]
fn a_detection_is_not_a_failure_in_any_command() {
    const DATA: &str = "scenarios/data-faults.toml";
    let run = kvsim(&["run", DATA, "--seed", "0"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    assert!(text(&run).contains("DETECTED"), "{}", text(&run));
    let (json, trace) = (tmp("det-sweep.json"), tmp("det-trace.jsonl"));
    let sweep = kvsim(&[
        "sweep",
        DATA,
        "--seeds",
        "0..3",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    let t = text(&sweep);
    assert_eq!(sweep.status.code(), Some(0), "{t}");
    assert!(!t.contains("FAIL seed"), "{t}");
    assert!(t.contains("violations      none"), "{t}");
    assert!(t.contains("seeds with detections only"), "{t}");
    let merge = kvsim(&["merge", json.to_str().unwrap()]);
    assert_eq!(merge.status.code(), Some(0), "{}", text(&merge));
    assert!(text(&merge).contains("seeds with detections only"));
    let replay = kvsim(&[
        "replay",
        DATA,
        "--seed",
        "0",
        "--brief",
        "--trace-json",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(replay.status.code(), Some(0), "{}", text(&replay));
    let audit = kvsim(&["audit", trace.to_str().unwrap()]);
    assert_eq!(audit.status.code(), Some(0), "{}", text(&audit));
    assert!(text(&audit).contains("DETECTED"), "{}", text(&audit));
}

/// A scenario that declares a path its faults cannot reach (`crash-mid-request` on a
/// network with no crash): the sweep runs clean, yet it exits 4 and names the path.
/// Each shard alone exits 0 and says it does not judge; their merge judges, exits 4.
#[test]
fn a_sweep_in_which_no_seed_reaches_a_declared_path_exits_4() {
    let toml = std::fs::read_to_string(cli::root().join("scenarios/client-disconnects.toml"))
        .unwrap()
        .lines()
        .map(|l| {
            if l.starts_with("reach = ") {
                "reach = [\"abort-mid-transfer\", \"crash-mid-request\"]"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(toml.contains("\"crash-mid-request\""), "{toml}");
    let file = tmp("unreachable.toml");
    std::fs::write(&file, toml).unwrap();
    let f = file.to_str().unwrap();
    let o = kvsim(&["sweep", f, "--seeds", "0..4", "--quiet"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    for want in [
        "violations      none",
        "NOT REACHED: crash-mid-request",
        "error: declared path `crash-mid-request` was reached by no seed of the 4 seeds run",
    ] {
        assert!(t.contains(want), "missing `{want}`: {t}");
    }
    let (a, b) = (tmp("unreachable-1.json"), tmp("unreachable-2.json"));
    for (k, json) in [("1/2", &a), ("2/2", &b)] {
        let o = kvsim(&[
            "sweep",
            f,
            "--seeds",
            "0..4",
            "--shard",
            k,
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(text(&o).contains("not judged"), "{}", text(&o));
    }
    let merged = tmp("unreachable-all.json");
    let o = kvsim(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("`crash-mid-request` was reached by no seed of the 4 seeds run"));
    let whole: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    assert_eq!(whole["coverage"]["reach"]["crash-mid-request"], 0);
    assert!(
        whole["coverage"]["reach"]["abort-mid-transfer"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(
        whole["coverage"]["declared_reach"],
        serde_json::json!(["abort-mid-transfer", "crash-mid-request"])
    );
}

/// `kvsim bugs --time-to-counterexample`: a table row per switch asked for, with what
/// each tool found and its median time (each run a new process), written to ttc.md; a
/// name that is no switch is refused.
#[test]
fn bugs_time_to_counterexample_times_both_tools() {
    let out = tmp("ttc");
    let dir = out.display().to_string();
    let run = kvsim(&[
        "bugs",
        "--time-to-counterexample",
        "--quick",
        "--runs",
        "1",
        "--only",
        "gate-checks-finished-only,skip-preflight",
        "--out",
        &dir,
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let md = std::fs::read_to_string(out.join("ttc.md")).unwrap();
    let row = md
        .lines()
        .find(|l| l.starts_with("| gate-checks-finished-only |"))
        .unwrap_or_else(|| panic!("no row:\n{md}"));
    assert!(row.contains("seed 0: S5"), "{row}");
    assert!(
        row.contains("handoff-small: S4 length agreement (9-step counterexample)"),
        "{row}"
    );
    assert!(md.contains("| skip-preflight | n/a |"), "{md}");
    let bad = kvsim(&[
        "bugs",
        "--time-to-counterexample",
        "--only",
        "no-such-switch",
        "--out",
        &dir,
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("names no switch"), "{}", text(&bad));
}
