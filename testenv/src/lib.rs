//! What kvsim's tests need from the machine, in one place.
//!
//! A test that needs something outside Rust (a pinned Python client, NVRTC, network
//! namespaces, a browser, mdBook) asks this crate for it. What can live under
//! `target/` is installed on first use, pinned and idempotently ([`setup`]); what needs
//! the system's package manager is installed by `cargo xtask setup` (as root). When a
//! need cannot be met, the test calls [`skip`]: under the need's require variable (or
//! `KVSIM_REQUIRE_ALL=1`, which `cargo xtask test` and CI set) that fails the test;
//! otherwise the skip is printed past the harness's capture and recorded, and the run
//! ends with the list of every skip and its reason ([`skips`]).
//!
//! Invariant: no test passes by skipping silently. Every early return for a missing
//! need goes through [`skip`] or [`skip_expected`].

pub mod nixl;
pub mod pins;
pub mod setup;
pub mod skips;

mod need;
mod paths;

pub use need::{required, required_by, skip, skip_expected, Need};
pub use paths::{target_dir, workspace_root};
pub use skips::visible;

use std::path::PathBuf;

/// The Python interpreter that has `module` importable (the pinned clients' virtual
/// environment unless `KVSIM_PYTHON` names another), or the test skips: `None`, with
/// the skip printed and recorded, or a failure under `KVSIM_REQUIRE_PY_CLIENTS=1`.
pub fn python(test: &str, module: &str) -> Option<PathBuf> {
    match setup::python_with(module) {
        Ok(py) => Some(py),
        Err(why) => {
            skip(test, Need::PyClients, &why);
            None
        }
    }
}

/// vLLM's router's executable (the pinned wheel under `target/vllm-router`, installed
/// on first use; `KVSIM_VLLM_ROUTER` names another), or the test skips (a failure under
/// `KVSIM_REQUIRE_VLLM_ROUTER=1`, which `cargo xtask test` sets).
pub fn vllm_router(test: &str) -> Option<PathBuf> {
    match setup::vllm_router() {
        Ok(p) => Some(p),
        Err(why) => {
            skip(test, Need::VllmRouter, &why);
            None
        }
    }
}

/// The folder that holds NVRTC's libraries (`KVSIM_NVRTC_DIR`, else the pinned wheel
/// in the clients' environment, installed on first use), or the test skips.
pub fn nvrtc_dir(test: &str) -> Option<PathBuf> {
    match setup::nvrtc_dir() {
        Ok(dir) => Some(dir),
        Err(why) => {
            skip(test, Need::Nvrtc, &why);
            None
        }
    }
}

/// The path of `tool` on `PATH` when it answers `--version`, or the test skips with
/// the package that provides it (installed by `cargo xtask setup` as root).
pub fn tool(test: &str, need: Need, tool: &str) -> Option<PathBuf> {
    match setup::which(tool) {
        Some(p) => Some(p),
        None => {
            let why = format!(
                "no `{tool}` on PATH (Debian package {}; `cargo xtask setup` installs it as root)",
                setup::apt_package_of(tool)
            );
            skip(test, need, &why);
            None
        }
    }
}

/// The folder of the pinned NIXL wheel's libraries (installed on first use under
/// `target/nixl`; `KVSIM_NIXL_LIB_DIR` names another), when this build of `kvsim` has
/// the `nixl` feature (`built`): otherwise, or when it cannot be had, the test skips
/// (a failure under `KVSIM_REQUIRE_NIXL=1`, which `cargo xtask test` sets).
pub fn nixl_lib_dir(test: &str, built: bool) -> Option<PathBuf> {
    if !built {
        let why = "kvsim was built without the `nixl` feature (`cargo xtask test` builds \
                   it; by hand: --features nixl, which needs libclang)";
        skip(test, Need::Nixl, why);
        return None;
    }
    match nixl::lib_dir() {
        Ok(dir) => Some(dir),
        Err(why) => {
            skip(test, Need::Nixl, &why);
            None
        }
    }
}
