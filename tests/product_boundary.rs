//! The product boundary: the serving binary, `kvsim-server` (what `kvsim serve` runs),
//! links none of the fault injection that the simulator and the model checker carry.
//! Read from the binaries' symbol tables (`nm`), which list the code the linker kept:
//! a byte search would also find names in debug information of code that was dropped.
//! The same names are looked for in `kvsim`, which links the simulator and the models,
//! so the test can fail: a name it does not find there is a stale name, not a pass.

use kvsim_testenv::{skip, Need};
use std::process::Command;

/// Fault injection by module (demangled prefixes): the engine's hand-stepped driver,
/// the simulator's run driver, network, sweeps, shrinking and stall draws, the model
/// checker. Each of these links symbols into `kvsim` whatever the build inlines, so
/// each must be found there (the test cannot go stale) and must not be in the server.
const FAULT_MODULES: &[&str] = &[
    "kvsim_engine::harness::",
    "kvsim_sim::simulator::",
    "kvsim_sim::net::",
    "kvsim_sim::sweep::",
    "kvsim_sim::shrink::",
    "kvsim_sim::stall::draw_pauses",
    "kvsim_sim::plan::build::Plan::build",
    "kvsim_models::",
    "stateright::",
];

/// Fault-injection functions that a build may inline into their callers (a build
/// without incremental compilation does, for these): never in the server, but not
/// required as symbols of `kvsim`.
const FAULT_ITEMS: &[&str] = &[
    "kvsim_engine::world::data_faults::alter",
    "kvsim_engine::world::data_faults::WriteHistory",
    "kvsim_sim::plan::draw::draw_crashes",
    "kvsim_sim::plan::draw::draw_partitions",
    "kvsim_sim::plan::draw::draw_stalls",
    "kvsim_sim::plan::draw::workload",
];

/// The defined symbols of `binary`, demangled, one per line; `None` when `nm` is
/// missing (the test then skips, or fails under its require variable).
fn symbols(binary: &str) -> Option<String> {
    let out = Command::new("nm")
        .args(["--demangle", "--defined-only", binary])
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "nm {binary}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The entries of `names` that some symbol of `table` is an item of: its
/// name (after the address and kind), or the type of an `impl` it belongs to
/// (`<kvsim_models::X as Trait>::f`), starts with the entry. A name that only appears
/// inside a generic (`core::ptr::drop_in_place<Vec<kvsim_models::X>>`) is not
/// counted: identical glue is folded into one function with one alias per type, so
/// such aliases say nothing about which code is linked.
fn found(table: &str, names: &[&'static str]) -> Vec<&'static str> {
    let items: Vec<&str> = table
        .lines()
        .filter_map(|line| line.splitn(3, ' ').nth(2))
        .map(|name| name.trim_start_matches('<'))
        .collect();
    names
        .iter()
        .copied()
        .filter(|entry| items.iter().any(|name| name.starts_with(entry)))
        .collect()
}

#[test]
fn the_server_binary_links_no_fault_injection() {
    let test = "the_server_binary_links_no_fault_injection";
    let (Some(server), Some(cli)) = (
        symbols(env!("CARGO_BIN_EXE_kvsim-server")),
        symbols(env!("CARGO_BIN_EXE_kvsim")),
    ) else {
        skip(test, Need::Tools, "nm (binutils) is not installed");
        return;
    };
    let in_cli = found(&cli, FAULT_MODULES);
    let stale: Vec<&&str> = FAULT_MODULES
        .iter()
        .filter(|n| !in_cli.contains(n))
        .collect();
    assert!(
        stale.is_empty(),
        "kvsim itself has none of {stale:?}: a renamed item, so the list no longer \
         names what it guards"
    );
    let mut leaked = found(&server, FAULT_MODULES);
    leaked.extend(found(&server, FAULT_ITEMS));
    assert!(
        leaked.is_empty(),
        "kvsim-server links fault injection: {leaked:?}"
    );
    // What it must link: the engine's nodes and the runtime.
    for needed in ["kvsim_engine::nodes::", "kvsim_runtime::"] {
        assert!(server.contains(needed), "kvsim-server has no {needed}");
    }
}
