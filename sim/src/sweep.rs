//! Sweeps: many seeds of one scenario in parallel, with a summary that merges.
//!
//! Seeds stream through a rayon pool of `jobs` threads in batches, without building
//! any trace (a failing seed is replayed with one later: determinism makes that
//! exact), so a sweep's memory does not grow with its seed range; it may stop early
//! (first failure, time budget, Ctrl-C) and then records where to resume. A sweep can be cut
//! into shards (`k/n`: every n-th seed of the range, starting with the k-th, 1-based)
//! so that any batch system (Slurm arrays, Kubernetes indexed jobs, CI matrices) runs
//! it across machines; each shard's [`SweepSummary`] is JSON, and [`SweepSummary::merge`]
//! adds them up. With `check_determinism` every seed runs twice and the two trace
//! hashes must agree.

use crate::coverage::Coverage;
use crate::plan::{Plan, Reduction};
use crate::report::secs;
use crate::scenario::{Scenario, ScenarioError};
use crate::{run_plan, Backend, RunOutcome};
use kvsim_engine::bugs::BugSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    #[error("--seeds `{0}`: seed 18446744073709551615 (u64::MAX) is past the last sweepable seed (a sweep's range is half-open: it ends at most at u64::MAX, exclusive); run that seed alone with `kvsim replay --seed 18446744073709551615`")]
    SeedsMax(String),
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
        let max = || UsageError::SeedsMax(s.to_string());
        let num = |x: &str| x.trim().replace('_', "").parse::<u64>().map_err(|_| bad());
        let r = if let Some((a, b)) = s.split_once("..=") {
            SeedRange {
                start: num(a)?,
                end: num(b)?.checked_add(1).ok_or_else(max)?,
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
                end: n.checked_add(1).ok_or_else(max)?,
            }
        };
        if r.end <= r.start {
            return Err(bad());
        }
        Ok(r)
    }

    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
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

    /// The seeds of `range` this shard runs, in order, computed one at a time (a
    /// range of 10^18 seeds costs nothing until it is iterated).
    pub fn seeds(&self, range: SeedRange) -> impl Iterator<Item = u64> {
        let (k, n) = (u64::from(self.k), u64::from(self.n));
        let first = range.start.checked_add(k - 1).filter(|&f| f < range.end);
        let count = first.map_or(0, |f| (range.end - f - 1) / n + 1);
        (0..count).map(move |i| first.unwrap_or(0) + i * n)
    }

    /// How many seeds of `range` this shard runs.
    pub fn count(&self, range: SeedRange) -> u64 {
        let (k, n) = (u64::from(self.k), u64::from(self.n));
        match range.start.checked_add(k - 1).filter(|&f| f < range.end) {
            Some(f) => (range.end - f - 1) / n + 1,
            None => 0,
        }
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
    /// With `stop_at_first`, a seed with a detection and no violation stops the sweep
    /// too (the bug matrix: a switch counts as caught when a defense had to stop its
    /// hazard). It changes only where the sweep stops, never which seed fails.
    pub stop_on_detection: bool,
    /// Also audit each seed's trace alone (`kvsim audit`'s oracle, fed only the
    /// trace's header and entries, handed over in memory: [`crate::run_and_audit_in_memory`]);
    /// a seed whose audit verdict differs from the in-process one is reported.
    pub audit: bool,
    /// Stop starting seeds once this much wall time has passed.
    pub time_budget: Option<Duration>,
    /// Raised (by a Ctrl-C handler): stop starting seeds, summarise what ran.
    pub interrupt: Option<Arc<AtomicBool>>,
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
            stop_on_detection: false,
            audit: false,
            time_budget: None,
            interrupt: None,
        }
    }
}

