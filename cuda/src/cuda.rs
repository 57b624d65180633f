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

use crate::kernels::{self, PtxOrigin};
use crate::GpuError;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use kvsim_engine::gpu::layout::{self, TAG_WORDS};
use kvsim_engine::gpu::{
    digest_tokens, key_width, AttendRequest, DeviceError, Gpu, TagError, TagMismatch, WriteError,
    WriteTag,
};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Most blocks a grid-stride kernel is launched with.
const MAX_BLOCKS: u64 = 1 << 20;
/// Largest page size the attention kernel's shared memory holds (2 floats per slot).
pub const MAX_PAGE_SIZE: u32 = 4096;
/// Dynamic shared memory a launch may use without opting in to more (48 KiB): the
/// attention kernel stages the query's page in it when the page fits (page size 64:
/// 24 KiB), else reads it from global memory.
const STAGE_LIMIT_BYTES: u32 = 48 * 1024;

/// The loaded kernels of one context.
struct Kernels {
    write_tokens: CudaFunction,
    gather: CudaFunction,
    scatter: CudaFunction,
    zero: CudaFunction,
    decode: CudaFunction,
    check: CudaFunction,
    attend: CudaFunction,
}

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
    table_page: CudaSlice<u32>,
    table_gen: CudaSlice<u64>,
    off: CudaSlice<u32>,
    len: CudaSlice<u32>,
    room: CudaSlice<u32>,
    room_gen: CudaSlice<u64>,
    seq_len: CudaSlice<u64>,
    query_pos: CudaSlice<u64>,
    n: u32,
    out_token: CudaSlice<u32>,
    out_flag: CudaSlice<u32>,
}

impl DeviceBatch {
    pub fn requests(&self) -> u32 {
        self.n
    }
}

/// One node's KV memory on a CUDA device.
pub struct CudaGpu {
    stream: Arc<CudaStream>,
    k: Arc<Kernels>,
    page_size: u32,
    pages: u32,
    key_width: usize,
    scale: f32,
    data: CudaSlice<f32>,
    tags: CudaSlice<u64>,
}

/// A CUDA error inside trait method `op`, as the engine's error channel carries it: the
/// node fails the request it was serving, the process goes on.
fn device(op: &'static str, e: GpuError) -> DeviceError {
    DeviceError {
        op,
        detail: e.to_string(),
    }
}

fn grid_stride(total: u64) -> LaunchConfig {
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

fn per_element(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn count(n: usize, what: &str) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Shape(format!("{n} {what} (at most 2^32 - 1)")))
}

impl CudaGpu {
    /// Copy to the device; an empty slice becomes one default element (CUDA cannot
    /// allocate zero bytes, and kernels never read past their counts).
    fn htod<T: DeviceRepr + Default + Clone>(&self, v: &[T]) -> Result<CudaSlice<T>, GpuError> {
        if v.is_empty() {
            Ok(self.stream.clone_htod(&[T::default()])?)
        } else {
            Ok(self.stream.clone_htod(v)?)
        }
    }

    /// A tag table on the device: its page ids and its generations, two arrays.
    fn htod_tags(&self, table: &[PageTag]) -> Result<(CudaSlice<u32>, CudaSlice<u64>), GpuError> {
        let tp: Vec<u32> = table.iter().map(|t| t.page.0).collect();
        let tg: Vec<u64> = table.iter().map(|t| t.gen.0).collect();
        debug_assert_eq!(tp.len(), tg.len());
        Ok((self.htod(&tp)?, self.htod(&tg)?))
    }

    /// The ids of those of `pages` inside the pool, in order (a page outside it is
    /// passed over, as on the host).
    fn in_pool(&self, pages: &[PageId]) -> Vec<u32> {
        let valid: Vec<u32> = pages
            .iter()
            .filter(|p| p.0 <= self.pages)
            .map(|p| p.0)
            .collect();
        debug_assert!(valid.len() <= pages.len());
        valid
    }

    fn page_floats(&self) -> usize {
        layout::page_floats(self.page_size, self.key_width)
    }

