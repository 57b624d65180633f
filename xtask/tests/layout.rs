//! `cargo xtask layout`: the repository passes against its allow-list, and on small
//! fixture trees written to a temporary directory each rule fires.

use kvsim_testenv::workspace_root;
use std::path::Path;
use xtask::layout::{check, ALLOW_PATH};

#[test]
fn the_repository_is_within_its_allow_list() {
    let root = workspace_root();
    let outcome = check(&root, &root.join(ALLOW_PATH)).expect("the check runs");
    assert!(
        outcome.violations.is_empty(),
        "layout violations:\n{}",
        outcome.report
    );
}

/// A one-crate workspace `a` with `files` under `a/src/` and the allow-list `allow`.
fn fixture(files: &[(&str, String)], allow: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    write(root, "Cargo.toml", "[workspace]\nmembers = [\"a\"]\n");
    write(root, "a/Cargo.toml", "[package]\nname = \"a\"\n");
    write(root, ALLOW_PATH, allow);
    for (path, text) in files {
        write(root, &format!("a/src/{path}"), text);
    }
    dir
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// The violations of the fixture, joined for matching.
fn violations(files: &[(&str, String)], allow: &str) -> String {
    let dir = fixture(files, allow);
    let root = dir.path();
    let outcome = check(root, &root.join(ALLOW_PATH)).expect("the check runs");
    outcome.violations.join("\n")
}

fn lines(n: usize) -> String {
    "//\n".repeat(n)
}

fn long_fn(body_lines: usize) -> String {
    format!(
        "pub fn f() {{\n{}}}\n",
        "    let _ = 1;\n".repeat(body_lines)
    )
}

#[test]
fn a_file_over_600_lines_fails_and_600_passes() {
    let v = violations(&[("lib.rs", lines(601))], "");
    assert!(v.contains("a/src/lib.rs: 601 lines, over the limit"), "{v}");
    assert_eq!(violations(&[("lib.rs", lines(600))], ""), "");
}

#[test]
fn a_function_over_100_lines_fails_and_test_code_does_not_count() {
    let v = violations(&[("lib.rs", long_fn(99))], "");
    assert!(
        v.contains("a/src/lib.rs:1 f: 101 lines, over the limit"),
        "{v}"
    );
    assert_eq!(violations(&[("lib.rs", long_fn(98))], ""), "");
    let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", long_fn(200));
    assert_eq!(violations(&[("lib.rs", tests)], ""), "");
}

#[test]
fn a_cycle_through_use_super_fails() {
    let files = [
        (
            "lib.rs",
            "mod b;\npub struct X;\npub fn g() { b::h() }\n".to_string(),
        ),
        (
            "b.rs",
            "use super::X;\npub fn h() { let _ = X; }\n".to_string(),
        ),
    ];
    let v = violations(&files, "");
    assert!(
        v.contains("module cycle among a/src/b.rs, a/src/lib.rs"),
        "{v}"
    );
}

#[test]
fn a_cycle_through_an_inline_crate_path_fails() {
    let files = [
        ("lib.rs", "mod a;\nmod b;\n".to_string()),
        ("a.rs", "pub fn f() { crate::b::g() }\n".to_string()),
        (
            "b.rs",
            "pub fn g() {}\npub fn h() { crate::a::f() }\n".to_string(),
        ),
    ];
    let v = violations(&files, "");
    assert!(
        v.contains("module cycle among a/src/a.rs, a/src/b.rs"),
        "{v}"
    );
}

#[test]
fn a_listed_file_that_grew_fails() {
    let allow = "[[file]]\npath = \"a/src/lib.rs\"\nlines = 700\nreason = \"r\"\n";
    assert_eq!(violations(&[("lib.rs", lines(650))], allow), "");
    let v = violations(&[("lib.rs", lines(701))], allow);
    assert!(v.contains("701 lines, grew past its listed 700"), "{v}");
}

#[test]
fn a_listed_entry_no_longer_needed_fails() {
    let allow = "[[file]]\npath = \"a/src/lib.rs\"\nlines = 700\nreason = \"r\"\n";
    let v = violations(&[("lib.rs", lines(10))], allow);
    assert!(v.contains("delete its [[file]] entry"), "{v}");
    let allow =
        "[[cycle]]\ncrate = \"a\"\nfiles = [\"a/src/a.rs\", \"a/src/b.rs\"]\nreason = \"r\"\n";
    let v = violations(&[("lib.rs", lines(10))], allow);
    assert!(v.contains("delete its [[cycle]] entry"), "{v}");
}

#[test]
fn a_file_that_does_not_parse_is_reported_not_a_panic() {
    let v = violations(&[("lib.rs", "fn (".to_string())], "");
    assert!(v.contains("a/src/lib.rs: does not parse"), "{v}");
}
