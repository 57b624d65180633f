//! One CUDA device with the kernels loaded ([`CudaDevice`]): opening it (after the
//! probe), and making a node's KV memory on it. The memory's operations are
//! [`super::gpu`]'s.

use crate::cuda::gpu::CudaGpu;
use crate::cuda::launch::{Kernels, MAX_PAGE_SIZE};
use crate::kernels::{self, PtxOrigin};
use crate::GpuError;
use cudarc::driver::{CudaContext, CudaStream};
use kvsim_engine::gpu::key_width;
use kvsim_engine::gpu::layout::{self, TAG_WORDS};
use std::sync::Arc;

/// One CUDA device with the kernels loaded: the factory of [`CudaGpu`]s.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    origin: PtxOrigin,
}

impl CudaDevice {
    /// Open device `ordinal` and load the kernels. Probe first
    /// ([`crate::probe::cuda_device`]): without a driver cudarc panics here.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        if let crate::probe::Probe::Absent(why) = crate::probe::cuda_device() {
            return Err(GpuError::NoDevice(why));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: every slice of this device is allocated, used and freed on its one
        // stream, so cudarc's cross-stream event tracking (two events per allocation)
        // has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let (module, origin) = kernels::load(&ctx)?;
        let f = |name: &str| module.load_function(name);
        let kernels = Kernels {
            write_tokens: f("kv_write_tokens")?,
            gather: f("kv_gather_pages")?,
            scatter: f("kv_scatter_pages")?,
            zero: f("kv_zero_pages")?,
            decode: f("kv_decode_tokens")?,
            check: f("kv_check_tags")?,
            attend: f("kv_attend")?,
        };
        Ok(CudaDevice {
            ctx,
            stream,
            kernels: Arc::new(kernels),
            origin,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Where the kernels' PTX came from.
    pub fn ptx_origin(&self) -> &PtxOrigin {
        &self.origin
    }

    /// The device's name, for reports.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// A zeroed KV memory of `pages` usable pages (ids `1..=pages`) of `page_size` slots.
    pub fn gpu(&self, pages: u32, page_size: u32) -> Result<CudaGpu, GpuError> {
        if page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(GpuError::Shape(format!(
                "page size {page_size} (1..={MAX_PAGE_SIZE})"
            )));
        }
        let kw = key_width(page_size);
        let floats = (pages as usize + 1) * layout::page_floats(page_size, kw);
        let data = self.stream.alloc_zeros::<f32>(floats)?;
        let tags = self
            .stream
            .alloc_zeros::<u64>((pages as usize + 1) * TAG_WORDS)?;
        Ok(CudaGpu {
            stream: self.stream.clone(),
            k: self.kernels.clone(),
            page_size,
            pages,
            key_width: kw,
            scale: layout::score_scale(kw),
            data,
            tags,
        })
    }
}
