//! The allow-list of known layout violations (`xtask/layout-allow.toml`) and the verdict
//! it gives on a measured tree.
//!
//! The list only gets shorter: a listed violation may shrink but not grow, a new one
//! fails, and an entry that no longer matches a violation fails with a message saying
//! to delete it. It is not the measurement (`mod.rs`); it only compares figures.

use super::findings::{Findings, FILE_MAX, FN_LONG, FN_LONG_BUDGET, FN_MAX};
use serde::{Deserialize, Serialize};

/// The reason written into a freshly generated list.
pub const FIRST_REASON: &str = "not yet split (issue 35)";

/// The allow-list file.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct AllowList {
    #[serde(default)]
    pub file: Vec<FileEntry>,
    #[serde(default)]
    pub function: Vec<FnEntry>,
    #[serde(default)]
    pub cycle: Vec<CycleEntry>,
}

/// A production file over the line limit, with its length when listed.
#[derive(Debug, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub lines: usize,
    pub reason: String,
}

/// A function over a length limit, named `path` and `name` (`Type::method`).
#[derive(Debug, Serialize, Deserialize)]
pub struct FnEntry {
    pub path: String,
    pub name: String,
    pub lines: usize,
    pub reason: String,
}

/// A module cycle of one crate, as the set of its files.
#[derive(Debug, Serialize, Deserialize)]
pub struct CycleEntry {
    #[serde(rename = "crate")]
    pub krate: String,
    pub files: Vec<String>,
    pub reason: String,
}

impl AllowList {
    /// Every violation of `found`, each listed with its figure and the first reason.
    /// The functions between the two limits are listed only when they exceed the budget.
    pub fn from_findings(found: &Findings) -> AllowList {
        let reason = || FIRST_REASON.to_string();
        let mut list = AllowList::default();
        let over_budget = found.long_fns().count() > FN_LONG_BUDGET;
        for c in &found.crates {
            for (path, lines) in &c.long_files {
                list.file.push(FileEntry {
                    path: path.clone(),
                    lines: *lines,
                    reason: reason(),
                });
            }
            for (path, f) in &c.long_fns {
                if f.lines > FN_MAX || over_budget {
                    list.function.push(FnEntry {
                        path: path.clone(),
                        name: f.name.clone(),
                        lines: f.lines,
                        reason: reason(),
                    });
                }
            }
            for cy in &c.cycles {
                list.cycle.push(CycleEntry {
                    krate: c.name.clone(),
                    files: cy.files.clone(),
                    reason: reason(),
                });
            }
        }
        list
    }

    /// The violations of `found` that this list does not excuse, and its stale entries.
    pub fn judge(&self, found: &Findings) -> Vec<String> {
        let mut bad = Vec::new();
        self.judge_files(found, &mut bad);
        self.judge_fns(found, &mut bad);
        self.judge_cycles(found, &mut bad);
        for (path, why) in &found.parse_errors {
            bad.push(format!("{path}: does not parse: {why}"));
        }
        bad
    }

    fn judge_files(&self, found: &Findings, bad: &mut Vec<String>) {
        let long: Vec<&(String, usize)> = found.crates.iter().flat_map(|c| &c.long_files).collect();
        for (path, lines) in &long {
            match self.file.iter().find(|e| &e.path == path) {
                Some(e) if *lines > e.lines => bad.push(format!(
                    "{path}: {lines} lines, grew past its listed {} (limit {})",
                    e.lines, FILE_MAX
                )),
                Some(_) => {}
                None => bad.push(format!(
                    "{path}: {lines} lines, over the limit of {}",
                    FILE_MAX
                )),
            }
        }
        for e in &self.file {
            if !long.iter().any(|(p, _)| *p == e.path) {
                bad.push(format!(
                    "{}: no longer over {} lines: delete its [[file]] entry from the allow-list",
                    e.path, FILE_MAX
                ));
            }
        }
    }

    fn judge_fns(&self, found: &Findings, bad: &mut Vec<String>) {
        let mut unlisted = Vec::new();
        let long: Vec<_> = found.long_fns().collect();
        for (path, f) in &long {
            let entry = self
                .function
                .iter()
                .find(|e| &e.path == path && e.name == f.name);
            match entry {
                Some(e) if f.lines > e.lines => bad.push(format!(
                    "{path}:{} {}: {} lines, grew past its listed {}",
                    f.line, f.name, f.lines, e.lines
                )),
                Some(_) => {}
                None if f.lines > FN_MAX => bad.push(format!(
                    "{path}:{} {}: {} lines, over the limit of {FN_MAX}",
                    f.line, f.name, f.lines
                )),
                None => unlisted.push(format!("{path}:{} {} ({} lines)", f.line, f.name, f.lines)),
            }
        }
        if long.len() > FN_LONG_BUDGET && !unlisted.is_empty() {
            bad.push(format!(
                "{} functions over {FN_LONG} lines (at most {FN_LONG_BUDGET}); not listed: {}",
                long.len(),
                unlisted.join(", ")
            ));
        }
        for e in &self.function {
            if !long.iter().any(|(p, f)| *p == e.path && f.name == e.name) {
                bad.push(format!(
                    "{} {}: no longer over {FN_LONG} lines: delete its [[function]] entry from the allow-list",
                    e.path, e.name
                ));
            }
        }
    }

    fn judge_cycles(&self, found: &Findings, bad: &mut Vec<String>) {
        for c in &found.crates {
            for cy in &c.cycles {
                let listed = self
                    .cycle
                    .iter()
                    .any(|e| e.krate == c.name && cy.files.iter().all(|f| e.files.contains(f)));
                if !listed {
                    bad.push(format!(
                        "{}: module cycle among {}",
                        c.name,
                        cy.files.join(", ")
                    ));
                }
            }
        }
        for e in &self.cycle {
            let still = found.crates.iter().filter(|c| c.name == e.krate).any(|c| {
                c.cycles
                    .iter()
                    .any(|cy| cy.files.iter().all(|f| e.files.contains(f)))
            });
            if !still {
                bad.push(format!(
                    "{}: the cycle among {} is gone: delete its [[cycle]] entry from the allow-list",
                    e.krate,
                    e.files.join(", ")
                ));
            }
        }
    }
}