    /// Bytes of device memory the pool and tags take.
    pub fn device_bytes(&self) -> usize {
        self.data.len() * 4 + self.tags.len() * 8
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Write tokens through a table whose page ids are distinct (one launch).
    fn launch_write(
        &mut self,
        table: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), GpuError> {
        let n = count(tokens.len(), "tokens")?;
        let (tp, tg) = self.htod_tags(table)?;
        let tok = self.htod(tokens)?;
        let tlen = count(table.len(), "pages")?;
        let (ps, kw, pool) = (self.page_size, self.key_width as u32, self.pages);
        let (room_id, room_gen) = (room.room.0, room.gen.0);
        let mut b = self.stream.launch_builder(&self.k.write_tokens);
        b.arg(&mut self.data)
            .arg(&mut self.tags)
            .arg(&pool)
            .arg(&ps)
            .arg(&kw)
            .arg(&tp)
            .arg(&tg)
            .arg(&tlen)
            .arg(&start)
            .arg(&tok)
            .arg(&n)
            .arg(&room_id)
            .arg(&room_gen);
        // SAFETY: the argument list matches kv_write_tokens; every index the kernel
        // derives is bounded by the counts passed with the buffers.
        unsafe { b.launch(per_element(n)) }?;
        Ok(())
    }

    /// [`Gpu::write_tokens`]: one launch, or one per table entry in order when the
    /// touched entries repeat a page (so the last write wins, as on the CPU).
    pub fn try_write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), GpuError> {
        if tokens.is_empty() || pages.is_empty() {
            return Ok(());
        }
        let ps = u64::from(self.page_size);
        let end = start.saturating_add(tokens.len() as u64);
        let Ok(first) = usize::try_from(start / ps) else {
            return Ok(());
        };
        if first >= pages.len() {
            return Ok(());
        }
        let last =
            usize::try_from((end - 1) / ps).map_or(pages.len() - 1, |l| l.min(pages.len() - 1));
        let touched = &pages[first..=last];
        let base = first as u64 * ps;
        let mut seen = BTreeSet::new();
        let repeats = touched
            .iter()
            .any(|t| t.page.0 <= self.pages && !seen.insert(t.page.0));
        if !repeats {
            let stop = ((last as u64 + 1) * ps).min(end);
            let toks = &tokens[..(stop - start) as usize];
            return self.launch_write(touched, start - base, toks, room);
        }
        for (k, t) in touched.iter().enumerate() {
            let lo = base + k as u64 * ps;
            let (from, to) = (lo.max(start), (lo + ps).min(end));
            if from < to {
                let toks = &tokens[(from - start) as usize..(to - start) as usize];
                self.launch_write(std::slice::from_ref(t), from - lo, toks, room)?;
            }
        }
        Ok(())
    }

    /// [`Gpu::read_pages`]: one gather and one copy for all pages.
    pub fn try_read_pages(&self, pages: &[PageId]) -> Result<Vec<Vec<u32>>, GpuError> {
        let valid = self.in_pool(pages);
        if valid.is_empty() {
            return Ok(vec![Vec::new(); pages.len()]);
        }
        let pf = self.page_floats();
        let n = count(valid.len(), "pages")?;
        let pf32 = count(pf, "page floats")?;
        let list = self.htod(&valid)?;
        let mut out = self.stream.alloc_zeros::<f32>(valid.len() * pf)?;
        let mut b = self.stream.launch_builder(&self.k.gather);
        b.arg(&self.data)
            .arg(&list)
            .arg(&n)
            .arg(&pf32)
            .arg(&mut out);
        // SAFETY: matches kv_gather_pages; `out` holds n * page_floats floats.
        unsafe { b.launch(grid_stride(u64::from(n) * u64::from(pf32))) }?;
        let host = self.stream.clone_dtoh(&out)?;
        self.stream.synchronize()?;
        let mut chunks = host.chunks_exact(pf);
        Ok(pages
            .iter()
            .map(|p| {
                if p.0 <= self.pages {
                    chunks
                        .next()
                        .map(|c| c.iter().map(|f| f.to_bits()).collect())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                }
            })
            .collect())
    }

