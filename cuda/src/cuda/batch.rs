//! Batched attention on the device: a batch of requests flattened as the kernel reads
//! it ([`HostBatch`]), its device copy with the output buffers ([`DeviceBatch`]), and
//! the upload, launch and read-back on [`CudaGpu`]. The other operations are
//! [`super::gpu`]'s.

use crate::cuda::gpu::CudaGpu;
use crate::cuda::launch::{count, STAGE_LIMIT_BYTES};
use crate::GpuError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use kvsim_engine::gpu::layout;
use kvsim_engine::gpu::{AttendRequest, TagMismatch};
use kvsim_engine::ids::{PageTag, RoomKey, Token};

/// A batch of attention requests flattened as the kernel reads it.
#[derive(Clone, Debug, Default)]
pub struct HostBatch {
    pub table_page: Vec<u32>,
    pub table_gen: Vec<u64>,
    pub off: Vec<u32>,
    pub len: Vec<u32>,
    pub room: Vec<u32>,
    pub room_gen: Vec<u64>,
    pub seq_len: Vec<u64>,
    pub query_pos: Vec<u64>,
}

impl HostBatch {
    pub fn from_requests(batch: &[AttendRequest<'_>]) -> Self {
        let mut b = HostBatch::default();
        for r in batch {
            b.push(r.pages, r.room, r.seq_len, r.query_pos);
        }
        b
    }

    /// Append one request.
    pub fn push(&mut self, pages: &[PageTag], room: RoomKey, seq_len: u64, query_pos: u64) {
        self.off.push(self.table_page.len() as u32);
        self.len.push(pages.len() as u32);
        self.table_page.extend(pages.iter().map(|t| t.page.0));
        self.table_gen.extend(pages.iter().map(|t| t.gen.0));
        self.room.push(room.room.0);
        self.room_gen.push(room.gen.0);
        self.seq_len.push(seq_len);
        self.query_pos.push(query_pos);
    }

    pub fn requests(&self) -> usize {
        self.off.len()
    }
}

/// A [`HostBatch`] in device memory with its output buffers.
pub struct DeviceBatch {
    pub(super) table_page: CudaSlice<u32>,
    pub(super) table_gen: CudaSlice<u64>,
    pub(super) off: CudaSlice<u32>,
    pub(super) len: CudaSlice<u32>,
    pub(super) room: CudaSlice<u32>,
    pub(super) room_gen: CudaSlice<u64>,
    pub(super) seq_len: CudaSlice<u64>,
    pub(super) query_pos: CudaSlice<u64>,
    pub(super) n: u32,
    pub(super) out_token: CudaSlice<u32>,
    pub(super) out_flag: CudaSlice<u32>,
}

impl DeviceBatch {
    pub fn requests(&self) -> u32 {
        self.n
    }
}

impl CudaGpu {
    /// Upload a batch for [`CudaGpu::launch_attend`].
    pub fn upload_batch(&self, b: &HostBatch) -> Result<DeviceBatch, GpuError> {
        let n = count(b.requests(), "requests")?;
        Ok(DeviceBatch {
            table_page: self.htod(&b.table_page)?,
            table_gen: self.htod(&b.table_gen)?,
            off: self.htod(&b.off)?,
            len: self.htod(&b.len)?,
            room: self.htod(&b.room)?,
            room_gen: self.htod(&b.room_gen)?,
            seq_len: self.htod(&b.seq_len)?,
            query_pos: self.htod(&b.query_pos)?,
            n,
            out_token: self.stream.alloc_zeros::<u32>(b.requests().max(1))?,
            out_flag: self.stream.alloc_zeros::<u32>(b.requests().max(1))?,
        })
    }

    /// Launch paged echo attention for an uploaded batch (asynchronous: read the
    /// results with [`CudaGpu::batch_results`]).
    pub fn launch_attend(&self, d: &mut DeviceBatch, check: bool) -> Result<(), GpuError> {
        if d.n == 0 {
            return Ok(());
        }
        let (pool, ps, kw, scale) = (
            self.pages,
            self.page_size,
            self.key_width as u32,
            self.scale,
        );
        let (check, n) = (u32::from(check), d.n);
        // Scores and weights, plus the staged page when it fits the default 48 KiB.
        let base_bytes = 2 * ps * 4;
        let page_bytes = (self.page_floats() as u32 + ps) * 4; // one pad float per slot
        let stage = u32::from(base_bytes + page_bytes <= STAGE_LIMIT_BYTES);
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (layout::ATTEND_THREADS, 1, 1),
            shared_mem_bytes: base_bytes + stage * page_bytes,
        };
        let mut b = self.stream.launch_builder(&self.k.attend);
        b.arg(&self.data)
            .arg(&self.tags)
            .arg(&pool)
            .arg(&ps)
            .arg(&kw)
            .arg(&scale)
            .arg(&d.table_page)
            .arg(&d.table_gen)
            .arg(&d.off)
            .arg(&d.len)
            .arg(&d.room)
            .arg(&d.room_gen)
            .arg(&d.seq_len)
            .arg(&d.query_pos)
            .arg(&check)
            .arg(&stage)
            .arg(&n)
            .arg(&mut d.out_token)
            .arg(&mut d.out_flag);
        // SAFETY: matches kv_attend; one block per request, offsets and lengths index
        // the uploaded table, shared memory holds 2 * page_size floats and, when
        // `stage` is set, one page.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Tokens and flags of a launched batch (synchronises the stream).
    pub fn batch_results(&self, d: &DeviceBatch) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
        let mut tokens = self.stream.clone_dtoh(&d.out_token)?;
        let mut flags = self.stream.clone_dtoh(&d.out_flag)?;
        self.stream.synchronize()?;
        tokens.truncate(d.n as usize);
        flags.truncate(d.n as usize);
        Ok((tokens, flags))
    }

    /// [`Gpu::attend_batch`](kvsim_engine::gpu::Gpu::attend_batch): one upload, one
    /// launch, one synchronisation.
    pub fn try_attend_batch(
        &self,
        batch: &[AttendRequest<'_>],
        check: bool,
    ) -> Result<Vec<Result<Token, TagMismatch>>, GpuError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut d = self.upload_batch(&HostBatch::from_requests(batch))?;
        self.launch_attend(&mut d, check)?;
        let (tokens, flags) = self.batch_results(&d)?;
        batch
            .iter()
            .zip(tokens.iter().zip(&flags))
            .map(|(r, (&tok, &flag))| Ok(self.flag_result(flag, r.pages)?.map(|()| tok)))
            .collect()
    }
}
