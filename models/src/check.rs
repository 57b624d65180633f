//! Running a model check and reporting it: the library half of `kvsim check`.
//!
//! [`check`] runs stateright's breadth-first checker (shortest counterexamples) or,
//! with symmetry reduction, its depth-first one (stateright applies symmetry in DFS
//! only), and returns a [`CheckReport`]: state counts, time, rate, each property's
//! status, and each counterexample explained step by step as engine events and as a
//! [`Schedule`], replayed through the simulator's oracle. [`CheckReport::render`]
//! is what the command line prints.

use crate::memo::MemoStats;
use crate::model::{representative, HandoffModel, StepLog};
use crate::model_state::{Action, State};
use crate::replay::{replay, ReplayOutcome};
use crate::schedule::{step_of, Schedule};
use crate::spec::{ModelSpec, SpecError};
use kvsim_engine::invariant::Invariant;
use stateright::{Checker, Expectation, Model, Path};
use std::fmt::Write;
use std::time::{Duration, Instant};

/// How to search.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub threads: usize,
    /// Explore paths of at most this many steps.
    pub depth: Option<usize>,
    /// Search depth-first (less memory, faster here; counterexamples not shortest).
    pub dfs: bool,
    /// Sort interchangeable clients (implies depth-first: stateright applies symmetry
    /// reduction in its DFS and simulation checkers only).
    pub symmetry: bool,
    /// How node transitions are computed ([`crate::memo`]).
    pub memo: MemoMode,
    /// Stop at the first `always` property that fails (the time a user waits for a
    /// counterexample); the search is then not exhaustive, and a `sometimes` property
    /// not reached by then reads "not reached" only for the states visited.
    pub until_first: bool,
}

/// Whether the checker reuses node transitions it computed before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoMode {
    /// Reuse them (per-thread cache of (node, input) -> effect).
    #[default]
    On,
    /// Compute every transition with the engine (to measure what the cache saves).
    Off,
    /// Reuse them, and also recompute each reused one and panic on a difference.
    Verify,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            threads: 1,
            depth: None,
            dfs: false,
            symmetry: false,
            memo: MemoMode::On,
            until_first: false,
        }
    }
}

/// What the search established about one property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `always`: no reachable state breaks it (within the depth bound, if any).
    Holds,
    /// `always`: a counterexample of this many steps.
    Violated { steps: usize },
    /// `sometimes`: an example of this many steps.
    Reached { steps: usize },
    /// `sometimes`: no reachable state satisfies it (within the depth bound, if any).
    NotReached,
}

impl Verdict {
    /// The verdict's kind, without its steps (a reduced search may reach the same
    /// class of states by another path, so two searches agree on kinds, not steps).
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Violated { .. } => "violated",
            Verdict::Reached { .. } => "reached",
            Verdict::NotReached => "not reached",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PropertyStatus {
    pub name: &'static str,
    pub always: bool,
    pub verdict: Verdict,
}

/// One step of a counterexample, explained.
#[derive(Clone, Debug)]
pub struct ExplainedStep {
    pub step: crate::schedule::Step,
    pub log: StepLog,
}

#[derive(Clone, Debug)]
pub struct Counterexample {
    pub property: &'static str,
    pub steps: Vec<ExplainedStep>,
    pub schedule: Schedule,
    /// The same schedule through the simulator's nodes and oracle.
    pub replay: Result<ReplayOutcome, crate::replay::ReplayError>,
}

#[derive(Clone, Debug)]
pub struct CheckReport {
    pub spec: ModelSpec,
    pub options: CheckOptions,
    pub generated: usize,
    pub unique: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Every reachable state was visited (no depth bound cut the search).
    pub complete: bool,
    /// Node transitions the search computed with the engine and reused.
    pub transitions: MemoStats,
    pub properties: Vec<PropertyStatus>,
    pub counterexamples: Vec<Counterexample>,
}

impl CheckReport {
    /// Did any `always` property fail?
    pub fn violated(&self) -> bool {
        self.properties
            .iter()
            .any(|p| matches!(p.verdict, Verdict::Violated { .. }))
    }

