//! Where the workspace and its `target/` are, for set-up and the skip records.

use std::path::PathBuf;

/// The workspace root (this crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Where set-up installs and skips are recorded: the workspace's `target/`, whatever
/// `CARGO_TARGET_DIR` a build uses (the loom build has its own; the tools are shared).
pub fn target_dir() -> PathBuf {
    workspace_root().join("target")
}
