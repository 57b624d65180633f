//! Running a sweep: seeds stream through a rayon pool in batches, each seed's run
//! becomes a result the summary adds up in seed order, with the stop rules (first
//! failure, time budget, Ctrl-C). Not the summary's arithmetic or rendering.

use crate::coverage::Coverage;
use crate::plan::{Plan, Reduction};
use crate::scenario::{Scenario, ScenarioError};
use crate::sweep::options::SweepOptions;
use crate::sweep::summary::{Failure, SeedResult, SweepSummary};
use crate::{run_plan, Backend, RunOutcome};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

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
    let mut s = empty_summary(sc, path, opts, (planned, jobs));
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

/// The summary of a sweep of `sc` before any seed ran: its scenario, bugs, shard,
/// the seeds planned and the workers to run them.
fn empty_summary(
    sc: &Scenario,
    path: &str,
    opts: &SweepOptions,
    (planned, jobs): (u64, usize),
) -> SweepSummary {
    let mut coverage = Coverage::new(&sc.faults.cancel_phases);
    coverage.declared_reach = sc.reach.clone();
    let mut s = SweepSummary::empty(
        (sc.name.clone(), path.to_string()),
        opts.bugs.unwrap_or(sc.engine.bugs).to_string(),
        opts.seeds,
        coverage,
    );
    (s.shards, s.seeds_planned, s.jobs) = (vec![opts.shard], planned, jobs);
    s
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