    /// [`Gpu::write_page`].
    pub fn try_write_page(
        &mut self,
        dst: PageTag,
        room: RoomKey,
        kv: &[u32],
    ) -> Result<(), GpuError> {
        let pf = self.page_floats();
        // A payload of the wrong size (a hostile or mismatched peer) is not applied.
        if dst.page.0 > self.pages || kv.len() != pf {
            return Ok(());
        }
        let floats: Vec<f32> = kv.iter().map(|&b| f32::from_bits(b)).collect();
        let input = self.htod(&floats)?;
        let list = self.htod(&[dst.page.0])?;
        let gens = self.htod(&[dst.gen.0])?;
        let (n, pf32) = (1u32, count(pf, "page floats")?);
        let (room_id, room_gen) = (room.room.0, room.gen.0);
        let mut b = self.stream.launch_builder(&self.k.scatter);
        b.arg(&mut self.data)
            .arg(&mut self.tags)
            .arg(&list)
            .arg(&gens)
            .arg(&n)
            .arg(&pf32)
            .arg(&input)
            .arg(&room_id)
            .arg(&room_gen);
        // SAFETY: matches kv_scatter_pages; one page in range, `input` one page long.
        unsafe { b.launch(grid_stride(pf as u64)) }?;
        Ok(())
    }

    /// [`Gpu::page_tag`].
    pub fn try_page_tag(&self, page: PageId) -> Result<Option<WriteTag>, GpuError> {
        if page.0 > self.pages {
            return Ok(None);
        }
        let t = page.0 as usize * TAG_WORDS;
        let words = self.stream.clone_dtoh(&self.tags.slice(t..t + TAG_WORDS))?;
        self.stream.synchronize()?;
        let mut w = [0u64; TAG_WORDS];
        w.copy_from_slice(&words);
        Ok(layout::decode_tag(w))
    }

    /// [`Gpu::check_tags`]: the tag check alone, in one kernel.
    pub fn try_check_tags(
        &self,
        pages: &[PageTag],
        room: RoomKey,
    ) -> Result<Result<(), TagMismatch>, GpuError> {
        if pages.is_empty() {
            return Ok(Ok(()));
        }
        let (tp, tg) = self.htod_tags(pages)?;
        let mut first = self.htod(&[layout::NO_MISMATCH])?;
        let len = count(pages.len(), "pages")?;
        let (pool, room_id, room_gen) = (self.pages, room.room.0, room.gen.0);
        let mut b = self.stream.launch_builder(&self.k.check);
        b.arg(&self.tags)
            .arg(&pool)
            .arg(&tp)
            .arg(&tg)
            .arg(&len)
            .arg(&room_id)
            .arg(&room_gen)
            .arg(&mut first);
        // SAFETY: matches kv_check_tags; threads beyond `len` do nothing.
        unsafe { b.launch(per_element(len)) }?;
        let v = self.stream.clone_dtoh(&first)?;
        self.stream.synchronize()?;
        let bad = v.first().copied().unwrap_or(layout::NO_MISMATCH);
        let flag = if bad == layout::NO_MISMATCH {
            layout::FLAG_OK
        } else {
            bad + 1
        };
        self.flag_result(flag, pages).map(|r| r.map(|_| ()))
    }

    /// A flag as the trait's result (reading the stored tag on the error path only).
    fn flag_result(
        &self,
        flag: u32,
        pages: &[PageTag],
    ) -> Result<Result<(), TagMismatch>, GpuError> {
        if flag == layout::FLAG_OK {
            return Ok(Ok(()));
        }
        let idx = (flag as usize - 1).min(pages.len().saturating_sub(1));
        let found = match pages.get(idx) {
            Some(t) => self.try_page_tag(t.page)?,
            None => None,
        };
        Ok(layout::flag_to_result(flag, pages, |_| found))
    }

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

    /// [`Gpu::attend_batch`]: one upload, one launch, one synchronisation.
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

    /// The tokens at positions `start..start + n` through a page table.
    pub fn try_tokens(&self, pages: &[PageId], start: u64, n: u64) -> Result<Vec<Token>, GpuError> {
        let mut out = Vec::new();
        let mut pos = start;
        while pos < start + n {
            let chunk = (start + n - pos).min(1 << 28) as u32;
            let table: Vec<u32> = pages.iter().map(|p| p.0).collect();
            let tp = self.htod(&table)?;
            let mut dev = self.stream.alloc_zeros::<u32>(chunk as usize)?;
            let (pool, ps, kw) = (self.pages, self.page_size, self.key_width as u32);
            let tlen = count(pages.len(), "pages")?;
            let mut b = self.stream.launch_builder(&self.k.decode);
            b.arg(&self.data)
                .arg(&pool)
                .arg(&ps)
                .arg(&kw)
                .arg(&tp)
                .arg(&tlen)
                .arg(&pos)
                .arg(&chunk)
                .arg(&mut dev);
            // SAFETY: matches kv_decode_tokens; `dev` holds `chunk` tokens.
            unsafe { b.launch(per_element(chunk)) }?;
            out.extend(self.stream.clone_dtoh(&dev)?);
            self.stream.synchronize()?;
            pos += u64::from(chunk);
        }
        Ok(out)
    }