    pub fn states_per_sec(&self) -> f64 {
        self.unique as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn status(&self, name: &str) -> Option<Verdict> {
        self.properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.verdict)
    }

    pub fn counterexample(&self, name: &str) -> Option<&Counterexample> {
        self.counterexamples.iter().find(|c| c.property == name)
    }

    /// The command-line report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let bugs = self.spec.engine.bugs;
        let _ = writeln!(
            out,
            "model {} (bugs: {})",
            self.spec.name,
            if bugs.is_empty() {
                "none".to_string()
            } else {
                bugs.to_string()
            }
        );
        let _ = writeln!(out, "  {}", self.spec.about);
        let search = if self.options.symmetry {
            "depth-first with symmetry reduction"
        } else if self.options.dfs {
            "depth-first"
        } else {
            "breadth-first"
        };
        let _ = writeln!(
            out,
            "search: {search}, {} thread(s){}{}",
            self.options.threads,
            self.options
                .depth
                .map_or(String::new(), |d| format!(", depth bound {d}")),
            match self.options.memo {
                MemoMode::On => "",
                MemoMode::Off => ", no transition cache",
                MemoMode::Verify => ", transition cache verified",
            }
        );
        let _ = writeln!(
            out,
            "states: {} generated, {} unique, max depth {}; {:.2} s, {:.0} unique states/s{}",
            self.generated,
            self.unique,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            self.states_per_sec(),
            match (self.complete, self.options.until_first) {
                (true, _) => " (exhaustive)",
                (false, true) if self.violated() => {
                    " (NOT exhaustive: stopped at the first counterexample)"
                }
                (false, _) => " (NOT exhaustive: depth bound reached)",
            }
        );
        self.render_transitions(&mut out);
        self.render_properties(&mut out);
        for c in &self.counterexamples {
            render_counterexample(&mut out, c);
        }
        out
    }

    /// How many node transitions the engine computed and how many the cache reused.
    fn render_transitions(&self, out: &mut String) {
        let t = self.transitions;
        let total = (t.computed + t.reused).max(1);
        let _ = writeln!(
            out,
            "node transitions: {} computed by the engine, {} reused ({:.0}%)",
            t.computed,
            t.reused,
            100.0 * t.reused as f64 / total as f64
        );
    }

    /// One line per property: its verdict and kind.
    fn render_properties(&self, out: &mut String) {
        let _ = writeln!(out, "properties:");
        for p in &self.properties {
            let (word, extra) = match p.verdict {
                Verdict::Holds => ("holds", String::new()),
                Verdict::Violated { steps } => {
                    ("VIOLATED", format!(" ({steps}-step counterexample)"))
                }
                Verdict::Reached { steps } => ("reached", format!(" ({steps}-step example)")),
                Verdict::NotReached => ("NOT reached", String::new()),
            };
            let kind = if p.always { "always" } else { "sometimes" };
            let _ = writeln!(out, "  {word:<11} {kind:<9} {}{extra}", p.name);
        }
    }
}

/// A counterexample step by step, with what each step did, and its replay's verdict.
fn render_counterexample(out: &mut String, c: &Counterexample) {
    let _ = writeln!(
        out,
        "\ncounterexample for \"{}\" ({} steps):",
        c.property,
        c.steps.len()
    );
    for (i, s) in c.steps.iter().enumerate() {
        let _ = writeln!(out, "{:>3}. {}", i + 1, s.step);
        for e in &s.log.events {
            let _ = writeln!(out, "        {e}");
        }
        for v in &s.log.violations {
            let _ = writeln!(out, "        !! {v}");
        }
    }
    match &c.replay {
        Ok(r) => {
            let names: Vec<String> = r.broken.iter().map(|i| i.to_string()).collect();
            let _ = writeln!(
                out,
                "replayed through the simulator's nodes and oracle: {}",
                if names.is_empty() {
                    "no violation".to_string()
                } else {
                    format!("violates {}", names.join(", "))
                }
            );
        }
        Err(e) => {
            let _ = writeln!(out, "replay through the simulator failed: {e}");
        }
    }
}

