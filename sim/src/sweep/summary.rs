//! [`SweepSummary`]: what a sweep (or a shard of one) found, how one seed's result
//! adds into it, how shards merge, and how it renders. Not the running of seeds
//! (`runner`).

use crate::coverage::Coverage;
use crate::report::secs;
use crate::sweep::options::SweepOptions;
use crate::sweep::seeds::{SeedRange, Shard, UsageError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

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
    pub(super) fn empty(
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
    pub(super) fn keeps(&self, r: &SeedResult, opts: &SweepOptions) -> bool {
        let kept = if r.failed {
            &self.failures
        } else {
            &self.detected
        };
        r.finding.is_some() && kept.len() < opts.keep_failures
    }

    /// Count one seed's result; `on_failure` hears each failing seed.
    pub(super) fn add_seed(
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
pub(super) struct SeedResult {
    pub(super) seed: u64,
    pub(super) events: u64,
    pub(super) sim_ns: u64,
    /// The seed's findings, when it has any; `failed` by [`kvsim_oracle::fails`].
    pub(super) finding: Option<Failure>,
    pub(super) failed: bool,
    /// The invariants a defense detected in it.
    pub(super) detected: Vec<String>,
    pub(super) nondeterministic: bool,
    /// `Some(agreed)` when audited.
    pub(super) audit: Option<bool>,
    /// The plan's fault kinds and what the run counted, for the coverage summary.
    pub(super) levels: Vec<(crate::plan::FaultKind, u32)>,
    pub(super) stats: crate::simulator::FaultStats,
}
