//! The figures the layout check measures and the limits it holds them to.
//!
//! Plain data: it measures nothing itself (`mod.rs` does) and judges nothing
//! (`allow.rs` does), so that both can read it without depending on each other.

use super::{graph, source};

/// The most lines a production file may have.
pub const FILE_MAX: usize = 600;
/// The most lines a function may have.
pub const FN_MAX: usize = 100;
/// The length over which a function counts against [`FN_LONG_BUDGET`].
pub const FN_LONG: usize = 70;
/// How many functions may be over [`FN_LONG`] in the whole tree.
pub const FN_LONG_BUDGET: usize = 10;

/// The allow-list's place under the workspace root.
pub const ALLOW_PATH: &str = "xtask/layout-allow.toml";

/// What one crate measures.
#[derive(Debug, Default)]
pub struct CrateFindings {
    /// The package name (`kvsim-engine`).
    pub name: String,
    /// Production files over [`FILE_MAX`]: path from the root, lines.
    pub long_files: Vec<(String, usize)>,
    /// Functions over [`FN_LONG`]: path from the root, the function.
    pub long_fns: Vec<(String, source::FnLen)>,
    pub cycles: Vec<graph::Cycle>,
    pub pub_items: usize,
    pub pub_crate_items: usize,
}

/// What the whole workspace measures.
#[derive(Debug, Default)]
pub struct Findings {
    pub crates: Vec<CrateFindings>,
    /// Files that do not parse: path, reason.
    pub parse_errors: Vec<(String, String)>,
}

impl Findings {
    /// Every function over [`FN_LONG`], with its path.
    pub fn long_fns(&self) -> impl Iterator<Item = &(String, source::FnLen)> {
        self.crates.iter().flat_map(|c| &c.long_fns)
    }
}