    /// [`Gpu::zero_page`] for several pages in one launch.
    pub fn try_zero_pages(&mut self, pages: &[PageId]) -> Result<(), GpuError> {
        let valid = self.in_pool(pages);
        if valid.is_empty() {
            return Ok(());
        }
        let list = self.htod(&valid)?;
        let n = count(valid.len(), "pages")?;
        let pf = count(self.page_floats(), "page floats")?;
        let mut b = self.stream.launch_builder(&self.k.zero);
        b.arg(&mut self.data)
            .arg(&mut self.tags)
            .arg(&list)
            .arg(&n)
            .arg(&pf);
        // SAFETY: matches kv_zero_pages; every listed page is in the pool.
        unsafe { b.launch(grid_stride(u64::from(n) * u64::from(pf))) }?;
        Ok(())
    }
}

impl Gpu for CudaGpu {
    /// The page's floats as bit patterns, exactly as `HostGpu`'s.
    type Kv = Vec<u32>;

    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn pages(&self) -> u32 {
        self.pages
    }

    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError> {
        // The host's range check, before any launch: refused whole, never cut short.
        layout::check_token_write(self.pages, self.page_size, pages, start, tokens.len())?;
        self.try_write_tokens(pages, start, tokens, room)
            .map_err(|e| device("write_tokens", e))?;
        Ok(())
    }

    fn read_page(&self, page: PageId) -> Result<Vec<u32>, DeviceError> {
        Ok(self
            .try_read_pages(&[page])
            .map_err(|e| device("read_page", e))?
            .pop()
            .unwrap_or_default())
    }

    fn read_pages(&self, pages: &[PageId]) -> Result<Vec<Vec<u32>>, DeviceError> {
        self.try_read_pages(pages)
            .map_err(|e| device("read_pages", e))
    }

    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Vec<u32>) -> Result<(), WriteError> {
        layout::check_page_write(self.pages, dst.page.0)?;
        self.try_write_page(dst, room, kv)
            .map_err(|e| device("write_page", e))?;
        Ok(())
    }

    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        self.try_page_tag(page).map_err(|e| device("page_tag", e))
    }

    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        Ok(self
            .try_check_tags(pages, room)
            .map_err(|e| device("check_tags", e))??)
    }

    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        let table: Vec<PageTag> = pages
            .iter()
            .map(|&page| PageTag {
                page,
                gen: Default::default(),
            })
            .collect();
        let req = AttendRequest {
            pages: &table,
            room: RoomKey::default(),
            seq_len,
            query_pos,
        };
        let v = self
            .try_attend_batch(&[req], false)
            .map_err(|e| device("attend", e))?;
        Ok(v.first().copied().and_then(Result::ok).unwrap_or(0))
    }

    fn attend_batch(
        &self,
        batch: &[AttendRequest<'_>],
        check_tags: bool,
    ) -> Result<Vec<Result<Token, TagMismatch>>, DeviceError> {
        self.try_attend_batch(batch, check_tags)
            .map_err(|e| device("attend_batch", e))
    }

    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        let ps = u64::from(self.page_size);
        let Some(&page) = usize::try_from(pos / ps).ok().and_then(|i| pages.get(i)) else {
            return Ok(0);
        };
        Ok(self
            .try_tokens(&[page], pos % ps, 1)
            .map_err(|e| device("token_at", e))?
            .first()
            .copied()
            .unwrap_or(0))
    }

    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        self.try_zero_pages(&[page])
            .map_err(|e| device("zero_page", e))
    }

    /// The per-position tokens in one kernel and one copy, then the trait's digest.
    fn digest(&self, pages: &[PageId], tokens: u64) -> Result<u64, DeviceError> {
        if tokens == 0 {
            return Ok(digest_tokens([]));
        }
        let toks = self
            .try_tokens(pages, 0, tokens)
            .map_err(|e| device("digest", e))?;
        Ok(digest_tokens(toks))
    }
}
