//! Long commands show progress, and `--quiet` silences it: `check` prints states,
//! unique states/s and the queue depth periodically on stderr; the default suite
//! announces each row on stderr as it starts.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

mod cli;

#[test]
fn check_prints_progress_with_rate_and_queue_unless_quiet() {
    // Every millisecond (the default is every 2 s): handoff-small runs long enough
    // in a test build for several lines.
    let args = ["check", "--model", "handoff-small", "--progress-ms", "1"];
    let o = cli::kvsim(&args);
    assert_eq!(o.status.code(), Some(0), "{}", cli::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    assert!(!lines.is_empty(), "no progress line: {err}");
    for l in &lines {
        for want in [
            " states, ",
            " unique (",
            " unique states/s), queue ",
            ", depth ",
        ] {
            assert!(l.contains(want), "`{l}` lacks `{want}`");
        }
        // The queue depth is a number, not `-`: the checker counts it.
        let queue = l.split(", queue ").nth(1).and_then(|t| t.split(',').next());
        assert!(
            queue.is_some_and(|q| q.parse::<u64>().is_ok()),
            "queue depth in `{l}`"
        );
    }
    // Unique states only grow from one line to the next.
    let unique: Vec<u64> = lines
        .iter()
        .filter_map(|l| l.split(" states, ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(unique.windows(2).all(|w| w[0] <= w[1]), "{unique:?}");

    let mut quiet = args.to_vec();
    quiet.push("--quiet");
    let o = cli::kvsim(&quiet);
    assert_eq!(o.status.code(), Some(0), "{}", cli::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("progress: "),
        "--quiet printed progress: {err}"
    );
}

/// Start the default suite, read stdout until the first row's report is printed,
/// then stop it; returns what it wrote on stderr by then.
fn suite_until_first_row(quiet: bool) -> String {
    let mut args = vec!["suite"];
    if quiet {
        args.push("--quiet");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(cli::root())
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvsim starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        let done = line.starts_with("first findings:");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr text");
    assert!(
        seen.iter().any(|l| l.starts_with("first findings:")),
        "the first row never finished: {seen:?}"
    );
    err
}

#[test]
fn the_default_suite_announces_each_row_as_it_starts_unless_quiet() {
    let err = suite_until_first_row(false);
    let announced: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("-- running: "))
        .collect();
    // The first row was announced before it ran; the second as it started (the
    // suite was stopped right after the first row's report).
    assert_eq!(
        announced.first().copied(),
        Some("-- running: the incident with the historical bugs"),
        "{err}"
    );
    assert!(announced.len() <= 2, "{err}");
    let err = suite_until_first_row(true);
    assert!(
        !err.contains("-- running: "),
        "--quiet announced rows: {err}"
    );
}
