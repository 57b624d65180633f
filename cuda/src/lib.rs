//! kvsim-cuda: the engine's KV pages in GPU memory through cudarc, the production CUDA
//! backend of `kvsim serve --gpu cuda`.
//!
//! [`cuda::CudaGpu`] implements the engine's `Gpu` trait on one CUDA device: the page
//! pool and the page tags are plain device allocations, and every operation is a
//! kernel of `kernels/kv.cu` (prefill writes, page gather and scatter for transfers,
//! per-position token decode for checksums, zeroing, and paged echo attention with the
//! tag check inside). The kernels mirror `kvsim_engine::gpu::layout` line for line, so
//! `CudaGpu` answers exactly as `HostGpu` does. This crate depends on the engine only
//! (not on the simulator), and it builds on machines with no CUDA at all: [`probe`]
//! finds the driver without panicking and [`nvrtc`] finds the NVRTC library (from
//! NVIDIA's PyPI wheel in CI); without NVRTC the committed `kernels/kv.ptx` loads. The
//! checks that keep this backend equal to the CPU reference, the device run and the
//! benchmark live in `gpu-tests/` (kvsim-gpu-tests).

pub mod cuda;
pub mod kernels;
pub mod nvrtc;
pub mod probe;

/// Everything that can go wrong talking to CUDA.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("kernel compilation failed: {0}")]
    Compile(#[from] nvrtc::CompileFailure),
    #[error("the kernel module does not load: {0}")]
    Module(String),
    #[error("unsupported pool shape: {0}")]
    Shape(String),
}
