//! No runtime module names std's threads, channels, locks or atomics around the one
//! place they come from (`src/sync/`): under `--cfg shuttle` that module hands out
//! shuttle's, and a primitive named around it would be one the schedule test
//! (`tests/schedules.rs`) never schedules, so it would pass without having checked it.
//! (Clippy's `disallowed-types` cannot say this: in the normal build the module's
//! re-exports are std's own types.)
#![cfg(not(shuttle))]

use std::path::{Path, PathBuf};

/// What only `src/sync/` may name. `Arc` is std's in both builds.
const AROUND: [&str; 5] = [
    "std::sync::mpsc",
    "std::sync::atomic",
    "std::sync::Mutex",
    "std::sync::RwLock",
    "std::thread",
];

/// The lines of `text` (outside comments) that name one of [`AROUND`], or group one
/// in a `std::sync::{...}` import.
fn offenses(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .filter(|l| {
            AROUND.iter().any(|p| l.contains(p))
                || (l.contains("std::sync::{")
                    && ["Mutex", "RwLock", "mpsc", "atomic"]
                        .iter()
                        .any(|p| l.contains(p)))
        })
        .map(String::from)
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("runtime/src reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_runtime_module_names_a_primitive_around_the_sync_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 30, "found {} files", files.len());
    let found: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("sync")))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("a source file reads");
            let name = f.display().to_string();
            offenses(&text)
                .into_iter()
                .map(move |l| format!("{name}: {l}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "use crate::sync instead:\n{}",
        found.join("\n")
    );
}

/// The check can fail: it finds each way of naming a primitive directly, and passes
/// the facade's own names and comments.
#[test]
fn the_check_finds_a_primitive_named_directly() {
    for direct in [
        "use std::sync::mpsc::channel;",
        "use std::sync::{Arc, Mutex};",
        "let t = std::thread::spawn(f);",
        "flag: std::sync::atomic::AtomicBool,",
    ] {
        assert_eq!(offenses(direct).len(), 1, "{direct}");
    }
    for fine in [
        "use crate::sync::mpsc::channel;",
        "use std::sync::Arc;",
        "// std::thread is named in a comment",
    ] {
        assert!(offenses(fine).is_empty(), "{fine}");
    }
}
