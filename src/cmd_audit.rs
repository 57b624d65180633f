//! `kvsim audit`: judge a run from its trace files alone (thin: parse, call, print).

use anyhow::Result;
use kvsim_oracle::audit::{audit, render, AuditOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Trace files (JSON Lines, `docs/TRACE.md`, schema version 2 or 1): one per run,
    /// or one per node of a deployment (merged by time). `-` reads standard input.
    #[arg(required = true, value_name = "TRACE.jsonl")]
    pub traces: Vec<PathBuf>,
    /// Skip the second pass that prints the causal trace of each finding.
    #[arg(long)]
    pub no_causal: bool,
    /// Causal traces for at most this many findings.
    #[arg(long, default_value_t = 3)]
    pub explain: usize,
    /// Write the findings as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the run's timeline to FILE as one self-contained HTML page: a lane per
    /// node and tenant, messages and KV writes as arrows, each room use's pages, the
    /// audit's first violation marked in red, detections in amber. A long trace is
    /// drawn around its first violation (at most 3,000 entries; the page says which);
    /// the trace files are read a second time for it (docs/guide/timeline.md).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// Exit 0: no invariant violated (detections are printed, they are not failures);
/// 1: a violation; 2: a trace that cannot be used (the error names the file, the line
/// and the field).
pub fn run(a: &AuditArgs) -> Result<ExitCode> {
    if a.html.is_some() && a.traces.iter().any(|p| p.to_str() == Some("-")) {
        anyhow::bail!("--html reads the traces a second time: give files, not standard input");
    }
    let opts = AuditOptions {
        causal: !a.no_causal,
        max_findings_explained: a.explain,
        ..AuditOptions::default()
    };
    let t = std::time::Instant::now();
    let report = match audit(&a.traces, opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: unusable trace: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    print!("{}", render(&report));
    eprintln!("{}", speed(report.bytes, t.elapsed().as_secs_f64()));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report.findings)?;
        std::fs::write(path, text)?;
    }
    if let Some(file) = &a.html {
        use kvsim_oracle::timeline::{focus_point, Timeline, DEFAULT_MAX_ENTRIES};
        let focus = focus_point(&report.findings);
        let (header, entries, first) =
            kvsim_oracle::audit::timeline_window(&a.traces, focus, DEFAULT_MAX_ENTRIES)
                .map_err(|e| anyhow::anyhow!("--html: reading the traces again: {e}"))?;
        let names: Vec<String> = a.traces.iter().map(|p| p.display().to_string()).collect();
        let mut t = Timeline::new(
            &header,
            &entries,
            &report.findings,
            format!("kvsim audit {}", names.join(" ")),
        );
        t.first = first;
        t.total = report.entries + 1;
        println!("{}", crate::html::write(file, &t)?);
    }
    Ok(if report.violated() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The audit's throughput and the process's peak memory (on standard error: the
/// report itself stays the same from run to run).
fn speed(bytes: u64, secs: f64) -> String {
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or("unknown".to_string(), |kb| {
            format!("{:.1} MB", kb as f64 / 1e3)
        });
    format!(
        "audit speed: {:.1} MB in {secs:.2} s wall, {:.1} MB/s; peak RSS {peak}",
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / secs.max(1e-9)
    )
}