/// One seed with a finding: a failing seed (a violation), or, in
/// [`SweepSummary::detected`], a seed whose every finding a defense stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub seed: u64,
    /// The first violation (`S3`) of a failing seed; for a seed with detections only,
    /// the first detection (`S3 detected`: a defense stopped the hazard, nothing
    /// leaked).
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
    /// The shards this summary covers (each records its K and N).
    pub shards: Vec<Shard>,
    /// The seeds of `seeds` that these shards hold (what a complete run covers).
    #[serde(default)]
    pub seeds_planned: u64,
    pub seeds_run: u64,
    /// Simulated time over all seeds, in nanoseconds.
    pub sim_ns: u64,
    pub events: u64,
    /// Wall-clock seconds (summed over merged shards).
    pub wall_s: f64,
    /// Worker threads (the largest over merged shards).
    pub jobs: usize,
    /// Seeds with a violation ([`kvsim_oracle::fails`]): only these fail.
    pub failing_seeds: u64,
    /// Seeds whose first violation is each invariant.
    pub violations: BTreeMap<String, u64>,
    /// The earliest failing seeds.
    pub failures: Vec<Failure>,
    /// Seeds with a detection and no violation (they pass: a defense stopped every
    /// hazard they met).
    #[serde(default)]
    pub detected_seeds: u64,
    /// Seeds (failing or not) in which a defense detected each invariant.
    #[serde(default)]
    pub detections: BTreeMap<String, u64>,
    /// The earliest seeds with a detection and no violation.
    #[serde(default)]
    pub detected: Vec<Failure>,
    /// Seeds whose two runs differed (with `--check-determinism`).
    pub nondeterministic: Vec<u64>,
    /// Seeds whose exported trace, audited alone, got another verdict than the run
    /// (with `--audit`), and how many seeds were audited.
    #[serde(default)]
    pub audit_mismatches: Vec<u64>,
    #[serde(default)]
    pub audited: u64,
    /// Why the sweep stopped before its last seed (`first failure`, `interrupted`,
    /// `time budget spent`); `None` when it ran every seed.
    #[serde(default)]
    pub stopped: Option<String>,
    /// The first seed (of this shard) that did not run when the sweep stopped early:
    /// every earlier seed of the shard ran.
    #[serde(default)]
    pub resume_from: Option<u64>,
    /// Which fault kinds fired, cancel phases and engine paths were hit.
    #[serde(default)]
    pub coverage: Coverage,
}

impl SweepSummary {
    pub fn clean(&self) -> bool {
        self.failing_seeds == 0
            && self.nondeterministic.is_empty()
            && self.audit_mismatches.is_empty()
    }

    /// Every seed of the whole range ran (no shard missing, nothing stopped early).
    pub fn complete(&self) -> bool {
        self.seeds_run >= self.seeds.len()
    }

    /// Whether this summary judges declared reachability: every seed of its range ran
    /// (every shard merged) and nothing stopped early. A shard alone, a sweep cut by
    /// `--until-failure`, `--first`, a time budget or Ctrl-C does not judge; the merge
    /// of all shards does.
    pub fn judges_reach(&self) -> bool {
        self.complete() && self.stopped.is_none()
    }

    /// The paths the scenario declares (its `reach`) that no seed reached, when the
    /// summary judges them ([`SweepSummary::judges_reach`]); empty otherwise.
    pub fn unreached_paths(&self) -> Vec<String> {
        if self.judges_reach() {
            self.coverage.unreached_declared()
        } else {
            Vec::new()
        }
    }

    /// Why the sweep fails on reachability: the declared paths no seed reached, in a
    /// sentence; `None` when every declared path was reached (or it does not judge).
    pub fn reach_failure(&self) -> Option<String> {
        let missed = self.unreached_paths();
        if missed.is_empty() {
            return None;
        }
        let names: Vec<String> = missed.iter().map(|p| format!("`{p}`")).collect();
        let (what, was) = if missed.len() == 1 {
            ("declared path", "was")
        } else {
            ("declared paths", "were")
        };
        Some(format!(
            "{what} {} {was} reached by no seed of the {} seeds run: the scenario's faults do not exercise what it declares it exists to reach (run more seeds if the sweep is small, or change the scenario)",
            names.join(", "),
            self.seeds_run
        ))
    }

    /// `X of Y seeds covered`, where Y is the whole range (every shard of it), and
    /// the shards missing from it.
    pub fn coverage(&self) -> String {
        let mut s = format!("{} of {} seeds covered", self.seeds_run, self.seeds.len());
        let missing = self.missing_shards();
        if !missing.is_empty() {
            let m: Vec<String> = missing.iter().take(16).map(|x| x.to_string()).collect();
            let more = if missing.len() > 16 { ", ..." } else { "" };
            let _ = write!(s, "; missing shards {}{more}", m.join(", "));
        }
        s
    }

