//! The real-fault bed (scripts/netns-bed.sh) as a test: router, prefill and decode
//! processes in their own network namespaces, a canary load, and a seeded, printed
//! schedule of real faults (loss and partitions with nftables, a tbf slow link, a link
//! down and up, SIGSTOP/SIGCONT of prefill, SIGKILL of decode and of prefill under
//! load, each restarted at a new epoch). The defended engine must show no leak to the canary, a clean audit of every
//! node's trace with liveness judged, and every pool full at the end; the incident's
//! bug switches must show the leak to the canary (a foreign marker in a 200 reply) and
//! the audit must name it. Where namespaces are not available (not root, no `ip`, no
//! `nft`), each test prints SKIPPED and the reason; under `KVSIM_REQUIRE_NETNS=1` (set by
//! `.ci/run` when it runs as root) a skip fails the test instead.
//!
//! The same bed with SGLang's real router (`--router PY`): prefill and decode in
//! worker mode in their namespaces, `sglang-router` 0.3.2 in PD mode in its own, faults
//! on every link (loss on the router's and decode's, partitions between prefill and
//! decode and between the router and decode, a slow link, a link down), a paused
//! prefill, and SIGKILL of the decode and of the prefill worker, each restarted at a new
//! epoch behind the router, `kvsim canary` through the router with client disconnects;
//! then the audit of both nodes' traces (every incarnation's) and both pools whole. The router comes from `KVSIM_PYTHON`'s
//! environment (SKIPPED without it, failing under `KVSIM_REQUIRE_PY_CLIENTS=1`).
//!
//! The same real-router bed with the KV over NIXL between the namespaces (`--transport
//! nixl`: the wheel's UCX over TCP on each namespace's interface), a stopped decode
//! added to the faults: SKIPPED without the wheel or a `kvsim` built with the `nixl`
//! feature (failing under `KVSIM_REQUIRE_NIXL=1`).

mod cli;

use cli::router_python;
use std::path::Path;
use std::process::Command;

/// Run the bed; `None` when it skipped (the reason is printed).
fn bed(seed: u64, extra: &[&str], name: &str) -> Option<(i32, String)> {
    bed_with(seed, extra, name, &[])
}

