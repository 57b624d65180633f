//! kvsim-sim: the seeded, fault-injecting simulator for the kvsim engine.
//!
//! One `u64` seed and a [`scenario::Scenario`] determine a [`plan::Plan`] (under
//! `[swarm]` the seed also draws which faults are on, the pools and the workload
//! mix); [`simulator::Simulator`] runs it through the engine's own nodes on a virtual clock
//! with faults injected in a safety phase and healed for a liveness phase. Every
//! record of the run goes to the one oracle (`kvsim_oracle::Oracle`), which judges the
//! invariants from the trace alone, exactly as `kvsim audit` judges an exported trace.
//! On top: [`sweep`] (many seeds in parallel, sharded), [`replay`] (one seed with its
//! full trace, text or JSON), [`shrink`] (a smaller run that still fails) and
//! [`report`] (a failure report a person can act on).
//!
//! [`run_plan`] and [`run_scenario`] are the entry points the CLI and tests use.

pub mod coverage;
pub mod hash;
pub mod net;
pub mod outcome;
pub mod plan;
pub mod queue;
pub mod reach;
pub mod replay;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod shrink;
pub mod simulator;
pub mod stall;
pub mod sweep;

use kvsim_engine::bugs::BugSet;
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu};
use kvsim_oracle::schema::Entry;
pub use outcome::RunOutcome;
use plan::{Plan, Reduction};
use scenario::{Scenario, ScenarioError};
use simulator::Simulator;

/// Which KV backend a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Backend {
    /// Tokens plus provenance: fast, and the white-box S3 oracle can read it.
    Symbolic,
    /// Real f32 echo attention on the CPU (black-box canary check only).
    Host,
}

/// Options of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: Option<u64>,
    /// Replace the scenario's bug switches.
    pub bugs: Option<BugSet>,
    pub backend: Backend,
    pub trace: bool,
    /// Run a smaller member of the seed's plan.
    pub reduction: Reduction,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: None,
            bugs: None,
            backend: Backend::Symbolic,
            trace: false,
            reduction: Reduction::default(),
        }
    }
}

/// Run one plan with any KV backend: `make_gpu(pages, page_size)` builds each node's
/// memory (the CUDA backend of `gpu-tests/` runs the scenarios through this). With
/// `trace`, the outcome keeps every trace entry.
pub fn run_plan_with<G: Gpu>(
    plan: &Plan,
    make_gpu: impl Fn(u32, u32) -> G,
    trace: bool,
) -> RunOutcome {
    finish(plan, Simulator::new(plan, make_gpu, trace))
}

/// Run one plan, writing its trace (header first) as JSON lines to `sink`.
pub fn run_plan_json(
    plan: &Plan,
    backend: Backend,
    sink: Box<dyn simulator::TraceSink>,
) -> RunOutcome {
    match backend {
        Backend::Symbolic => finish(
            plan,
            Simulator::new(plan, SymbolicGpu::new, false).with_json(sink),
        ),
        Backend::Host => finish(
            plan,
            Simulator::new(plan, HostGpu::new, false).with_json(sink),
        ),
    }
}

fn finish<G: Gpu>(plan: &Plan, mut w: Simulator<G>) -> RunOutcome {
    w.run();
    RunOutcome {
        scenario: plan.scenario.clone(),
        seed: plan.seed,
        bugs: plan.engine.bugs,
        plan: plan.clone(),
        requests: w.requests().to_vec(),
        replies: w.replies().clone(),
        room_requests: w.room_requests().clone(),
        findings: w.oracle().findings().to_vec(),
        leaks: w.oracle().leaks.clone(),
        header: w.header().clone(),
        events: w.events(),
        sim_ns: w.now_ns(),
        trace_hash: w.trace_hash(),
        stats: w.stats(),
        trace: w.take_log(),
    }
}

/// [`run_plan`] with the symbolic backend, untraced and keeping no trace hash: what a
/// sweep runs for each seed, whose hash it reads only for a seed with a finding it
/// keeps (and then runs again, with [`run_plan`]: a run is a function of its plan).
pub fn run_plan_unhashed(plan: &Plan) -> RunOutcome {
    finish(
        plan,
        Simulator::new(plan, SymbolicGpu::new, false).without_trace_hash(),
    )
}

/// Run one plan end to end and check it.
pub fn run_plan(plan: &Plan, backend: Backend, trace: bool) -> RunOutcome {
    match backend {
        Backend::Symbolic => run_plan_with(plan, SymbolicGpu::new, trace),
        Backend::Host => run_plan_with(plan, HostGpu::new, trace),
    }
}

/// A trace sink that keeps the JSON lines in memory, shared with the caller.
#[derive(Clone, Default)]
pub struct MemoryTrace(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl MemoryTrace {
    /// Everything written so far.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.borrow_mut())
    }
}

impl simulator::TraceSink for MemoryTrace {
    fn line(&mut self, line: &str) {
        let mut b = self.0.borrow_mut();
        b.extend_from_slice(line.as_bytes());
        b.push(b'\n');
    }
}

/// A trace sink that streams the JSON lines to a writer (a file): constant memory,
/// however long the run. A write error is kept and reported by [`StreamTrace::finish`].
pub struct StreamTrace<W: std::io::Write> {
    out: W,
    error: std::rc::Rc<std::cell::RefCell<Option<std::io::Error>>>,
}

impl<W: std::io::Write> StreamTrace<W> {
    /// The sink, and a handle that reports its first write error after the run.
    pub fn new(
        out: W,
    ) -> (
        Self,
        std::rc::Rc<std::cell::RefCell<Option<std::io::Error>>>,
    ) {
        let error = std::rc::Rc::default();
        (
            StreamTrace {
                out,
                error: std::rc::Rc::clone(&error),
            },
            error,
        )
    }
}