    /// The shards of this sweep's N that no merged summary holds.
    pub fn missing_shards(&self) -> Vec<Shard> {
        let Some(n) = self.shards.first().map(|s| s.n) else {
            return Vec::new();
        };
        (1..=n)
            .map(|k| Shard { k, n })
            .filter(|s| !self.shards.contains(s))
            .take(1000)
            .collect()
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
        if !self.complete() {
            let _ = writeln!(s, "  coverage        {} (INCOMPLETE)", self.coverage());
        }
        self.render_stopped(&mut s);
        let _ = writeln!(s, "  simulated time  {}", secs(self.sim_ns));
        let _ = writeln!(s, "  events          {}", self.events);
        self.render_violations(&mut s);
        self.render_detections(&mut s);
        if !self.nondeterministic.is_empty() {
            let _ = writeln!(
                s,
                "  NONDETERMINISTIC seeds (two runs, two traces): {:?}",
                self.nondeterministic
            );
        }
        self.render_audit(&mut s);
        s.push_str(&self.coverage.render());
        s.push_str(&self.coverage.render_reach(self.judges_reach()));
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

    /// The `stopped` line of a sweep that stopped early: why, and how to resume.
    fn render_stopped(&self, s: &mut String) {
        let Some(why) = &self.stopped else {
            return;
        };
        let resume = match self.resume_from {
            Some(r) => {
                // `r` is a seed of the shard: shard 1/N of `r..end` continues it.
                let shard = match self.shards.first() {
                    Some(x) if x.n > 1 => format!(" --shard 1/{}", x.n),
                    _ => String::new(),
                };
                format!(
                    "; every seed of the shard before {r} ran, resume with --seeds {r}..{}{shard}",
                    self.seeds.end
                )
            }
            None => String::new(),
        };
        let _ = writeln!(s, "  stopped         {why}{resume}");
    }

    /// The violations line, and the first failing seeds with their replay commands.
    fn render_violations(&self, s: &mut String) {
        if self.failing_seeds == 0 && self.complete() {
            let _ = writeln!(s, "  violations      none");
            return;
        }
        if self.failing_seeds == 0 {
            let _ = writeln!(s, "  violations      none in the seeds run");
            return;
        }
        let _ = writeln!(
            s,
            "  violations      {} failing seeds; first violation by invariant: {}",
            self.failing_seeds,
            by_invariant(&self.violations)
        );
        let _ = writeln!(s, "  first failing seeds:");
        for f in self.failures.iter().take(5) {
            let _ = writeln!(s, "    {}", f.line());
            let _ = writeln!(s, "      {}", f.replay);
        }
    }

    /// The audit line of a sweep run with `--audit`.
    fn render_audit(&self, s: &mut String) {
        if self.audited == 0 {
            return;
        }
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

    /// The detections line: how many seeds a defense had to act in (they pass), by
    /// invariant, and the first of them.
    fn render_detections(&self, s: &mut String) {
        if self.detections.is_empty() {
            let _ = writeln!(s, "  detections      none");
            return;
        }
        let _ = writeln!(
            s,
            "  detections      {} seeds with detections only (a defense stopped every hazard, nothing leaked: they pass); seeds detecting each invariant: {}",
            self.detected_seeds,
            by_invariant(&self.detections)
        );
        if let Some(f) = self.detected.first() {
            let _ = writeln!(s, "    first: {}", f.line());
        }
    }

    /// A summary of no seed run of `seeds` of a scenario (its name and file).
    fn empty(
        (scenario, path): (String, String),
        bugs: String,
        seeds: SeedRange,
        coverage: Coverage,
    ) -> SweepSummary {
        SweepSummary {
            scenario,
            path,
            bugs,
            seeds,
            shards: Vec::new(),
            seeds_planned: 0,
            seeds_run: 0,
            sim_ns: 0,
            events: 0,
            wall_s: 0.0,
            jobs: 0,
            failing_seeds: 0,
            violations: BTreeMap::new(),
            failures: Vec::new(),
            detected_seeds: 0,
            detections: BTreeMap::new(),
            detected: Vec::new(),
            nondeterministic: Vec::new(),
            audit_mismatches: Vec::new(),
            audited: 0,
            stopped: None,
            resume_from: None,
            coverage,
        }
    }

    /// Will [`SweepSummary::add_seed`] keep the record of this seed's finding?
    fn keeps(&self, r: &SeedResult, opts: &SweepOptions) -> bool {
        let kept = if r.failed {
            &self.failures
        } else {
            &self.detected
        };
        r.finding.is_some() && kept.len() < opts.keep_failures
    }

    /// Count one seed's result; `on_failure` hears each failing seed.
    fn add_seed(
        &mut self,
        r: SeedResult,
        opts: &SweepOptions,
        on_failure: &mut dyn FnMut(&Failure),
    ) {
        let keep = opts.keep_failures;
        self.seeds_run += 1;
        self.sim_ns = self.sim_ns.saturating_add(r.sim_ns);
        self.events = self.events.saturating_add(r.events);
        self.coverage.add_run(&r.levels, &r.stats);
        if r.nondeterministic && self.nondeterministic.len() < keep.max(1) {
            self.nondeterministic.push(r.seed);
        }
        if let Some(agreed) = r.audit {
            self.audited += 1;
            if !agreed && self.audit_mismatches.len() < keep.max(1) {
                self.audit_mismatches.push(r.seed);
            }
        }
        for d in &r.detected {
            *self.detections.entry(d.clone()).or_insert(0) += 1;
        }
        match r.finding {
            Some(f) if r.failed => {
                self.failing_seeds += 1;
                *self.violations.entry(f.invariant.clone()).or_insert(0) += 1;
                on_failure(&f);
                if self.failures.len() < keep {
                    self.failures.push(f);
                }
            }
            Some(f) => {
                self.detected_seeds += 1;
                if self.detected.len() < keep {
                    self.detected.push(f);
                }
            }
            None => {}
        }
    }

    /// Add up shard summaries of the same sweep (same scenario, bugs and seed range).
    pub fn merge(parts: &[SweepSummary]) -> Result<SweepSummary, UsageError> {
        let Some(first) = parts.first() else {
            return Err(UsageError::Merge("no summaries given".into()));
        };
        let mut out = SweepSummary::empty(
            (first.scenario.clone(), first.path.clone()),
            first.bugs.clone(),
            first.seeds,
            Coverage::default(),
        );
        let n = first.shards.first().map_or(1, |s| s.n);
        for p in parts {
            p.check_part_of(first, n)?;
            for s in &p.shards {
                if out.shards.contains(s) {
                    return Err(UsageError::Merge(format!("shard {s} appears twice")));
                }
                out.shards.push(*s);
            }
            if p.seeds_run > p.seeds.len() {
                return Err(UsageError::Merge(format!(
                    "a summary claims {} seeds run of a range of {}",
                    p.seeds_run,
                    p.seeds.len()
                )));
            }
            out.add_part(p);
        }
        out.shards.sort_by_key(|s| (s.n, s.k));
        if out.seeds_run > out.seeds.len() {
            return Err(UsageError::Merge(format!(
                "{} seeds run in a range of {}: a shard was counted twice",
                out.seeds_run,
                out.seeds.len()
            )));
        }
        out.failures.sort_by_key(|f| f.seed);
        out.failures.dedup_by_key(|f| f.seed);
        out.failures.truncate(first.failures.len().max(20));
        out.detected.sort_by_key(|f| f.seed);
        out.detected.dedup_by_key(|f| f.seed);
        out.detected.truncate(first.detected.len().max(20));
        out.nondeterministic.sort();
        Ok(out)
    }

    /// Whether this summary is a shard of `first`'s sweep (same scenario, bugs and
    /// seeds; valid shards, all of `n`).
    fn check_part_of(&self, first: &SweepSummary, n: u32) -> Result<(), UsageError> {
        let p = self;
        if (p.scenario.as_str(), p.bugs.as_str(), p.seeds)
            != (first.scenario.as_str(), first.bugs.as_str(), first.seeds)
        {
            return Err(UsageError::Merge(format!(
                "{} {} {} differs from {} {} {}",
                p.scenario, p.bugs, p.seeds, first.scenario, first.bugs, first.seeds
            )));
        }
        if p.seeds.is_empty() {
            return Err(UsageError::Merge(format!("empty seed range {}", p.seeds)));
        }
        for s in &p.shards {
            if s.k == 0 || s.n == 0 || s.k > s.n {
                return Err(UsageError::Merge(format!(
                    "shard {s}: expected K/N with 1 <= K <= N"
                )));
            }
            // Shards of different N overlap (seed 0 is in 1/2 and 1/3): adding
            // them up would count seeds twice.
            if s.n != n {
                return Err(UsageError::Merge(format!(
                    "shard {s} is not a shard of {n}: shards of different N overlap; merge the shards of one sweep"
                )));
            }
        }
        Ok(())
    }

    /// Add the counts, findings and coverage of shard summary `p`.
    fn add_part(&mut self, p: &SweepSummary) {
        let add = |into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>| {
            for (k, v) in from {
                let e = into.entry(k.clone()).or_insert(0);
                *e = e.saturating_add(*v);
            }
        };
        self.seeds_planned = self.seeds_planned.saturating_add(p.seeds_planned);
        self.seeds_run = self.seeds_run.saturating_add(p.seeds_run);
        self.sim_ns = self.sim_ns.saturating_add(p.sim_ns);
        self.events = self.events.saturating_add(p.events);
        if p.stopped.is_some() {
            self.stopped = Some(format!(
                "shard {} stopped early ({})",
                p.shards.first().copied().unwrap_or(Shard::WHOLE),
                p.stopped.as_deref().unwrap_or("")
            ));
        }
        self.wall_s += p.wall_s;
        self.jobs = self.jobs.max(p.jobs);
        self.failing_seeds = self.failing_seeds.saturating_add(p.failing_seeds);
        add(&mut self.violations, &p.violations);
        self.failures.extend(p.failures.iter().cloned());
        self.detected_seeds = self.detected_seeds.saturating_add(p.detected_seeds);
        add(&mut self.detections, &p.detections);
        self.detected.extend(p.detected.iter().cloned());
        self.nondeterministic
            .extend(p.nondeterministic.iter().copied());
        self.audit_mismatches
            .extend(p.audit_mismatches.iter().copied());
        self.audited += p.audited;
        self.coverage.merge(&p.coverage);
    }
}

impl Failure {
    /// `seed 7: S3 (S3,S9 detected) detail`, as the summary lists a seed.
    fn line(&self) -> String {
        format!(
            "seed {}: {} ({}) {}",
            self.seed,
            self.invariant,
            self.invariants.join(","),
            self.detail
        )
    }
}

/// Seeds per invariant as `S3: 2, S9: 1`.
fn by_invariant(counts: &BTreeMap<String, u64>) -> String {
    let by: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    by.join(", ")
}

/// What one seed did.
struct SeedResult {
    seed: u64,
    events: u64,
    sim_ns: u64,
    /// The seed's findings, when it has any; `failed` by [`kvsim_oracle::fails`].
    finding: Option<Failure>,
    failed: bool,
    /// The invariants a defense detected in it.
    detected: Vec<String>,
    nondeterministic: bool,
    /// `Some(agreed)` when audited.
    audit: Option<bool>,
    /// The plan's fault kinds and what the run counted, for the coverage summary.
    levels: Vec<(crate::plan::FaultKind, u32)>,
    stats: crate::simulator::FaultStats,
}

/// A finding as a sweep names it: `S3`, or `S3 detected` for a defense that fired.
pub fn finding_name(f: &kvsim_oracle::Finding) -> String {
    if f.violated() {
        f.violation.invariant.to_string()
    } else {
        format!("{} detected", f.violation.invariant)
    }
}

/// The record of a seed with findings: its first violation, or its first detection
/// when it has none. Whether the seed fails is [`kvsim_oracle::fails`]'s rule alone.
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
        // Filled in for the records a summary keeps ([`SeedRunner::hash_kept`]).
        trace_hash: out
            .trace_hash
            .map_or_else(String::new, |h| crate::report::trace_hash(Some(h))),
        replay: crate::report::replay_command(path, out),
    })
}

