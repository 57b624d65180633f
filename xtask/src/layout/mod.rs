//! `cargo xtask layout`: the source layout limits of issue 35, measured on every
//! workspace member crate.
//!
//! Production code is each crate's `src/` (`src/bin` included); tests, benches,
//! examples and build scripts are not. The limits: no production file over
//! [`FILE_MAX`] lines, no function over [`FN_MAX`] lines and at most
//! [`FN_LONG_BUDGET`] over [`FN_LONG`] outside tests, no module cycle inside a crate.
//! Known violations live in `xtask/layout-allow.toml` ([`allow`]), which may only
//! shrink. It also counts, without a limit, the `pub` and `pub(crate)` items.
//! A file that does not parse is a violation named by its path and reason.

pub mod allow;
pub mod findings;
pub mod graph;
pub mod source;

pub use findings::{
    CrateFindings, Findings, ALLOW_PATH, FILE_MAX, FN_LONG, FN_LONG_BUDGET, FN_MAX,
};

use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The check's result: the printable report and the violations the allow-list does
/// not excuse (empty when the tree passes).
pub struct Outcome {
    pub report: String,
    pub violations: Vec<String>,
}

/// Measure the workspace at `root` and judge it against the allow-list at `allow_path`
/// (a missing list excuses nothing).
pub fn check(root: &Path, allow_path: &Path) -> Result<Outcome> {
    let found = measure(root)?;
    let list = match std::fs::read_to_string(allow_path) {
        Ok(text) => {
            toml::from_str(&text).with_context(|| format!("reading {}", allow_path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => allow::AllowList::default(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", allow_path.display())),
    };
    let violations = list.judge(&found);
    let report = render(&found, &violations);
    Ok(Outcome { report, violations })
}

/// Write an allow-list that excuses exactly today's violations.
pub fn write_allow(root: &Path, allow_path: &Path) -> Result<()> {
    let found = measure(root)?;
    let list = allow::AllowList::from_findings(&found);
    let head = "# Known violations of the layout limits (`cargo xtask layout`, issue 35).\n\
                # An entry may shrink but not grow; delete it once it no longer violates.\n\n";
    let body = toml::to_string(&list).context("writing the allow-list")?;
    std::fs::write(allow_path, format!("{head}{body}"))
        .with_context(|| format!("writing {}", allow_path.display()))
}

/// Measure every member crate of the workspace at `root`.
pub fn measure(root: &Path) -> Result<Findings> {
    let mut found = Findings::default();
    for (dir, name) in members(root)? {
        let c = measure_crate(root, &dir, name, &mut found.parse_errors)?;
        found.crates.push(c);
    }
    Ok(found)
}

/// The member crates: their directory (relative to `root`, `.` for the root package)
/// and package name.
fn members(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let manifest = read_toml(&root.join("Cargo.toml"))?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    if manifest.contains_key("package") {
        dirs.push(PathBuf::from("."));
    }
    let listed = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str());
    dirs.extend(listed.filter(|m| !skipped(Path::new(m))).map(PathBuf::from));
    let mut out = Vec::new();
    for dir in dirs {
        let m = read_toml(&root.join(&dir).join("Cargo.toml"))?;
        let name = m
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .with_context(|| format!("{}/Cargo.toml has no package name", dir.display()))?;
        out.push((dir, name.to_string()));
    }
    Ok(out)
}

fn read_toml(path: &Path) -> Result<toml::Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Whether a path lies under `vendor/`, `fuzz/` or `target/`.
fn skipped(path: &Path) -> bool {
    path.components()
        .any(|c| matches!(c.as_os_str().to_str(), Some("vendor" | "fuzz" | "target")))
}

/// A crate's production files: every `.rs` under `src/`, sorted, relative to `src/`.
fn production_files(src: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = src.join(&rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        for entry in entries {
            let entry = entry?;
            let child = rel.join(entry.file_name());
            if skipped(&child) {
                continue;
            }
            if entry.file_type()?.is_dir() {
                todo.push(child);
            } else if child.extension().is_some_and(|e| e == "rs") {
                out.push(child);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Measure one crate; files that do not parse go to `parse_errors`.
fn measure_crate(
    root: &Path,
    dir: &Path,
    name: String,
    parse_errors: &mut Vec<(String, String)>,
) -> Result<CrateFindings> {
    let src = root.join(dir).join("src");
    let mut c = CrateFindings {
        name,
        ..CrateFindings::default()
    };
    let mut parsed: Vec<(String, PathBuf, syn::File)> = Vec::new();
    for rel in production_files(&src)? {
        let shown = display_path(&dir.join("src").join(&rel));
        let text =
            std::fs::read_to_string(src.join(&rel)).with_context(|| format!("reading {shown}"))?;
        let lines = text.bytes().filter(|&b| b == b'\n').count();
        if lines > FILE_MAX {
            c.long_files.push((shown.clone(), lines));
        }
        match syn::parse_file(&text) {
            Ok(file) => parsed.push((shown, rel, file)),
            Err(e) => {
                let at = e.span().start();
                parse_errors.push((shown, format!("line {}: {e}", at.line)));
            }
        }
    }
    let placed = nodes(&parsed);
    let tests = test_modules(&placed);
    for node in &placed {
        let in_tests = tests
            .iter()
            .any(|(tree, m)| *tree == node.tree && node.module.starts_with(m));
        if in_tests {
            continue;
        }
        let (shown, file) = (&node.path, node.file);
        let fig = source::figures(file);
        c.pub_items += fig.pub_items;
        c.pub_crate_items += fig.pub_crate_items;
        let long = fig.fns.into_iter().filter(|f| f.lines > FN_LONG);
        c.long_fns.extend(long.map(|f| (shown.clone(), f)));
    }
    c.cycles = graph::cycles(&placed);
    Ok(c)
}

/// The module paths a `#[cfg(test)] mod x;` declares: the files under them are tests.
fn test_modules(nodes: &[graph::Node]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for n in nodes {
        for item in &n.file.items {
            if let syn::Item::Mod(m) = item {
                if m.content.is_none() && source::is_test(&m.attrs) {
                    let module = [n.module.clone(), vec![m.ident.to_string()]].concat();
                    out.push((n.tree.clone(), module));
                }
            }
        }
    }
    out
}

/// A path for the report: `/`-separated, without a leading `./`.
fn display_path(p: &Path) -> String {
    let s = p.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").unwrap_or(&s).to_string()
}

/// Place each file in its crate root's module tree. `lib.rs` roots the tree `lib`;
/// `main.rs` roots `main`, which also holds the modules it declares when a `lib.rs`
/// exists; each `src/bin/NAME.rs` or `src/bin/NAME/main.rs` roots `bin/NAME`.
fn nodes(parsed: &[(String, PathBuf, syn::File)]) -> Vec<graph::Node<'_>> {
    let has_lib = parsed.iter().any(|(_, rel, _)| rel == Path::new("lib.rs"));
    let main_mods: Vec<String> = parsed
        .iter()
        .filter(|(_, rel, _)| rel == Path::new("main.rs"))
        .flat_map(|(_, _, f)| &f.items)
        .filter_map(|i| match i {
            syn::Item::Mod(m) if m.content.is_none() => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    parsed
        .iter()
        .map(|(shown, rel, file)| {
            let (tree, module) = place(rel, has_lib, &main_mods);
            graph::Node {
                path: shown.clone(),
                tree,
                module,
                file,
            }
        })
        .collect()
}

/// The tree and module path of a file at `rel` under `src/`.
fn place(rel: &Path, has_lib: bool, main_mods: &[String]) -> (String, Vec<String>) {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs").to_string();
    if parts.first().map(String::as_str) == Some("bin") {
        let (tree, rest) = match parts.get(1) {
            Some(name) => (format!("bin/{name}"), parts[2..].to_vec()),
            None => (format!("bin/{stem}"), Vec::new()),
        };
        let mut module = rest;
        if parts.len() > 1 && !(parts.len() == 2 && stem == "main") {
            module.push(stem);
        }
        return (tree, module);
    }
    let root_file = parts.is_empty() && (stem == "lib" || stem == "main");
    if !(root_file || stem == "mod") {
        parts.push(stem.clone());
    }
    let in_main = !has_lib
        || (root_file && stem == "main")
        || parts.first().is_some_and(|m| main_mods.contains(m));
    let tree = if in_main && !(root_file && stem == "lib") {
        "main"
    } else {
        "lib"
    };
    (tree.to_string(), parts)
}

/// The report: per crate its long files, long functions and cycles, then a summary.
fn render(found: &Findings, violations: &[String]) -> String {
    let mut s = String::new();
    for c in &found.crates {
        let _ = writeln!(
            s,
            "== {}: {} file(s) over {FILE_MAX}, {} fn(s) over {FN_LONG} ({} over {FN_MAX}), {} cycle(s); pub {}, pub(crate) {}",
            c.name,
            c.long_files.len(),
            c.long_fns.len(),
            c.long_fns.iter().filter(|(_, f)| f.lines > FN_MAX).count(),
            c.cycles.len(),
            c.pub_items,
            c.pub_crate_items
        );
        for (path, lines) in &c.long_files {
            let _ = writeln!(s, "   file {path}: {lines} lines");
        }
        for (path, f) in &c.long_fns {
            let _ = writeln!(s, "   fn   {path}:{} {} {}", f.line, f.name, f.lines);
        }
        for cy in &c.cycles {
            let _ = writeln!(s, "   cycle {}", cy.files.join(", "));
            for (a, b, names) in &cy.arrows {
                let _ = writeln!(s, "      {a} -> {b}: {}", names.join(", "));
            }
        }
    }
    for (path, why) in &found.parse_errors {
        let _ = writeln!(s, "   unparsed {path}: {why}");
    }
    for v in violations {
        let _ = writeln!(s, "VIOLATION {v}");
    }
    let _ = writeln!(s, "{}", summary(found, violations.len()));
    s
}

fn summary(found: &Findings, violations: usize) -> String {
    let sum = |f: fn(&CrateFindings) -> usize| found.crates.iter().map(f).sum::<usize>();
    let fns_max = found.long_fns().filter(|(_, f)| f.lines > FN_MAX).count();
    format!(
        "layout: {} crate(s); {} file(s) over {FILE_MAX}; {} fn(s) over {FN_LONG}, {fns_max} over {FN_MAX}; {} cycle(s); {} unparsed; pub {}, pub(crate) {}; {}",
        found.crates.len(),
        sum(|c| c.long_files.len()),
        found.long_fns().count(),
        sum(|c| c.cycles.len()),
        found.parse_errors.len(),
        sum(|c| c.pub_items),
        sum(|c| c.pub_crate_items),
        match violations {
            0 => "ok (within the allow-list)".to_string(),
            n => format!("{n} violation(s)"),
        }
    )
}