impl<W: std::io::Write> simulator::TraceSink for StreamTrace<W> {
    fn line(&mut self, line: &str) {
        if self.error.borrow().is_some() {
            return;
        }
        let res = self
            .out
            .write_all(line.as_bytes())
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = res {
            *self.error.borrow_mut() = Some(e);
        }
    }
}

impl<W: std::io::Write> Drop for StreamTrace<W> {
    fn drop(&mut self) {
        if let Err(e) = self.out.flush() {
            self.error.borrow_mut().get_or_insert(e);
        }
    }
}

/// Run a plan and judge it twice: in process, and by auditing its exported trace
/// alone (the JSON lines, read back by `kvsim audit`'s oracle). `Err` names the
/// first difference between the two verdicts, finding for finding.
pub fn run_and_audit(plan: &Plan, backend: Backend) -> (RunOutcome, Result<(), String>) {
    let sink = MemoryTrace::default();
    let out = run_plan_json(plan, backend, Box::new(sink.clone()));
    let bytes = sink.take();
    let report = kvsim_oracle::audit::audit_readers(vec![(
        format!("seed {}", plan.seed),
        Box::new(std::io::Cursor::new(bytes)),
    )]);
    let verdict = agree(&out, report);
    (out, verdict)
}

/// [`run_and_audit`] with the trace handed over in memory as the run goes (`kvsim
/// sweep --audit`): the audit reads the run's header and entries, the schema's own
/// types, exactly as the lines of its trace file would carry them, and skips only
/// writing and parsing their text (`oracle/tests/roundtrip.rs` proves every record
/// survives its line).
pub fn run_and_audit_in_memory(plan: &Plan, backend: Backend) -> (RunOutcome, Result<(), String>) {
    audit_in_memory(plan, backend, Hashed::Yes)
}

/// Whether a run computes its trace hash ([`RunOutcome::trace_hash`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hashed {
    Yes,
    /// Nobody reads the hash (a sweep's seed whose record the summary does not keep):
    /// the run skips it, and `trace_hash` is `None`.
    No,
}

/// [`run_and_audit_in_memory`], hashing the trace only when `hashed` says so: the
/// audit's verdict does not read the hash, so a sweep hashes only the seeds whose
/// records it keeps, as it does without `--audit`.
pub(crate) fn audit_in_memory(
    plan: &Plan,
    backend: Backend,
    hashed: Hashed,
) -> (RunOutcome, Result<(), String>) {
    fn sim<G: Gpu>(w: Simulator<G>, hashed: Hashed) -> Simulator<G> {
        match hashed {
            Hashed::Yes => w,
            Hashed::No => w.without_trace_hash(),
        }
    }
    let (out, report) = match backend {
        Backend::Symbolic => audit_as_it_runs(
            plan,
            sim(Simulator::new(plan, SymbolicGpu::new, false), hashed),
        ),
        Backend::Host => {
            audit_as_it_runs(plan, sim(Simulator::new(plan, HostGpu::new, false), hashed))
        }
    };
    let verdict = agree(&out, report);
    (out, verdict)
}

fn audit_as_it_runs<G: Gpu>(
    plan: &Plan,
    w: Simulator<G>,
) -> (
    RunOutcome,
    Result<kvsim_oracle::audit::AuditReport, kvsim_oracle::audit::AuditError>,
) {
    let name = format!("seed {}", plan.seed);
    let pass = match kvsim_oracle::audit::EntryAudit::new(&name, w.header()) {
        Ok(pass) => pass,
        Err(e) => return (finish(plan, w), Err(e)),
    };
    let sink = AuditTrace(std::rc::Rc::new(std::cell::RefCell::new(Some(pass))));
    let out = finish(plan, w.with_json(Box::new(sink.clone())));
    let pass = sink.0.borrow_mut().take();
    let pass = pass.expect("the audit is taken once, after the run");
    (out, Ok(pass.finish()))
}

/// A trace sink that audits the entries as they come, shared with the caller.
#[derive(Clone)]
struct AuditTrace(std::rc::Rc<std::cell::RefCell<Option<kvsim_oracle::audit::EntryAudit>>>);

impl simulator::TraceSink for AuditTrace {
    /// The header's line: the audit was made from the header itself.
    fn line(&mut self, _line: &str) {}

    fn entry(&mut self, e: &Entry) {
        if let Some(pass) = self.0.borrow_mut().as_mut() {
            pass.observe(e);
        }
    }
}

/// The first difference between the run's verdict and the audit's, finding for finding.
fn agree(
    out: &RunOutcome,
    report: Result<kvsim_oracle::audit::AuditReport, kvsim_oracle::audit::AuditError>,
) -> Result<(), String> {
    let report = report.map_err(|e| format!("the exported trace could not be audited: {e}"))?;
    let n = report.findings.len().max(out.findings.len());
    match (0..n).find(|&i| report.findings.get(i) != out.findings.get(i)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "finding {i}: the run found {:?}, the audit {:?}",
            out.findings.get(i).map(|f| f.verdict()),
            report.findings.get(i).map(|f| f.verdict())
        )),
    }
}

/// Build the plan of one seed of a scenario and run it.
pub fn run_scenario(sc: &Scenario, opts: &RunOptions) -> Result<RunOutcome, ScenarioError> {
    let seed = opts.seed.unwrap_or(sc.seed);
    let plan = Plan::build(sc, seed, opts.bugs, &opts.reduction)?;
    Ok(run_plan(&plan, opts.backend, opts.trace))
}
