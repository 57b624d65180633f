//! The record of a run's skips, and the closing list.
//!
//! Each skip is one file under `target/kvsim-skips/<run>/`, where the run is
//! `KVSIM_SKIP_RUN` when set (`cargo xtask test` sets it) or else the parent process's
//! id: every test binary of one `cargo test` (or one nextest run) is a child of the
//! same process. The workspace's last test binary (`xtask`'s `zz_skipped`) and
//! `cargo xtask test` print the list.

use crate::paths::target_dir;
use std::path::PathBuf;

/// One recorded skip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    pub test: String,
    pub why: String,
    /// Skipped by design on this machine (no CUDA device), not for a missing install.
    pub expected: bool,
}

/// This run's identity (see the module's comment).
pub fn run_id() -> String {
    std::env::var("KVSIM_SKIP_RUN")
        .ok()
        .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or_else(|| std::os::unix::process::parent_id().to_string())
}

/// The folder that holds a run's skips.
pub fn run_dir(run: &str) -> PathBuf {
    target_dir().join("kvsim-skips").join(run)
}

/// Record that `test` skipped because `why`. Best effort: a record that cannot be
/// written is reported on the visible line, and the skip itself was already printed.
pub fn record(test: &str, why: &str, expected: bool) {
    record_in(&run_id(), test, why, expected);
}

/// [`record`] into the given run.
pub fn record_in(run: &str, test: &str, why: &str, expected: bool) {
    let dir = run_dir(run);
    let name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let body = format!(
        "{}\n{test}\n{why}\n",
        if expected { "expected" } else { "missing" }
    );
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(name), body));
    if let Err(e) = written {
        visible(&format!(
            "(the skip of {test} could not be recorded under {}: {e})",
            dir.display()
        ));
    }
}

/// Every skip recorded for `run`, sorted by test name.
pub fn list(run: &str) -> Vec<Skip> {
    let Ok(entries) = std::fs::read_dir(run_dir(run)) else {
        return Vec::new();
    };
    let mut out: Vec<Skip> = entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| parse(&text))
        .collect();
    out.sort_by(|a, b| a.test.cmp(&b.test));
    out
}

fn parse(text: &str) -> Option<Skip> {
    let mut lines = text.lines();
    let kind = lines.next()?;
    let test = lines.next()?.to_string();
    let why = lines.next()?.to_string();
    Some(Skip {
        test,
        why,
        expected: kind == "expected",
    })
}

/// The closing list, as printed: a heading, then one line per skip.
pub fn render(skips: &[Skip]) -> String {
    let missing = skips.iter().filter(|s| !s.expected).count();
    let mut out = String::from("== skipped tests\n");
    if skips.is_empty() {
        out.push_str("none: every test ran\n");
    }
    for s in skips {
        let kind = if s.expected {
            "expected here"
        } else {
            "missing set-up"
        };
        out.push_str(&format!("SKIPPED ({kind}) {}: {}\n", s.test, s.why));
    }
    if missing > 0 {
        out.push_str(&format!(
            "{missing} test(s) skipped for a missing set-up: `cargo xtask setup` installs it (apt packages as root)\n"
        ));
    }
    out
}

/// Remove the records of runs whose process is gone (keeps `target/` from growing).
pub fn prune(keep: &str) {
    let Ok(entries) = std::fs::read_dir(target_dir().join("kvsim-skips")) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let alive = name
            .parse::<u32>()
            .is_ok_and(|pid| PathBuf::from(format!("/proc/{pid}")).exists());
        if name != keep && !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Print a line past the test harness's output capture (which takes only `print!`),
/// so `cargo test` shows it whether or not the test passes.
pub fn visible(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed stdout is no reason to fail a test.
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_renders() {
        let run = format!("selftest-{}", std::process::id());
        record_in(&run, "a::b test", "no `nft` on PATH", false);
        record_in(&run, "gpu_one", "no CUDA driver", true);
        let got = list(&run);
        let _ = std::fs::remove_dir_all(run_dir(&run));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].test, "a::b test");
        assert!(!got[0].expected);
        assert!(got[1].expected);
        let text = render(&got);
        assert!(
            text.contains("SKIPPED (missing set-up) a::b test: no `nft` on PATH"),
            "{text}"
        );
        assert!(
            text.contains("1 test(s) skipped for a missing set-up"),
            "{text}"
        );
        assert!(render(&[]).contains("none: every test ran"));
    }
}
