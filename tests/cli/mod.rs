//! What the command-line tests share: run the built `kvsim` from the repository root
//! with its folder first on the PATH, read its output, make temporary files.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The PATH with the built `kvsim`'s folder first: printed replay commands then
/// read `kvsim ...` (without it, `cargo run --release -- ...`).
pub fn path_with_kvsim() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_kvsim"))
        .parent()
        .expect("a folder")
        .to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&rest))).expect("a PATH")
}

/// Run `kvsim` with `args` and wait for it.
pub fn kvsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .env("PATH", path_with_kvsim())
        .args(args)
        .output()
        .expect("kvsim runs")
}

/// Standard output and standard error together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A path in this test binary's own temporary folder (`tag` keeps binaries apart).
pub fn tmp_in(tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsim-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

pub const MIXED: &str = "scenarios/mixed-faults.toml";
pub const INCIDENT: &str = "gate-checks-finished-only,no-length-agreement";
