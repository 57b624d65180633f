//! Sweeps: many seeds of one scenario in parallel, with a summary that merges.
//!
//! Seeds run on a rayon pool of `jobs` threads without building any trace (a failing
//! seed is replayed with one later: determinism makes that exact). A sweep can be cut
//! into shards (`k/n`: every n-th seed of the range, starting with the k-th, 1-based)
//! so that any batch system (Slurm arrays, Kubernetes indexed jobs, CI matrices) runs
//! it across machines; each shard's [`SweepSummary`] is JSON, and [`SweepSummary::merge`]
//! adds them up. With `check_determinism` every seed runs twice and the two trace
//! hashes must agree.

use crate::plan::{Plan, Reduction};
use crate::report::secs;
use crate::scenario::{Scenario, ScenarioError};
use crate::{run_plan, Backend, RunOutcome};
use kvsim_engine::bugs::BugSet;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Instant;

/// A half-open range of seeds, `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedRange {
    pub start: u64,
    pub end: u64,
}

/// A bad command-line value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    #[error("--seeds `{0}`: expected A..B (B exclusive), A..=B or a single seed")]
    Seeds(String),
    #[error("--shard `{0}`: expected K/N with 1 <= K <= N")]
    Shard(String),
    #[error("--jobs must be at least 1")]
    Jobs,
    #[error("cannot merge: {0}")]
    Merge(String),
}

impl SeedRange {
    /// Parse `A..B`, `A..=B` or `N`.
    pub fn parse(s: &str) -> Result<SeedRange, UsageError> {
        let bad = || UsageError::Seeds(s.to_string());
        let num = |x: &str| x.trim().replace('_', "").parse::<u64>().map_err(|_| bad());
        let r = if let Some((a, b)) = s.split_once("..=") {
            SeedRange {
                start: num(a)?,
                end: num(b)?.checked_add(1).ok_or_else(bad)?,
            }
        } else if let Some((a, b)) = s.split_once("..") {
            SeedRange {
                start: num(a)?,
                end: num(b)?,
            }
        } else {
            let n = num(s)?;
            SeedRange {
                start: n,
                end: n.checked_add(1).ok_or_else(bad)?,
            }
        };
        if r.end <= r.start {
            return Err(bad());
        }
        Ok(r)
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

impl std::fmt::Display for SeedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// Shard `k` of `n` (1-based): the seeds `start + k - 1`, `start + k - 1 + n`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub k: u32,
    pub n: u32,
}

impl Shard {
    pub const WHOLE: Shard = Shard { k: 1, n: 1 };

    pub fn parse(s: &str) -> Result<Shard, UsageError> {
        let bad = || UsageError::Shard(s.to_string());
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k: u32 = k.trim().parse().map_err(|_| bad())?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        if n == 0 || k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }

    /// The seeds of `range` this shard runs.
    pub fn seeds(&self, range: SeedRange) -> impl Iterator<Item = u64> {
        let (k, n) = (u64::from(self.k), u64::from(self.n));
        (range.start..range.end).filter(move |s| (s - range.start) % n == k - 1)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// How to run a sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    pub seeds: SeedRange,
    pub shard: Shard,
    /// Worker threads; `None`: one per core.
    pub jobs: Option<usize>,
    pub bugs: Option<BugSet>,
    /// Show a progress bar (on stderr).
    pub progress: bool,
    /// Run each seed twice and compare trace hashes.
    pub check_determinism: bool,
    /// Keep at most this many failures (the earliest seeds) in the summary.
    pub keep_failures: usize,
    /// Stop after the first failing seed (in seed order among those run).
    pub stop_at_first: bool,
    /// Also export each seed's trace and audit it (`kvsim audit`'s oracle, fed only
    /// the JSON lines); a seed whose audit verdict differs from the in-process one is
    /// reported.
    pub audit: bool,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            seeds: SeedRange { start: 0, end: 100 },
            shard: Shard::WHOLE,
            jobs: None,
            bugs: None,
            progress: false,
            check_determinism: false,
            keep_failures: 20,
            stop_at_first: false,
            audit: false,
        }
    }
}