/// [`bed`] with more environment for the bed script.
fn bed_with(
    seed: u64,
    extra: &[&str],
    name: &str,
    envs: &[(&str, String)],
) -> Option<(i32, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("kvsim-bed-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("timeout")
        .arg("180")
        .arg(root.join("scripts/netns-bed.sh"))
        .arg(seed.to_string())
        .args(extra)
        .current_dir(root)
        .env("KVSIM", env!("CARGO_BIN_EXE_kvsim"))
        .env("BED_DIR", &dir)
        .env("BED_SECONDS", "5")
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("bash runs the bed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let code = out.status.code().unwrap_or(-1);
    if code == 77 {
        let why = text.trim().trim_start_matches("SKIPPED: ");
        kvsim_testenv::skip(
            &format!("netns bed ({name})"),
            kvsim_testenv::Need::Netns,
            why,
        );
        return None;
    }
    println!("{text}");
    Some((code, text))
}

fn canary_count(text: &str, field: &str) -> u64 {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("canary: "))
        .unwrap_or_else(|| panic!("no canary report:\n{text}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("canary JSON");
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {line}"))
}

#[test]
fn netns_bed_defended_engine_survives_real_faults() {
    let Some((code, text)) = bed(11, &[], "defended") else {
        return;
    };
    assert!(
        text.contains("schedule: "),
        "the schedule is printed:\n{text}"
    );
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("bed result: canary rc 0, audit rc 0, drained 1"),
        "{text}"
    );
    assert!(
        text.contains("run end: drained (liveness judged)"),
        "{text}"
    );
    assert_eq!(canary_count(&text, "foreign_marker"), 0);
    assert!(canary_count(&text, "over_length") > 0, "{text}");
    assert_eq!(
        canary_count(&text, "over_length_200"),
        0,
        "an over-length prompt got 200:\n{text}"
    );
    assert!(text.contains("32 of 32 pages free"), "{text}");
    assert!(text.contains("128 of 128 pages free"), "{text}");
}

#[test]
fn netns_bed_incident_bugs_leak_and_audit_names_it() {
    let bugs = ["--bugs", "gate-checks-finished-only,no-length-agreement"];
    let sc = ["--scenario", "tests/serve/incident.toml"];
    let Some((code, text)) = bed(12, &[&bugs[..], &sc[..]].concat(), "bugs") else {
        return;
    };
    assert_ne!(code, 0, "{text}");
    assert!(
        canary_count(&text, "foreign_marker") > 0,
        "the canary must see another request's marker in a 200 reply:\n{text}"
    );
    assert!(text.contains("audit rc 1"), "{text}");
    assert!(text.contains("VIOLATED S3"), "{text}");
}

#[test]
fn netns_bed_real_router_drives_prefill_and_decode_through_link_faults() {
    let Some(py) =
        router_python("netns_bed_real_router_drives_prefill_and_decode_through_link_faults")
    else {
        return;
    };
    let Some((code, text)) = bed(21, &["--router", &py], "router") else {
        return;
    };
    assert!(text.contains("schedule: "), "{text}");
    for fault in [
        "fault: loss r ",
        "fault: partition r d ",
        "fault: partition p d ",
        "fault: kill d ",
        "fault: kill p ",
    ] {
        assert!(text.contains(fault), "{fault} was applied:\n{text}");
    }
    assert_eq!(code, 0, "{text}");
    for restarted in ["Prefill (epoch 1)", "Decode (epoch 1)"] {
        assert!(text.contains(restarted), "{restarted} drained: {text}");
    }
    assert!(
        text.contains("bed result: canary rc 0, audit rc 0, drained 1"),
        "{text}"
    );
    assert!(text.contains("canary: PASS"), "{text}");
    assert!(
        text.contains("400: "),
        "over-length prompts refused: {text}"
    );
    assert!(
        text.contains("run end: drained (liveness judged)"),
        "{text}"
    );
    assert!(text.contains("32 of 32 pages free"), "{text}");
    assert!(text.contains("128 of 128 pages free"), "{text}");
}

#[test]
fn netns_bed_real_router_incident_bugs_leak_and_audit_names_it() {
    let Some(py) = router_python("netns_bed_real_router_incident_bugs_leak_and_audit_names_it")
    else {
        return;
    };
    let args = [
        "--router",
        &py,
        "--bugs",
        "gate-checks-finished-only,no-length-agreement",
        "--scenario",
        "tests/serve/incident.toml",
    ];
    let Some((code, text)) = bed(22, &args, "router-bugs") else {
        return;
    };
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("LEAK: reply to request"),
        "the canary must see another request's marker through the router:\n{text}"
    );
    assert!(text.contains("audit rc 1"), "{text}");
    assert!(text.contains("VIOLATED S3"), "{text}");
}

#[test]
fn netns_bed_real_router_over_nixl_survives_link_faults_stops_and_kills() {
    const TEST: &str = "netns_bed_real_router_over_nixl_survives_link_faults_stops_and_kills";
    let Some(py) = router_python(TEST) else {
        return;
    };
    let Some(lib) = kvsim_testenv::nixl_lib_dir(TEST, cfg!(feature = "nixl")) else {
        return;
    };
    let envs = [("KVSIM_NIXL_LIB_DIR", lib.display().to_string())];
    let args = ["--router", &py, "--transport", "nixl"];
    let Some((code, text)) = bed_with(23, &args, "router-nixl", &envs) else {
        return;
    };
    assert!(text.contains("transport nixl"), "{text}");
    for fault in [
        "fault: loss r ",
        "fault: loss d ",
        "fault: partition p d ",
        "fault: pause p ",
        "fault: pause d ",
        "fault: kill d ",
        "fault: kill p ",
    ] {
        assert!(text.contains(fault), "{fault} was applied:\n{text}");
    }
    assert_eq!(code, 0, "{text}");
    for restarted in ["Prefill (epoch 1)", "Decode (epoch 1)"] {
        assert!(text.contains(restarted), "{restarted} drained: {text}");
    }
    assert!(
        text.contains("bed result: canary rc 0, audit rc 0, drained 1"),
        "{text}"
    );
    assert!(text.contains("canary: PASS"), "{text}");
    assert!(text.contains("32 of 32 pages free"), "{text}");
    assert!(text.contains("128 of 128 pages free"), "{text}");
}
