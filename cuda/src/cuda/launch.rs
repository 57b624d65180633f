//! The loaded kernels of one context and how they are launched: the grid shapes of
//! the element-wise kernels, the size limits of the attention kernel, and the counts
//! a launch takes as `u32`. What each launch does is [`super::gpu`]'s and
//! [`super::batch`]'s.

use crate::GpuError;
use cudarc::driver::{CudaFunction, LaunchConfig};

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Most blocks a grid-stride kernel is launched with.
const MAX_BLOCKS: u64 = 1 << 20;
/// Largest page size the attention kernel's shared memory holds (2 floats per slot).
pub const MAX_PAGE_SIZE: u32 = 4096;
/// Dynamic shared memory a launch may use without opting in to more (48 KiB): the
/// attention kernel stages the query's page in it when the page fits (page size 64:
/// 24 KiB), else reads it from global memory.
pub(super) const STAGE_LIMIT_BYTES: u32 = 48 * 1024;

/// The loaded kernels of one context.
pub(super) struct Kernels {
    pub(super) write_tokens: CudaFunction,
    pub(super) gather: CudaFunction,
    pub(super) scatter: CudaFunction,
    pub(super) zero: CudaFunction,
    pub(super) decode: CudaFunction,
    pub(super) check: CudaFunction,
    pub(super) attend: CudaFunction,
}

pub(super) fn grid_stride(total: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            total.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn per_element(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn count(n: usize, what: &str) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Shape(format!("{n} {what} (at most 2^32 - 1)")))
}