/// The invariant a safety property's name stands for (`"S3 isolation"` -> S3).
pub fn invariant_of(property: &str) -> Option<Invariant> {
    property
        .split_whitespace()
        .next()
        .and_then(Invariant::parse)
}

/// Explain a path: each step as a schedule line with the engine events it caused.
pub fn explain(model: &HandoffModel, path: Path<State, Action>) -> (Vec<ExplainedStep>, Schedule) {
    let mut steps = Vec::new();
    for (state, action) in path.into_vec() {
        if let Some(a) = action {
            let step = step_of(model, &state, &a);
            let (_, log) = model.explain(&state, &a);
            steps.push(ExplainedStep { step, log });
        }
    }
    let schedule = Schedule(steps.iter().map(|s| s.step.clone()).collect());
    (steps, schedule)
}

fn report<C: Checker<HandoffModel>>(
    checker: C,
    model: &HandoffModel,
    spec: ModelSpec,
    options: &CheckOptions,
    elapsed: Duration,
) -> CheckReport {
    // Before the paths are rebuilt below (that replays steps on this thread).
    let transitions = model.memo_stats();
    let discoveries = checker.discoveries();
    let within_depth = options.depth.is_none_or(|d| checker.max_depth() < d);
    let always_failed = model
        .properties()
        .iter()
        .any(|p| p.expectation == Expectation::Always && discoveries.contains_key(p.name));
    let stopped_early = options.until_first && always_failed;
    let complete = within_depth && !stopped_early;
    let mut properties = Vec::new();
    let mut counterexamples = Vec::new();
    for p in model.properties() {
        let always = p.expectation == Expectation::Always;
        let verdict = match (discoveries.get(p.name), always) {
            (Some(path), true) => Verdict::Violated {
                steps: path.clone().into_actions().len(),
            },
            (Some(path), false) => Verdict::Reached {
                steps: path.clone().into_actions().len(),
            },
            (None, true) => Verdict::Holds,
            (None, false) => Verdict::NotReached,
        };
        if let (Some(path), true) = (discoveries.get(p.name), always) {
            let (steps, schedule) = explain(model, path.clone());
            let replay = replay(&spec, &schedule);
            counterexamples.push(Counterexample {
                property: p.name,
                steps,
                schedule,
                replay,
            });
        }
        properties.push(PropertyStatus {
            name: p.name,
            always,
            verdict,
        });
    }
    CheckReport {
        spec,
        transitions,
        options: options.clone(),
        generated: checker.state_count(),
        unique: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        complete,
        properties,
        counterexamples,
    }
}

/// The most checker threads [`check`] and [`explore`] start.
pub const MAX_THREADS: usize = 256;

fn check_options(spec: &ModelSpec, depth: Option<usize>, threads: usize) -> Result<(), SpecError> {
    let invalid = |reason: String| SpecError::Invalid {
        model: spec.name.clone(),
        reason,
    };
    // stateright reads a target depth of 0 as no bound: it would explore everything
    // and then report the bound reached.
    if depth == Some(0) {
        return Err(invalid("a depth bound must be at least 1".into()));
    }
    if threads > MAX_THREADS {
        return Err(invalid(format!("{threads} threads: at most {MAX_THREADS}")));
    }
    Ok(())
}

/// How far a running check has got, for progress reports.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// States generated, repeats included.
    pub states: usize,
    pub unique: usize,
    /// Discovered states not yet explored (the BFS queue or the DFS stack).
    pub queue: Option<usize>,
    pub max_depth: usize,
    pub elapsed: Duration,
}

