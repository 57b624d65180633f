//! The guide's link check: every relative link in `README.md` and under `docs/`
//! resolves to a file that exists, every `#anchor` to a heading of its target (the
//! anchor rule mdBook and GitHub share), and every page under `docs/` is a chapter of
//! `docs/SUMMARY.md` (a page outside the book is a page nobody finds).

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// One broken link: the file it is in, the line, the target, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    pub file: PathBuf,
    pub line: usize,
    pub target: String,
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.file.display(),
            self.line,
            self.target,
            self.why
        )
    }
}

/// A heading's anchor as mdBook writes it (and GitHub does): lowercase, spaces to
/// `-`, letters, digits, `-` and `_` kept, everything else dropped.
pub fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// A Markdown file's links (with their lines) and its headings' anchors.
#[derive(Debug, Default)]
pub struct Page {
    pub links: Vec<(usize, String)>,
    pub anchors: BTreeSet<String>,
}

/// Parse one page.
pub fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<(String, Option<String>)> = None;
    let opts = Options::ENABLE_TABLES | Options::ENABLE_HEADING_ATTRIBUTES;
    for (ev, range) in Parser::new_ext(text, opts).into_offset_iter() {
        let line = text[..range.start].matches('\n').count() + 1;
        match ev {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                page.links.push((line, dest_url.to_string()));
            }
            Event::Start(Tag::Heading { id, .. }) => {
                heading = Some((String::new(), id.map(|i| i.to_string())))
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((h, _)) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((h, id)) = heading.take() {
                    let base = id.unwrap_or_else(|| anchor_of(&h));
                    let n = seen.entry(base.clone()).or_insert(0);
                    page.anchors.insert(if *n == 0 {
                        base.clone()
                    } else {
                        format!("{base}-{n}")
                    });
                    *n += 1;
                }
            }
            Event::Html(h) | Event::InlineHtml(h) => page.anchors.extend(html_ids(&h)),
            _ => {}
        }
    }
    page
}

/// The `id="..."` and `name="..."` anchors of raw HTML.
fn html_ids(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["id=\"", "name=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(key) {
            rest = &rest[i + key.len()..];
            if let Some(end) = rest.find('"') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

/// Is this link outside the repository (a URL with a scheme, or mail)?
fn external(target: &str) -> bool {
    let scheme = target.split_once(':').map(|(s, _)| s);
    scheme.is_some_and(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

/// `dir/rel` with `.` and `..` folded away (no file system access).
fn join(dir: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in dir.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every Markdown file under `dir`, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Check the links of `README.md` and every page under `docs/` of the repository at
/// `root`; paths in the answer are relative to `root`. An empty answer means none broken.
pub fn check(root: &Path) -> Vec<Broken> {
    let mut files = vec![root.join("README.md")];
    files.extend(markdown_under(&root.join("docs")));
    let pages: BTreeMap<PathBuf, Page> = files
        .iter()
        .filter_map(|f| Some((f.clone(), parse(&std::fs::read_to_string(f).ok()?))))
        .collect();
    let mut broken = Vec::new();
    for (file, page) in &pages {
        for (line, target) in &page.links {
            if let Some(why) = judge(file, target, &pages) {
                let rel = file.strip_prefix(root).unwrap_or(file).to_path_buf();
                broken.push(Broken {
                    file: rel,
                    line: *line,
                    target: target.clone(),
                    why,
                });
            }
        }
    }
    broken.extend(orphans(root, &pages));
    broken
}

/// Why the link `target` in `file` is broken, or `None`.
fn judge(file: &Path, target: &str, pages: &BTreeMap<PathBuf, Page>) -> Option<String> {
    if external(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = match path.is_empty() {
        true => file.to_path_buf(),
        false => join(file.parent()?, path),
    };
    if !dest.exists() {
        return Some(format!("no such file ({})", dest.display()));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    match pages.get(&dest) {
        Some(p) if p.anchors.contains(anchor) => None,
        Some(_) => Some(format!(
            "no heading with anchor `#{anchor}` in {}",
            dest.display()
        )),
        None => None,
    }
}

/// The pages under `docs/` that `docs/SUMMARY.md` does not link (none is allowed).
fn orphans(root: &Path, pages: &BTreeMap<PathBuf, Page>) -> Vec<Broken> {
    let docs = root.join("docs");
    let summary = docs.join("SUMMARY.md");
    let Some(s) = pages.get(&summary) else {
        return vec![Broken {
            file: "docs/SUMMARY.md".into(),
            line: 0,
            target: String::new(),
            why: "the guide has no SUMMARY.md".into(),
        }];
    };
    let listed: BTreeSet<PathBuf> = s
        .links
        .iter()
        .filter(|(_, t)| !external(t))
        .map(|(_, t)| join(&docs, t.split('#').next().unwrap_or_default()))
        .collect();
    pages
        .keys()
        .filter(|p| p.starts_with(&docs) && **p != summary && !listed.contains(*p))
        .map(|p| Broken {
            file: p.strip_prefix(root).unwrap_or(p).to_path_buf(),
            line: 0,
            target: String::new(),
            why: "not a chapter of docs/SUMMARY.md".into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_mdbooks_rule() {
        assert_eq!(
            anchor_of("Auditing a trace (`kvsim audit`)"),
            "auditing-a-trace-kvsim-audit"
        );
        assert_eq!(
            anchor_of("Issue 23, part 4: the KV path"),
            "issue-23-part-4-the-kv-path"
        );
        assert_eq!(anchor_of("snake_case and-dash"), "snake_case-and-dash");
    }

    #[test]
    fn a_page_gives_its_links_lines_and_anchors() {
        let p = parse(
            "# Top\n\nSee [a](b.md#x) and [c](https://e.org).\n\n## Top\n\n<a id=\"raw\"></a>\n",
        );
        assert_eq!(
            p.links,
            vec![(3, "b.md#x".to_string()), (3, "https://e.org".to_string())]
        );
        let want: BTreeSet<String> = ["top", "top-1", "raw"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(p.anchors, want);
    }

    #[test]
    fn broken_links_and_orphans_are_found() {
        let root = std::env::temp_dir().join(format!("kvsim-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("docs/guide")).expect("temp dir");
        let write = |p: &str, t: &str| std::fs::write(root.join(p), t).expect("write");
        write(
            "README.md",
            "[ok](docs/guide/a.md#one) [bad](docs/nope.md) [anchor](docs/guide/a.md#two)\n",
        );
        write("docs/SUMMARY.md", "- [A](guide/a.md)\n");
        write(
            "docs/guide/a.md",
            "# One\n[up](../../README.md) [web](https://x.y)\n",
        );
        write("docs/orphan.md", "# Orphan\n");
        let got: Vec<String> = check(&root)
            .iter()
            .map(|b| format!("{}:{}", b.file.display(), b.target))
            .collect();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            got,
            vec![
                "README.md:docs/nope.md",
                "README.md:docs/guide/a.md#two",
                "docs/orphan.md:"
            ]
        );
    }
}
