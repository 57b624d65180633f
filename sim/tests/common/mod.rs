//! Shared helpers for the simulator's integration tests: the scenario files,
//! compiled in so the tests run from any directory.

#![allow(dead_code)]

use kvsim_sim::scenario::Scenario;

pub const MIXED_FAULTS: &str = include_str!("../../../scenarios/mixed-faults.toml");
pub const ABORT_STORM: &str = include_str!("../../../scenarios/abort-storm.toml");
pub const DISCONNECT_MID_TRANSFER: &str =
    include_str!("../../../scenarios/disconnect-mid-transfer.toml");
pub const TRANSFER_FAILURES: &str = include_str!("../../../scenarios/transfer-failures.toml");
pub const PARTITION: &str = include_str!("../../../scenarios/partition.toml");
pub const GLM53_INCIDENT: &str = include_str!("../../../scenarios/glm53-incident.toml");
pub const GLM53_TRUNCATE: &str = include_str!("../../../scenarios/glm53-truncate.toml");
pub const DATA_FAULTS: &str = include_str!("../../../scenarios/data-faults.toml");
pub const STALLS: &str = include_str!("../../../scenarios/stalls.toml");
pub const PREFIX_HIT: &str = include_str!("../../../scenarios/prefix-hit.toml");
pub const CLIENT_ROOMS: &str = include_str!("../../../scenarios/client-rooms.toml");
pub const WORKER_MODE: &str = include_str!("../../../scenarios/worker-mode.toml");
pub const VLLM_PULL: &str = include_str!("../../../scenarios/vllm-pull.toml");
pub const MULTI_RANK: &str = include_str!("../../../scenarios/multi-rank.toml");
pub const FAILED_ROOM: &str = include_str!("../../../scenarios/failed-room.toml");
pub const NIXL: &str = include_str!("../../../scenarios/nixl.toml");

/// Every scenario file, by the path a replay command names.
pub const ALL: [(&str, &str); 17] = [
    ("scenarios/mixed-faults.toml", MIXED_FAULTS),
    ("scenarios/abort-storm.toml", ABORT_STORM),
    (
        "scenarios/disconnect-mid-transfer.toml",
        DISCONNECT_MID_TRANSFER,
    ),
    ("scenarios/transfer-failures.toml", TRANSFER_FAILURES),
    ("scenarios/partition.toml", PARTITION),
    ("scenarios/glm53-incident.toml", GLM53_INCIDENT),
    ("scenarios/glm53-truncate.toml", GLM53_TRUNCATE),
    ("scenarios/data-faults.toml", DATA_FAULTS),
    ("scenarios/client-disconnects.toml", CLIENT_DISCONNECTS),
    ("scenarios/stalls.toml", STALLS),
    ("scenarios/prefix-hit.toml", PREFIX_HIT),
    ("scenarios/vllm-pull.toml", VLLM_PULL),
    ("scenarios/multi-rank.toml", MULTI_RANK),
    ("scenarios/client-rooms.toml", CLIENT_ROOMS),
    ("scenarios/worker-mode.toml", WORKER_MODE),
    ("scenarios/failed-room.toml", FAILED_ROOM),
    ("scenarios/nixl.toml", NIXL),
];

pub fn scenario(path: &str) -> Scenario {
    let text = ALL
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("no scenario {path}"));
    Scenario::parse(text, path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub const CLIENT_DISCONNECTS: &str = include_str!("../../../scenarios/client-disconnects.toml");

/// `path` with `tweak` applied.
pub fn scenario_with(path: &str, tweak: impl FnOnce(&mut Scenario)) -> Scenario {
    let mut sc = scenario(path);
    tweak(&mut sc);
    sc
}