/// A seed's run: with its trace hash only when the sweep compares two runs by it.
fn hashed_if(plan: &Plan, hashed: bool) -> RunOutcome {
    if hashed {
        run_plan(plan, Backend::Symbolic, false)
    } else {
        crate::run_plan_unhashed(plan)
    }
}

/// Seeds per batch and worker thread: a batch is the unit the sweep holds in memory
/// at once (its results, never its plans' traces), so memory does not grow with the
/// seed range.
const BATCH_PER_JOB: u64 = 64;

/// Run the seeds of `opts` (this shard's) and summarise. `path` names the scenario
/// file in replay commands.
pub fn run_sweep(
    sc: &Scenario,
    path: &str,
    opts: &SweepOptions,
) -> Result<SweepSummary, ScenarioError> {
    run_sweep_streaming(sc, path, opts, &mut |_| {})
}

/// [`run_sweep`], calling `on_failure` with each failing seed as soon as the batch
/// that holds it is done (in seed order within a batch, at most `keep_failures`
/// times). Seeds stream in batches of [`BATCH_PER_JOB`] per worker: memory stays
/// constant whatever the range (beyond the failures kept), and the sweep stops early,
/// recording why and where to resume, on `stop_at_first`, on `time_budget` or when
/// `interrupt` is raised (Ctrl-C).
pub fn run_sweep_streaming(
    sc: &Scenario,
    path: &str,
    opts: &SweepOptions,
    on_failure: &mut dyn FnMut(&Failure),
) -> Result<SweepSummary, ScenarioError> {
    let planned = opts.shard.count(opts.seeds);
    // A bad scenario is reported before any thread starts.
    if let Some(first) = opts.shard.seeds(opts.seeds).next() {
        Plan::build(sc, first, opts.bugs, &Reduction::default())?;
    }
    let jobs = worker_count(opts, planned);
    // No threads to be had: the batches run on this one.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(jobs).build();
    let runner = SeedRunner {
        sc,
        path,
        opts,
        started: Instant::now(),
        bar: progress_bar(opts.progress, planned),
        stop: AtomicU64::new(u64::MAX),
        halt: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    let mut coverage = Coverage::new(&sc.faults.cancel_phases);
    coverage.declared_reach = sc.reach.clone();
    let mut s = SweepSummary::empty(
        (sc.name.clone(), path.to_string()),
        opts.bugs.unwrap_or(sc.engine.bugs).to_string(),
        opts.seeds,
        coverage,
    );
    (s.shards, s.seeds_planned, s.jobs) = (vec![opts.shard], planned, jobs);
    let batch_len = (jobs as u64).saturating_mul(BATCH_PER_JOB);
    let mut seeds = opts.shard.seeds(opts.seeds).peekable();
    let mut printed = 0usize;
    let mut batch: Vec<u64> = Vec::new();
    while seeds.peek().is_some() {
        batch.clear();
        batch.extend(
            seeds
                .by_ref()
                .take(usize::try_from(batch_len).unwrap_or(4096)),
        );
        let mut results = runner.run_batch(pool.as_ref().ok(), &batch);
        if let Some(e) = runner.error.lock().ok().and_then(|mut slot| slot.take()) {
            runner.bar.finish_and_clear();
            return Err(e);
        }
        let first_failure = in_seed_order(&mut results, opts);
        let gap = first_not_run(&batch, &results);
        for r in results {
            s.add_seed(runner.hash_kept(r, &s), opts, &mut |f| {
                if printed < opts.keep_failures {
                    on_failure(f);
                    printed += 1;
                }
            });
        }
        if let Some(reason) = runner.stop_reason(first_failure.is_some()) {
            let next = gap.or_else(|| seeds.next());
            if next.is_some() || reason == "first failure" {
                s.stopped = Some(reason.to_string());
                s.resume_from = next;
            }
            break;
        }
    }
    s.wall_s = runner.started.elapsed().as_secs_f64();
    runner.bar.finish_and_clear();
    Ok(s)
}

/// Sort a batch's results by seed; with `stop_at_first`, keep none after its first
/// failure. Returns that failure's seed.
fn in_seed_order(results: &mut Vec<SeedResult>, opts: &SweepOptions) -> Option<u64> {
    results.sort_by_key(|r| r.seed);
    let first_failure = results
        .iter()
        .find(|r| r.failed || (opts.stop_on_detection && r.finding.is_some()))
        .map(|r| r.seed);
    if opts.stop_at_first {
        if let Some(f) = first_failure {
            results.retain(|r| r.seed <= f);
        }
    }
    first_failure
}

/// Worker threads: `--jobs`, or one per core; never more than seeds.
fn worker_count(opts: &SweepOptions, planned: u64) -> usize {
    let jobs = opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    usize::try_from(planned).map_or(jobs, |p| jobs.min(p.max(1)))
}

/// A progress bar on stderr over `planned` seeds, or a hidden one.
fn progress_bar(show: bool, planned: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(planned);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} seeds, {per_sec}, eta {eta} {msg}",
    ) {
        b.set_style(style.progress_chars("=> "));
    }
    b
}