/// One failing seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub seed: u64,
    /// The first invariant found: `S3` when violated, `S3 detected` when a defense
    /// stopped the hazard (nothing leaked).
    pub invariant: String,
    pub detail: String,
    pub at_ns: u64,
    /// Every invariant the seed violated or a defense detected, in order of first
    /// appearance (detections as `S3 detected`).
    pub invariants: Vec<String>,
    pub trace_hash: String,
    pub replay: String,
}

/// What a sweep (or a merge of shards) found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub scenario: String,
    /// The scenario file as given on the command line.
    pub path: String,
    pub bugs: String,
    pub seeds: SeedRange,
    /// The shards this summary covers.
    pub shards: Vec<Shard>,
    pub seeds_run: u64,
    /// Simulated time over all seeds, in nanoseconds.
    pub sim_ns: u64,
    pub events: u64,
    /// Wall-clock seconds (summed over merged shards).
    pub wall_s: f64,
    /// Worker threads (the largest over merged shards).
    pub jobs: usize,
    pub failing_seeds: u64,
    /// Seeds whose first violation is each invariant.
    pub violations: BTreeMap<String, u64>,
    /// The earliest failing seeds.
    pub failures: Vec<Failure>,
    /// Seeds whose two runs differed (with `--check-determinism`).
    pub nondeterministic: Vec<u64>,
    /// Seeds whose exported trace, audited alone, got another verdict than the run
    /// (with `--audit`), and how many seeds were audited.
    #[serde(default)]
    pub audit_mismatches: Vec<u64>,
    #[serde(default)]
    pub audited: u64,
}

impl SweepSummary {
    pub fn clean(&self) -> bool {
        self.failing_seeds == 0
            && self.nondeterministic.is_empty()
            && self.audit_mismatches.is_empty()
    }

    pub fn seeds_per_s(&self) -> f64 {
        self.seeds_run as f64 / self.wall_s.max(1e-9)
    }
    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.wall_s.max(1e-9)
    }
    /// Simulated time over wall time.
    pub fn sim_ratio(&self) -> f64 {
        self.sim_ns as f64 / 1e9 / self.wall_s.max(1e-9)
    }

    /// The closing summary, as printed at the end of a sweep.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let shards: Vec<String> = self.shards.iter().map(|x| x.to_string()).collect();
        let _ = writeln!(
            s,
            "sweep {} seeds {} (shard {}), bugs {}",
            self.scenario,
            self.seeds,
            shards.join("+"),
            self.bugs
        );
        let _ = writeln!(s, "  seeds run       {}", self.seeds_run);
        let _ = writeln!(s, "  simulated time  {}", secs(self.sim_ns));
        let _ = writeln!(s, "  events          {}", self.events);
        if self.failing_seeds == 0 {
            let _ = writeln!(s, "  violations      none");
        } else {
            let by: Vec<String> = self
                .violations
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(
                s,
                "  violations      {} failing seeds; first violation by invariant: {}",
                self.failing_seeds,
                by.join(", ")
            );
            let _ = writeln!(s, "  first failing seeds:");
            for f in self.failures.iter().take(5) {
                let _ = writeln!(
                    s,
                    "    seed {}: {} ({}) {}",
                    f.seed,
                    f.invariant,
                    f.invariants.join(","),
                    f.detail
                );
                let _ = writeln!(s, "      {}", f.replay);
            }
        }
        if !self.nondeterministic.is_empty() {
            let _ = writeln!(
                s,
                "  NONDETERMINISTIC seeds (two runs, two traces): {:?}",
                self.nondeterministic
            );
        }
        if self.audited > 0 {
            if self.audit_mismatches.is_empty() {
                let _ = writeln!(
                    s,
                    "  audit           {} traces audited alone: every verdict equals the run's, finding for finding",
                    self.audited
                );
            } else {
                let _ = writeln!(
                    s,
                    "  AUDIT MISMATCH seeds (the trace alone judged otherwise): {:?}",
                    self.audit_mismatches
                );
            }
        }
        let _ = writeln!(
            s,
            "  speed           {:.0} seeds/s, {:.0} events/s, simulated time {:.0}x faster than real time ({:.2}s wall, {} jobs)",
            self.seeds_per_s(),
            self.events_per_s(),
            self.sim_ratio(),
            self.wall_s,
            self.jobs
        );
        s
    }

    /// Add up shard summaries of the same sweep (same scenario, bugs and seed range).
    pub fn merge(parts: &[SweepSummary]) -> Result<SweepSummary, UsageError> {
        let Some(first) = parts.first() else {
            return Err(UsageError::Merge("no summaries given".into()));
        };
        let mut out = SweepSummary {
            shards: Vec::new(),
            seeds_run: 0,
            sim_ns: 0,
            events: 0,
            wall_s: 0.0,
            jobs: 0,
            failing_seeds: 0,
            violations: BTreeMap::new(),
            failures: Vec::new(),
            nondeterministic: Vec::new(),
            audit_mismatches: Vec::new(),
            audited: 0,
            ..first.clone()
        };
        for p in parts {
            if (p.scenario.as_str(), p.bugs.as_str(), p.seeds)
                != (first.scenario.as_str(), first.bugs.as_str(), first.seeds)
            {
                return Err(UsageError::Merge(format!(
                    "{} {} {} differs from {} {} {}",
                    p.scenario, p.bugs, p.seeds, first.scenario, first.bugs, first.seeds
                )));
            }
            for s in &p.shards {
                if out.shards.contains(s) {
                    return Err(UsageError::Merge(format!("shard {s} appears twice")));
                }
                out.shards.push(*s);
            }
            out.seeds_run += p.seeds_run;
            out.sim_ns += p.sim_ns;
            out.events += p.events;
            out.wall_s += p.wall_s;
            out.jobs = out.jobs.max(p.jobs);
            out.failing_seeds += p.failing_seeds;
            for (k, v) in &p.violations {
                *out.violations.entry(k.clone()).or_insert(0) += v;
            }
            out.failures.extend(p.failures.iter().cloned());
            out.nondeterministic
                .extend(p.nondeterministic.iter().copied());
            out.audit_mismatches
                .extend(p.audit_mismatches.iter().copied());
            out.audited += p.audited;
        }
        out.shards.sort_by_key(|s| (s.n, s.k));
        out.failures.sort_by_key(|f| f.seed);
        out.failures.truncate(first.failures.len().max(20));
        out.nondeterministic.sort();
        Ok(out)
    }
}

