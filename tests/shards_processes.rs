//! A sweep cut into shards run as separate `kvsim` processes (what deploy/'s Slurm
//! array and Kubernetes Indexed Job do) merges into exactly the unsharded sweep:
//! the same seeds, events and simulated time, and the same failing seeds with the
//! same invariants and trace hashes, seed for seed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn kvsim(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvsim starts")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsim-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const MIXED: &str = "scenarios/mixed-faults.toml";
const SEEDS: &str = "0..15";
// Some seeds fail, some do not: both kinds must come through the merge.
const BUGS: &str = "decode-release-immediate";

#[test]
fn shards_as_processes_merge_into_the_unsharded_sweep() {
    const N: u32 = 3;
    let whole = tmp("whole.json");
    let mut children = vec![kvsim(&[
        "sweep",
        MIXED,
        "--seeds",
        SEEDS,
        "--bugs",
        BUGS,
        "--quiet",
        "--jobs",
        "1",
        "--json",
        whole.to_str().unwrap(),
    ])];
    let shards: Vec<PathBuf> = (1..=N)
        .map(|k| tmp(&format!("shard-{k}-of-{N}.json")))
        .collect();
    for (k, f) in (1..=N).zip(&shards) {
        children.push(kvsim(&[
            "sweep",
            MIXED,
            "--seeds",
            SEEDS,
            "--bugs",
            BUGS,
            "--shard",
            &format!("{k}/{N}"),
            "--quiet",
            "--jobs",
            "1",
            "--json",
            f.to_str().unwrap(),
        ]));
    }
    for c in children {
        let o = c.wait_with_output().expect("kvsim exits");
        // 0 clean or 1 a violation: either way the JSON was written.
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let merged = tmp("merged.json");
    let mut args = vec!["merge".to_string()];
    args.extend(shards.iter().map(|p| p.to_str().unwrap().to_string()));
    args.extend(["--json".to_string(), merged.to_str().unwrap().to_string()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = kvsim(&argv).wait_with_output().expect("merge exits");
    let (w, m) = (json(&whole), json(&merged));
    let code = if w["failing_seeds"] == 0 { 0 } else { 1 };
    assert_eq!(
        o.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("15 of 15 seeds covered"));
    for key in [
        "scenario",
        "bugs",
        "seeds",
        "seeds_run",
        "events",
        "sim_ns",
        "failing_seeds",
        "violations",
        "nondeterministic",
        "coverage",
    ] {
        assert_eq!(w[key], m[key], "{key}");
    }
    let failures = |v: &serde_json::Value| -> Vec<(u64, String, String, String)> {
        v["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["seed"].as_u64().unwrap(),
                    f["invariants"].to_string(),
                    f["trace_hash"].to_string(),
                    f["replay"].to_string(),
                )
            })
            .collect()
    };
    assert_eq!(failures(&w), failures(&m));
    assert_eq!(m["shards"].as_array().unwrap().len(), N as usize);
}

#[test]
fn the_deploy_scripts_run_shards_and_merge() {
    for f in ["deploy/slurm-array.sh", "deploy/k8s-indexed-job.yaml"] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        for want in ["kvsim sweep", "--shard", "--json"] {
            assert!(text.contains(want), "{f} lacks `{want}`");
        }
    }
    for f in ["deploy/slurm-array.sh", "deploy/k8s-merge-job.yaml"] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        assert!(text.contains("kvsim merge"), "{f} lacks the merge");
    }
}
