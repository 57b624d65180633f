//! `CudaGpu`: the engine's `Gpu` trait on one CUDA device, through cudarc.
//!
//! The KV pool and the page tags are plain device allocations (`CudaSlice`, never
//! managed memory) laid out as `kvsim_engine::gpu::layout` says; every operation is a
//! kernel of `kernels/kv.cu` on one stream. It answers exactly as `HostGpu` does, bit
//! for bit (the kernels mirror `layout` and are compiled without FMA contraction).
//! It is not a fast attention: it is the engine's toy echo attention on real device
//! memory, with the tag check where a real kernel would make it.
//!
//! Invariant: a CUDA error inside a trait method never panics: it returns the engine's
//! [`DeviceError`] with the driver's message, and the node fails the request it was
//! serving; every operation also exists as a `try_*` method that returns
//! [`GpuError`]. Methods that return data synchronise the stream once per
//! call; [`Gpu::attend_batch`] does one launch and one synchronisation for a whole
//! decode batch.
//!
//! [`DeviceError`]: kvsim_engine::gpu::DeviceError
//! [`GpuError`]: crate::GpuError
//! [`Gpu::attend_batch`]: kvsim_engine::gpu::Gpu::attend_batch
//!
//! The files: the kernels and their launch shapes (`launch`), the device (`device`),
//! a node's memory and its operations (`gpu`), batched attention (`batch`) and the
//! engine's trait on top (`engine_gpu`).

mod batch;
mod device;
mod engine_gpu;
mod gpu;
mod launch;

pub use batch::{DeviceBatch, HostBatch};
pub use device::CudaDevice;
pub use gpu::CudaGpu;
pub use launch::MAX_PAGE_SIZE;
