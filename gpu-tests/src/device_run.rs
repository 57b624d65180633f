//! The parts of the device run (`gpu-tests/run-on-device.sh`) as functions the
//! `gpu-device` binary calls: the probe, the PTX check, CudaGpu against HostGpu on
//! random workloads, the incident scenario on a backend, and the benchmark.
//!
//! Each returns a short text report or a [`RunError`]; none of them prints. The CPU
//! variants (HostGpu against SymbolicGpu, the incident on HostGpu) are what
//! `--dry-run` runs on a machine without a device. Invariant: a part that finds a
//! difference or a wrong outcome returns an error, never a report.

use crate::compare::{compare, Divergence, Stats, Workload};
use kvsim_cuda::cuda::CudaDevice;
use kvsim_cuda::{kernels, nvrtc, probe, GpuError};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu};
use kvsim_engine::ids::TenantId;
use kvsim_engine::msg::Status;
use kvsim_oracle::schema::Entry;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::{Scenario, ScenarioError};
use kvsim_sim::{run_plan_with, RunOutcome};
use std::path::Path;
use std::time::Instant;

/// Why a part of the device run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("backends differ: {0}")]
    Divergence(#[from] Divergence),
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Step(#[from] crate::step_bench::StepError),
    #[error("{0}")]
    Check(String),
}

/// The probe's and NVRTC's findings, one line each.
pub fn probe_report() -> String {
    let dev = match probe::cuda_device() {
        probe::Probe::Present { devices } => format!("CUDA: {devices} device(s)"),
        probe::Probe::Absent(why) => format!("CUDA: absent ({why})"),
    };
    let nv = match nvrtc::ensure() {
        Ok(nvrtc::Found::Dir(d)) => format!("NVRTC: loaded from {}", d.display()),
        Ok(nvrtc::Found::System) => "NVRTC: on the library path".to_string(),
        Err(e) => format!("NVRTC: absent ({e})"),
    };
    format!("{dev}\n{nv}\n")
}

/// The committed PTX has every kernel and, where NVRTC is present, equals a fresh
/// compilation; `Ok(None)` when NVRTC is absent (only the entry check ran).
pub fn ptx_check() -> Result<Option<String>, RunError> {
    let entries = kernels::ptx_entries(kernels::PTX);
    let missing: Vec<_> = kernels::KERNELS
        .iter()
        .filter(|k| !entries.iter().any(|e| e == *k))
        .collect();
    if !missing.is_empty() {
        return Err(RunError::Check(format!(
            "kernels/kv.ptx lacks {missing:?}: regenerate it (cargo run -p kvsim-cuda --bin gen-ptx)"
        )));
    }
    if nvrtc::ensure().is_err() {
        return Ok(None);
    }
    let fresh = nvrtc::compile(kernels::SOURCE, kernels::PROGRAM).map_err(GpuError::from)?;
    if !fresh.log.is_empty() {
        return Err(RunError::Check(format!("NVRTC warnings:\n{}", fresh.log)));
    }
    if fresh.ptx.trim_end() != kernels::PTX.trim_end() {
        return Err(RunError::Check(
            "kernels/kv.ptx is not current: regenerate it (cargo run -p kvsim-cuda --bin gen-ptx)"
                .into(),
        ));
    }
    Ok(Some(format!(
        "PTX current ({} kernels, {} bytes)",
        entries.len(),
        kernels::PTX.len()
    )))
}

fn summarize(what: &str, seeds: u64, ops: u32, st: &Stats, secs: f64) -> String {
    format!(
        "{what}: {seeds} seeds x {ops} ops equal in {secs:.1} s: {} writes, {} attention \
         requests ({} tag mismatches, {} echoed), {} transfers ({} with a short, torn or \
         corrupted payload), {} zeroed, {} digests\n",
        st.writes,
        st.attends,
        st.tag_mismatches,
        st.echoed,
        st.transfers,
        st.shaped,
        st.zeroed,
        st.digests
    )
}

/// CudaGpu against HostGpu on `seeds` random workloads of `ops` operations.
pub fn compare_cuda_host(dev: &CudaDevice, seeds: u64, ops: u32) -> Result<String, RunError> {
    let t = Instant::now();
    let mut total = Stats::default();
    for seed in 0..seeds {
        let w = Workload::from_seed(seed, ops).with_corruption();
        let mut cuda = dev.gpu(w.pool_pages, w.page_size)?;
        let mut host = HostGpu::new(w.pool_pages, w.page_size);
        total.add(&compare(&mut cuda, &mut host, &w, |a, b| a == b)?);
    }
    Ok(summarize(
        "CudaGpu vs HostGpu",
        seeds,
        ops,
        &total,
        t.elapsed().as_secs_f64(),
    ))
}

/// HostGpu against SymbolicGpu on the same workloads (the CPU part).
pub fn compare_host_symbolic(seeds: u64, ops: u32) -> Result<String, RunError> {
    let t = Instant::now();
    let mut total = Stats::default();
    for seed in 0..seeds {
        let w = Workload::from_seed(seed, ops);
        let mut host = HostGpu::new(w.pool_pages, w.page_size);
        let mut sym = SymbolicGpu::new(w.pool_pages, w.page_size);
        total.add(&compare(&mut host, &mut sym, &w, |_, _| true)?);
    }
    Ok(summarize(
        "HostGpu vs SymbolicGpu",
        seeds,
        ops,
        &total,
        t.elapsed().as_secs_f64(),
    ))
}

/// Check the incident's expected outcome: with the bugs, tenant 2 gets 200 echoing
/// tenant 1's tokens; defended, tenant 2 gets 400, tenant 1 200, and the run is clean.
pub fn check_incident(out: &RunOutcome, bugs: bool) -> Result<String, RunError> {
    let tenant = |r| out.requests.iter().find(|p| p.req == r).map(|p| p.tenant.0);
    let (t1, t2) = (out.status_of(TenantId(1)), out.status_of(TenantId(2)));
    let leaked = out
        .leaks
        .iter()
        .filter(|l| tenant(l.victim_of) == Some(2) && tenant(l.owner) == Some(1))
        .count();
    let ok = if bugs {
        t2 == Some(Status::OK) && leaked > 0
    } else {
        t2 == Some(Status::BAD_REQUEST) && t1 == Some(Status::OK) && out.clean() && leaked == 0
    };
    let line = format!(
        "tenant 1: {}, tenant 2: {}, {leaked} of tenant 1's tokens in tenant 2's reply, {} findings, {} events",
        t1.map_or("no answer".into(), |s| s.to_string()),
        t2.map_or("no answer".into(), |s| s.to_string()),
        out.findings.len(),
        out.events,
    );
    if ok {
        Ok(line)
    } else {
        Err(RunError::Check(format!(
            "unexpected incident outcome: {line}"
        )))
    }
}

/// The plans of a scenario file: with the incident's bugs and defended.
pub fn incident_plans(path: &Path) -> Result<[(bool, Plan); 2], RunError> {
    let sc = Scenario::load(path)?;
    let reduction = Reduction::default();
    Ok([
        (
            true,
            Plan::build(&sc, sc.seed, Some(BugSet::INCIDENT), &reduction)?,
        ),
        (
            false,
            Plan::build(&sc, sc.seed, Some(BugSet::NONE), &reduction)?,
        ),
    ])
}

/// Run the scenario's two plans on a backend and check both outcomes; with a
/// reference outcome per plan, the replies and trace must equal it too. Runs are
/// traced, so a difference names the first trace entry where the backends part, and
/// a wrong outcome lists its replies and findings.
pub fn incident_on<G: Gpu>(
    name: &str,
    path: &Path,
    make: impl Fn(u32, u32) -> G,
    reference: Option<&[RunOutcome; 2]>,
) -> Result<(String, Vec<RunOutcome>), RunError> {
    let mut report = String::new();
    let mut outs = Vec::new();
    for (i, (bugs, plan)) in incident_plans(path)?.into_iter().enumerate() {
        let variant = if bugs { "bugs" } else { "defended" };
        let t = Instant::now();
        let out = run_plan_with(&plan, &make, true);
        let secs = t.elapsed().as_secs_f64();
        if let Some(r) = reference.map(|r| &r[i]) {
            if r.replies != out.replies || r.leaks != out.leaks || r.trace_hash != out.trace_hash {
                return Err(RunError::Check(format!(
                    "{name}: the incident ({variant}) differs from the reference backend\n{}{}{}",
                    differing_parts(r, &out),
                    first_difference(&r.trace, &out.trace),
                    explain(&out)
                )));
            }
        }
        let line = check_incident(&out, bugs)
            .map_err(|e| RunError::Check(format!("{name} ({variant}): {e}\n{}", explain(&out))))?;
        report.push_str(&format!(
            "incident on {name} ({}): {line} [{secs:.1} s{}]\n",
            if bugs {
                "bugs gate-checks-finished-only,no-length-agreement"
            } else {
                "defended"
            },
            if reference.is_some() {
                ", equal to HostGpu"
            } else {
                ""
            }
        ));
        outs.push(out);
    }
    Ok((report, outs))
}

/// Which of the replies, leaks and trace hash differ, with the first differing reply.
fn differing_parts(a: &RunOutcome, b: &RunOutcome) -> String {
    let mut s = String::new();
    if a.trace_hash != b.trace_hash {
        s += &format!("trace hash {:?} vs {:?}\n", a.trace_hash, b.trace_hash);
    }
    if a.leaks != b.leaks {
        s += &format!("leaks: {} vs {}\n", a.leaks.len(), b.leaks.len());
    }
    let reply = a
        .replies
        .iter()
        .find(|(k, v)| b.replies.get(*k) != Some(*v));
    if let Some((req, ra)) = reply {
        s += &format!(
            "first differing reply, {req}: {ra:?} vs {:?}\n",
            b.replies.get(req)
        );
    }
    s
}

/// The first entry where two traces part, with the entries before it for context.
pub fn first_difference(a: &[Entry], b: &[Entry]) -> String {
    let at = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut out = format!(
        "traces of {} and {} entries agree on the first {at}\n",
        a.len(),
        b.len()
    );
    for e in &a[at.saturating_sub(4)..at] {
        out += &format!("  both:      {e:?}\n");
    }
    for (side, t) in [("reference", a), ("this", b)] {
        for e in t.iter().skip(at).take(3) {
            out += &format!("  {side:<10} {e:?}\n");
        }
    }
    out
}

/// A wrong outcome's replies and findings, and the trace's node faults.
pub fn explain(out: &RunOutcome) -> String {
    let mut s = String::new();
    for (req, replies) in &out.replies {
        for r in replies {
            s += &format!("  reply {req}: {} ({} tokens)\n", r.status, r.tokens.len());
        }
    }
    for f in &out.findings {
        s += &format!("  finding: {f:?}\n");
    }
    for e in out
        .trace
        .iter()
        .filter(|e| format!("{:?}", e.rec).contains("Fault"))
    {
        s += &format!("  {e:?}\n");
    }
    s
}