/// What one seed did.
struct SeedResult {
    seed: u64,
    events: u64,
    sim_ns: u64,
    failure: Option<Failure>,
    nondeterministic: bool,
    /// `Some(agreed)` when audited.
    audit: Option<bool>,
}

/// A finding as a sweep names it: `S3`, or `S3 detected` for a defense that fired.
pub fn finding_name(f: &kvsim_oracle::Finding) -> String {
    if f.violated() {
        f.violation.invariant.to_string()
    } else {
        format!("{} detected", f.violation.invariant)
    }
}

/// A seed fails on its first finding: a violation, or a hazard a defense had to stop.
fn failure_of(out: &RunOutcome, path: &str) -> Option<Failure> {
    let f = out.first().or_else(|| out.first_finding())?;
    let mut invariants: Vec<String> = Vec::new();
    for g in &out.findings {
        let n = finding_name(g);
        if !invariants.contains(&n) {
            invariants.push(n);
        }
    }
    Some(Failure {
        seed: out.seed,
        invariant: finding_name(f),
        detail: f.violation.detail.clone(),
        at_ns: f.at_ns,
        invariants,
        trace_hash: format!("{:016x}", out.trace_hash),
        replay: crate::report::replay_command(path, out),
    })
}

/// Run the seeds of `opts` (this shard's) and summarise. `path` names the scenario
/// file in replay commands.
pub fn run_sweep(
    sc: &Scenario,
    path: &str,
    opts: &SweepOptions,
) -> Result<SweepSummary, ScenarioError> {
    let seeds: Vec<u64> = opts.shard.seeds(opts.seeds).collect();
    // Plans are cheap; building them first reports a bad scenario before any thread
    // starts, and keeps the workers free of error handling.
    let plans = seeds
        .iter()
        .map(|&s| Plan::build(sc, s, opts.bugs, &Reduction::default()))
        .collect::<Result<Vec<_>, _>>()?;
    let jobs = opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::new(plans.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} seeds, {per_sec}, eta {eta} {msg}",
        ) {
            b.set_style(style.progress_chars("=> "));
        }
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let stop = std::sync::atomic::AtomicU64::new(u64::MAX);
    let run_one = |plan: &Plan| -> Option<SeedResult> {
        if opts.stop_at_first && plan.seed > stop.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let (out, audit) = if opts.audit {
            let (out, agreed) = crate::run_and_audit(plan, Backend::Symbolic);
            (out, Some(agreed.is_ok()))
        } else {
            (run_plan(plan, Backend::Symbolic, false), None)
        };
        let nondeterministic = opts.check_determinism && {
            let again = run_plan(plan, Backend::Symbolic, false);
            again.trace_hash != out.trace_hash || again.findings != out.findings
        };
        let failure = failure_of(&out, path);
        if failure.is_some() {
            stop.fetch_min(plan.seed, std::sync::atomic::Ordering::Relaxed);
            bar.set_message(format!(
                "(first failure: seed {})",
                stop.load(std::sync::atomic::Ordering::Relaxed)
            ));
        }
        bar.inc(1);
        Some(SeedResult {
            seed: plan.seed,
            events: out.events,
            sim_ns: out.sim_ns,
            failure,
            nondeterministic,
            audit,
        })
    };
    let t = Instant::now();
    let results: Vec<SeedResult> = match rayon::ThreadPoolBuilder::new().num_threads(jobs).build() {
        Ok(pool) => pool.install(|| plans.par_iter().filter_map(run_one).collect()),
        // No threads to be had: run on this one.
        Err(_) => plans.iter().filter_map(run_one).collect(),
    };
    let wall_s = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut results = results;
    if opts.stop_at_first {
        let first = results
            .iter()
            .filter(|r| r.failure.is_some())
            .map(|r| r.seed)
            .min();
        if let Some(f) = first {
            results.retain(|r| r.seed <= f);
        }
    }
    let mut s = SweepSummary {
        scenario: sc.name.clone(),
        path: path.to_string(),
        bugs: opts.bugs.unwrap_or(sc.engine.bugs).to_string(),
        seeds: opts.seeds,
        shards: vec![opts.shard],
        seeds_run: results.len() as u64,
        sim_ns: results.iter().map(|r| r.sim_ns).sum(),
        events: results.iter().map(|r| r.events).sum(),
        wall_s,
        jobs,
        failing_seeds: 0,
        violations: BTreeMap::new(),
        failures: Vec::new(),
        nondeterministic: results
            .iter()
            .filter(|r| r.nondeterministic)
            .map(|r| r.seed)
            .collect(),
        audit_mismatches: results
            .iter()
            .filter(|r| r.audit == Some(false))
            .map(|r| r.seed)
            .collect(),
        audited: results.iter().filter(|r| r.audit.is_some()).count() as u64,
    };
    for r in results {
        if let Some(f) = r.failure {
            s.failing_seeds += 1;
            *s.violations.entry(f.invariant.clone()).or_insert(0) += 1;
            if s.failures.len() < opts.keep_failures {
                s.failures.push(f);
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_shards_parse() {
        assert_eq!(
            SeedRange::parse("0..10").unwrap(),
            SeedRange { start: 0, end: 10 }
        );
        assert_eq!(SeedRange::parse("3..=4").unwrap().len(), 2);
        assert_eq!(SeedRange::parse("7").unwrap().len(), 1);
        assert!(SeedRange::parse("5..5").is_err());
        assert!(SeedRange::parse("a..b").is_err());
        let s = Shard::parse("2/3").unwrap();
        let r = SeedRange { start: 10, end: 20 };
        assert_eq!(s.seeds(r).collect::<Vec<_>>(), vec![11, 14, 17]);
        assert!(Shard::parse("0/3").is_err());
        assert!(Shard::parse("4/3").is_err());
        // The shards of a sweep cover every seed exactly once.
        let mut all: Vec<u64> = (1..=3)
            .flat_map(|k| Shard { k, n: 3 }.seeds(r).collect::<Vec<_>>())
            .collect();
        all.sort();
        assert_eq!(all, (10..20).collect::<Vec<_>>());
    }
}
