//! kvsim-gpu-tests: the checks that keep the CUDA backend (`kvsim-cuda`, `CudaGpu`)
//! equal to the CPU reference, the device run and the attention benchmark.
//!
//! [`compare`] runs one random workload on two `Gpu` backends and reports the first
//! difference; [`device_run`] holds the parts of `gpu-tests/run-on-device.sh` (the
//! probe, the PTX check, CudaGpu against HostGpu, the incident scenario on a backend);
//! [`bench`] times the attention kernel with and without the tag check; [`step_bench`]
//! a decode step as one batch against one call per request. The backend
//! itself (kernels, NVRTC, probe) is the `kvsim-cuda` crate. This crate builds and
//! tests on machines with no CUDA at all: every device test prints `SKIPPED: ...`
//! where there is no device.

pub mod bench;
pub mod compare;
pub mod device_run;
pub mod step_bench;