/// The first seed of `batch` (in seed order) that has no result in `results` (sorted).
fn first_not_run(batch: &[u64], results: &[SeedResult]) -> Option<u64> {
    batch
        .iter()
        .zip(
            results
                .iter()
                .map(|r| r.seed)
                .chain(std::iter::repeat(u64::MAX)),
        )
        .find(|(want, got)| want != &got)
        .map(|(want, _)| *want)
}

/// What the sweep's workers share: the scenario and options, and the flags that
/// stop them (a failure's seed, a bad plan, the clock, Ctrl-C).
struct SeedRunner<'a> {
    sc: &'a Scenario,
    path: &'a str,
    opts: &'a SweepOptions,
    started: Instant,
    bar: indicatif::ProgressBar,
    /// The lowest failing seed seen: with `stop_at_first`, later seeds do not start.
    stop: AtomicU64,
    /// A plan failed to build: no seed starts.
    halt: AtomicBool,
    error: Mutex<Option<ScenarioError>>,
}

impl SeedRunner<'_> {
    fn out_of_time(&self) -> bool {
        self.opts
            .time_budget
            .is_some_and(|b| self.started.elapsed() >= b)
    }

    fn interrupted(&self) -> bool {
        self.opts
            .interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// A seed's record that the summary keeps carries its trace hash: a seed ran
    /// without one ([`crate::run_plan_unhashed`]: nobody reads the hash of a seed that
    /// finds nothing) runs again with it, the same run (a run is a function of its plan).
    fn hash_kept(&self, mut r: SeedResult, summary: &SweepSummary) -> SeedResult {
        if !summary.keeps(&r, self.opts) {
            return r;
        }
        let seed = r.seed;
        if let Some(f) = r.finding.as_mut().filter(|f| f.trace_hash.is_empty()) {
            if let Ok(plan) = Plan::build(self.sc, seed, self.opts.bugs, &Reduction::default()) {
                let again = run_plan(&plan, Backend::Symbolic, false);
                f.trace_hash = crate::report::trace_hash(again.trace_hash);
            }
        }
        r
    }

    /// Why the sweep stops after this batch, if it does.
    fn stop_reason(&self, failed: bool) -> Option<&'static str> {
        if self.opts.stop_at_first && failed {
            Some("first failure")
        } else if self.interrupted() {
            Some("interrupted")
        } else if self.out_of_time() {
            Some("time budget spent")
        } else {
            None
        }
    }

    /// Run the seeds of `batch` on the pool (or this thread when there is none).
    /// Workers take the batch's seeds in order, one at a time, so a sweep that stops
    /// early has run (nearly) a prefix of its seeds.
    fn run_batch(&self, pool: Option<&rayon::ThreadPool>, batch: &[u64]) -> Vec<SeedResult> {
        let next = AtomicUsize::new(0);
        let work = || {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = batch.get(i) else { break };
                mine.extend(self.run_one(seed));
            }
            mine
        };
        match pool {
            Some(pool) => pool.broadcast(|_| work()).into_iter().flatten().collect(),
            // No threads to be had: run on this one.
            None => work(),
        }
    }

    /// Run one seed, unless the sweep is stopping; a plan that fails to build halts
    /// the sweep with its error.
    fn run_one(&self, seed: u64) -> Option<SeedResult> {
        let opts = self.opts;
        if self.halt.load(Ordering::Relaxed)
            || (opts.stop_at_first && seed > self.stop.load(Ordering::Relaxed))
            || self.interrupted()
            || self.out_of_time()
        {
            return None;
        }
        let plan = match Plan::build(self.sc, seed, opts.bugs, &Reduction::default()) {
            Ok(p) => p,
            Err(e) => {
                self.halt.store(true, Ordering::Relaxed);
                if let Ok(mut slot) = self.error.lock() {
                    slot.get_or_insert(e);
                }
                return None;
            }
        };
        let (out, audit) = if opts.audit {
            let hashed = match opts.check_determinism {
                true => crate::Hashed::Yes,
                false => crate::Hashed::No,
            };
            let (out, agreed) = crate::audit_in_memory(&plan, Backend::Symbolic, hashed);
            (out, Some(agreed.is_ok()))
        } else {
            (hashed_if(&plan, opts.check_determinism), None)
        };
        let nondeterministic = opts.check_determinism && {
            let again = run_plan(&plan, Backend::Symbolic, false);
            again.trace_hash != out.trace_hash || again.findings != out.findings
        };
        let finding = failure_of(&out, self.path);
        let failed = kvsim_oracle::fails(&out.findings);
        let detected: Vec<String> = out.detected().iter().map(|i| i.to_string()).collect();
        if failed || (opts.stop_on_detection && finding.is_some()) {
            self.stop.fetch_min(seed, Ordering::Relaxed);
            self.bar.set_message(format!(
                "(first failure: seed {})",
                self.stop.load(Ordering::Relaxed)
            ));
        }
        self.bar.inc(1);
        Some(SeedResult {
            seed,
            events: out.events,
            sim_ns: out.sim_ns,
            finding,
            failed,
            detected,
            nondeterministic,
            audit,
            levels: plan.levels.clone(),
            stats: out.stats,
        })
    }
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
        let max = SeedRange::parse("18446744073709551615")
            .unwrap_err()
            .to_string();
        assert!(
            max.contains("kvsim replay --seed 18446744073709551615"),
            "{max}"
        );
        assert!(SeedRange::parse("0..=18446744073709551615").is_err());
        assert_eq!(
            SeedRange::parse("0..18446744073709551615").unwrap().len(),
            u64::MAX
        );
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

    #[test]
    fn shard_seeds_are_computed_not_stored() {
        // A range of 10^18 seeds: counting and taking the first few costs nothing.
        let r = SeedRange {
            start: 5,
            end: 1_000_000_000_000_000_005,
        };
        let s = Shard { k: 3, n: 1000 };
        assert_eq!(s.count(r), 1_000_000_000_000_000);
        assert_eq!(s.seeds(r).take(2).collect::<Vec<_>>(), vec![7, 1007]);
        // A shard with no seed in the range.
        let small = SeedRange { start: 0, end: 4 };
        assert_eq!(Shard { k: 1000, n: 1000 }.count(small), 0);
        assert_eq!(Shard { k: 1000, n: 1000 }.seeds(small).count(), 0);
        let top = SeedRange {
            start: u64::MAX - 3,
            end: u64::MAX,
        };
        assert_eq!(
            Shard { k: 2, n: 2 }.seeds(top).collect::<Vec<_>>(),
            vec![u64::MAX - 2]
        );
    }

    fn part(k: u32, n: u32, run: u64) -> SweepSummary {
        let names = ("t".to_string(), "t.toml".to_string());
        let seeds = SeedRange { start: 0, end: 4 };
        SweepSummary {
            shards: vec![Shard { k, n }],
            seeds_planned: run,
            seeds_run: run,
            jobs: 1,
            ..SweepSummary::empty(names, "none".into(), seeds, Coverage::default())
        }
    }

    #[test]
    fn merge_counts_coverage_and_refuses_mixed_n() {
        let one = SweepSummary::merge(&[part(1, 2, 2)]).unwrap();
        assert!(!one.complete());
        assert_eq!(one.coverage(), "2 of 4 seeds covered; missing shards 2/2");
        assert!(
            one.render().contains("none in the seeds run"),
            "{}",
            one.render()
        );
        assert!(!one.render().contains("violations      none\n"));
        let both = SweepSummary::merge(&[part(1, 2, 2), part(2, 2, 2)]).unwrap();
        assert!(both.complete(), "{}", both.coverage());
        let mixed = SweepSummary::merge(&[part(1, 2, 2), part(1, 3, 2)]).unwrap_err();
        assert!(mixed.to_string().contains("not a shard of 2"), "{mixed}");
        let bad = SweepSummary::merge(&[part(0, 0, 2)]).unwrap_err();
        assert!(bad.to_string().contains("1 <= K <= N"), "{bad}");
        let mut over = part(1, 1, 9);
        over.seeds_planned = 4;
        assert!(SweepSummary::merge(&[over]).is_err());
    }
}