impl Progress {
    pub fn unique_per_sec(&self) -> f64 {
        self.unique as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Until the checker's threads have finished, call `on` every `every` (nothing
/// without `every`: the caller joins the checker).
fn wait<C: Checker<HandoffModel>>(
    c: &mut C,
    start: Instant,
    every: Option<Duration>,
    on: &mut dyn FnMut(Progress),
) {
    let Some(every) = every else { return };
    // Polled by the threads' own state, so a checker that stops early for any reason
    // (all properties discovered, a depth bound, a panic) ends the wait.
    let handles = c.handles();
    let mut next = every;
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        let elapsed = start.elapsed();
        if elapsed >= next {
            next = elapsed + every;
            on(Progress {
                states: c.state_count(),
                unique: c.unique_state_count(),
                queue: c.queue_depth(),
                max_depth: c.max_depth(),
                elapsed,
            });
        }
    }
    for h in handles {
        if let Err(panic) = h.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Check a model to exhaustion (or to the depth bound).
pub fn check(spec: ModelSpec, options: &CheckOptions) -> Result<CheckReport, SpecError> {
    check_with_progress(spec, options, None, &mut |_| {})
}

/// [`check`], calling `on` with the checker's progress every `every` while it runs.
pub fn check_with_progress(
    spec: ModelSpec,
    options: &CheckOptions,
    every: Option<Duration>,
    on: &mut dyn FnMut(Progress),
) -> Result<CheckReport, SpecError> {
    check_options(&spec, options.depth, options.threads)?;
    let model = match options.memo {
        MemoMode::On => HandoffModel::new(spec.clone())?,
        MemoMode::Off => HandoffModel::new(spec.clone())?.without_memo(),
        MemoMode::Verify => HandoffModel::new(spec.clone())?.with_memo_check(),
    };
    let mut builder = model.clone().checker().threads(options.threads.max(1));
    if let Some(d) = options.depth {
        builder = builder.target_max_depth(d);
    }
    if options.until_first {
        builder = builder.finish_when(stateright::HasDiscoveries::AnyFailures);
    }
    let start = Instant::now();
    Ok(if options.symmetry {
        let mut c = builder.symmetry_fn(representative).spawn_dfs();
        wait(&mut c, start, every, on);
        report(c.join(), &model, spec, options, start.elapsed())
    } else if options.dfs {
        let mut c = builder.spawn_dfs();
        wait(&mut c, start, every, on);
        report(c.join(), &model, spec, options, start.elapsed())
    } else {
        let mut c = builder.spawn_bfs();
        wait(&mut c, start, every, on);
        report(c.join(), &model, spec, options, start.elapsed())
    })
}

/// Serve stateright's Explorer for a model on `addr` (blocks while it serves).
pub fn explore(
    spec: ModelSpec,
    threads: usize,
    addr: std::net::SocketAddr,
) -> Result<(), SpecError> {
    check_options(&spec, None, threads)?;
    // stateright panics on an address it cannot bind: try it first.
    if let Err(e) = std::net::TcpListener::bind(addr) {
        return Err(SpecError::Invalid {
            model: spec.name.clone(),
            reason: format!("cannot serve the Explorer on {addr}: {e}"),
        });
    }
    let model = HandoffModel::new(spec)?;
    let _ = model.checker().threads(threads.max(1)).serve(addr);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_would_mislead_are_refused_before_checking() {
        let spec = || ModelSpec::standard("handoff-small").expect("a standard model");
        let zero = CheckOptions {
            depth: Some(0),
            ..CheckOptions::default()
        };
        let e = check(spec(), &zero).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("depth bound must be at least 1"), "{e}");
        let many = CheckOptions {
            threads: 100_000,
            ..CheckOptions::default()
        };
        let e = check(spec(), &many).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("at most 256"), "{e}");
        let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = busy.local_addr().expect("its address");
        let e = explore(spec(), 1, addr).unwrap_err().to_string();
        assert!(e.contains("cannot serve the Explorer"), "{e}");
    }
}
