//! `gpu-device`: the parts of the device run, one subcommand each, called by
//! `gpu-tests/run-on-device.sh` (which carries this binary to the lent GPU machine).
//!
//! Subcommands: `probe`, `ptx`, `compare [--seeds N] [--ops M] [--cpu]`,
//! `incident [--scenario PATH] [--cpu]`, `bench [--pool-gib G] [--runs R]
//! [--seq-pages S]`. `--cpu` runs the CPU variant (HostGpu against SymbolicGpu, the
//! incident on HostGpu). It prints its report on stdout; the benchmark also writes
//! every run's time to `$OUT/bench-runs.csv` (`$OUT` defaults to the temp folder).
//! Exit status: 0 passed, 1 failed, 2 no CUDA device for a device part. It is not a
//! test harness: the CUDA tests are the `cuda` test binary.

use kvsim_cuda::cuda::CudaDevice;
use kvsim_cuda::probe::{self, Probe};
use kvsim_engine::gpu::{Gpu, HostGpu};
use kvsim_gpu_tests::bench::{self, BenchConfig};
use kvsim_gpu_tests::device_run::{self, RunError};
use kvsim_gpu_tests::step_bench::{self, StepConfig};
use std::path::PathBuf;
use std::process::ExitCode;

fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, RunError> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| RunError::Check(format!("{name} needs a value"))),
    }
}

fn out_dir() -> PathBuf {
    std::env::var_os("OUT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

fn device() -> Result<CudaDevice, ExitCode> {
    if let Probe::Absent(why) = probe::cuda_device() {
        eprintln!("no CUDA device: {why}");
        return Err(ExitCode::from(2));
    }
    CudaDevice::open(0).map_err(|e| {
        eprintln!("opening the device: {e}");
        ExitCode::FAILURE
    })
}

fn run(args: &[String]) -> Result<String, RunError> {
    let cpu = args.iter().any(|a| a == "--cpu");
    match args.first().map(String::as_str) {
        Some("probe") => Ok(device_run::probe_report()),
        Some("ptx") => Ok(device_run::ptx_check()?.unwrap_or_else(|| {
            "PTX entries present; NVRTC absent, so not compared with a fresh compilation".into()
        }) + "\n"),
        Some("compare") if cpu => device_run::compare_host_symbolic(
            flag(args, "--seeds", 200)?,
            flag(args, "--ops", 200)?,
        ),
        Some("step") if cpu => step_table(args, |pages, ps| Ok(HostGpu::new(pages, ps))),
        Some("incident") if cpu => {
            let path: PathBuf = flag(args, "--scenario", "scenarios/glm53-incident.toml".into())?;
            Ok(device_run::incident_on("HostGpu", &path, HostGpu::new, None)?.0)
        }
        Some(other) => Err(RunError::Check(format!("{other}: needs a device"))),
        None => Err(RunError::Check(
            "usage: gpu-device probe|ptx|compare|incident|bench|step".into(),
        )),
    }
}

fn run_device(dev: &CudaDevice, args: &[String]) -> Result<String, RunError> {
    match args.first().map(String::as_str) {
        Some("compare") => device_run::compare_cuda_host(
            dev,
            flag(args, "--seeds", 2000)?,
            flag(args, "--ops", 100)?,
        ),
        Some("incident") => {
            let path: PathBuf = flag(args, "--scenario", "scenarios/glm53-incident.toml".into())?;
            let (host_report, host) =
                device_run::incident_on("HostGpu", &path, HostGpu::new, None)?;
            let reference: [_; 2] = host
                .try_into()
                .map_err(|_| RunError::Check("expected two incident runs".into()))?;
            let make = |pages, ps| {
                dev.gpu(pages, ps)
                    .unwrap_or_else(|e| panic!("allocating a node's KV pool on the device: {e}"))
            };
            let (report, _) = device_run::incident_on("CudaGpu", &path, make, Some(&reference))?;
            Ok(host_report + &report)
        }
        Some("step") => step_table(args, |pages, ps| Ok(dev.gpu(pages, ps)?)),
        Some("bench") => {
            let gib: f64 = flag(args, "--pool-gib", 8.0)?;
            let cfg = BenchConfig {
                pool_bytes: (gib * f64::from(1u32 << 30)) as u64,
                runs: flag(args, "--runs", 25)?,
                seq_pages: flag(args, "--seq-pages", 16)?,
                ..BenchConfig::default()
            };
            let r = bench::run(dev, &cfg)?;
            let csv: String = std::iter::once("variant,run,ms\n".to_string())
                .chain(
                    r.runs_ms_nocheck
                        .iter()
                        .enumerate()
                        .map(|(i, t)| format!("nocheck,{i},{t}\n")),
                )
                .chain(
                    r.runs_ms_check
                        .iter()
                        .enumerate()
                        .map(|(i, t)| format!("check,{i},{t}\n")),
                )
                .collect();
            let path = out_dir().join("bench-runs.csv");
            std::fs::write(&path, csv)
                .map_err(|e| RunError::Check(format!("{}: {e}", path.display())))?;
            Ok(format!(
                "device: {} (PTX: {:?})\n{}details: {}\n",
                r.device,
                dev.ptx_origin(),
                r.table(),
                path.display()
            ))
        }
        _ => run(args),
    }
}

/// The decode step, batched against one call per request, at each `--batches` size
/// (`--seq-pages` pages a request, page size 64) on backends `make` allocates.
fn step_table<G: Gpu>(
    args: &[String],
    mut make: impl FnMut(u32, u32) -> Result<G, RunError>,
) -> Result<String, RunError> {
    let batches: String = flag(args, "--batches", "1,8,64,256".into())?;
    let mut out = format!("{}\n", step_bench::TABLE_HEAD);
    for b in batches.split(',') {
        let batch: u32 = b
            .trim()
            .parse()
            .map_err(|e| RunError::Check(format!("--batches: {b:?}: {e}")))?;
        let cfg = StepConfig {
            batch,
            seq_pages: flag(args, "--seq-pages", 16)?,
            warmup: 5,
            runs: flag(args, "--runs", 50)?,
        };
        let mut gpu = make(cfg.pages(), 64)?;
        out += &step_bench::run(&mut gpu, &cfg)?.row();
        out.push('\n');
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cpu_only = args.iter().any(|a| a == "--cpu")
        || matches!(
            args.first().map(String::as_str),
            Some("probe" | "ptx") | None
        );
    let result = if cpu_only {
        run(&args)
    } else {
        match device() {
            Ok(dev) => run_device(&dev, &args),
            Err(code) => return code,
        }
    };
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
