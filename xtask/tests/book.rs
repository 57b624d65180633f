//! The guide (`docs/`, an mdBook): its links resolve, every page is a chapter, and it
//! builds with the pinned mdBook (installed under `target/tools` on first use; a
//! skip, or a failure under `KVSIM_REQUIRE_TOOLS=1`, where it cannot be had).

use kvsim_testenv::{setup, skip, workspace_root, Need};
use std::process::Command;

#[test]
fn the_guides_links_resolve_and_every_page_is_a_chapter() {
    let broken = xtask::links::check(&workspace_root());
    let list: Vec<String> = broken.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "broken links in the guide:\n{}",
        list.join("\n")
    );
}

#[test]
fn the_guide_builds_with_mdbook() {
    const TEST: &str = "the_guide_builds_with_mdbook";
    let mdbook = match setup::mdbook() {
        Ok(m) => m,
        Err(why) => return skip(TEST, Need::Tools, &format!("no mdBook ({why})")),
    };
    let out_dir = std::env::temp_dir().join(format!("kvsim-book-{}", std::process::id()));
    let root = workspace_root();
    let out = Command::new(&mdbook)
        .arg("build")
        .arg(root.join("docs"))
        .arg("--dest-dir")
        .arg(&out_dir)
        .output()
        .expect("mdbook runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build failed:\n{log}");
    assert!(
        !log.contains("[WARN]") && !log.contains("WARN "),
        "mdbook warned:\n{log}"
    );
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).expect("SUMMARY.md");
    let chapters = xtask::links::parse(&summary).links;
    assert!(
        chapters.len() >= 5,
        "a guide of {} chapters",
        chapters.len()
    );
    for (_, md) in &chapters {
        let html = out_dir.join(
            md.split('#')
                .next()
                .unwrap_or_default()
                .replace(".md", ".html"),
        );
        assert!(
            html.is_file(),
            "chapter {md} was not built ({})",
            html.display()
        );
    }
    assert!(out_dir.join("index.html").is_file());
    let _ = std::fs::remove_dir_all(&out_dir);
}
