//! The device benchmark: paged echo attention over a pool of several GB, with and
//! without the in-kernel tag check, against the device's HBM bandwidth.
//!
//! The pool is filled by one room; a batch of one request per page reads every page
//! of the pool exactly once (each request's page table has `seq_pages` entries, the
//! query sits in the first), so one launch reads the whole pool. Times are CUDA event
//! times of the attention launch alone, after warm-up, as the median of many runs,
//! alternating the two variants. The tokens of every run are checked (each request
//! must echo the token the fill wrote at its query position), so a fast wrong kernel
//! cannot pass. This module makes no timing assertion: figures go to
//! docs/PERFORMANCE.md by hand. It is not a model of real attention's arithmetic
//! intensity: echo attention reads one page per request.

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use kvsim_cuda::cuda::{CudaDevice, CudaGpu, DeviceBatch, HostBatch};
use kvsim_cuda::GpuError;
use kvsim_engine::gpu::{key_width, layout, Gpu};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, Token};

/// H200 SXM's published HBM3e bandwidth, used when the device attributes are absent.
pub const H200_HBM_BYTES_PER_S: f64 = 4.8e12;

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    pub pool_bytes: u64,
    pub page_size: u32,
    /// Entries of each request's page table (all tag-checked when the check is on).
    pub seq_pages: u32,
    pub warmup: u32,
    pub runs: u32,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            pool_bytes: 8 << 30,
            page_size: 64,
            seq_pages: 16,
            warmup: 3,
            runs: 25,
        }
    }
}

/// The measured figures.
#[derive(Clone, Debug)]
pub struct BenchResult {
    pub device: String,
    pub pool_pages: u32,
    pub pool_bytes: u64,
    pub requests: u32,
    /// KV bytes one launch reads (one page per request).
    pub kv_bytes: u64,
    /// Extra bytes the check reads per launch (table generations and stored tags).
    pub check_bytes: u64,
    pub median_ms_check: f64,
    pub median_ms_nocheck: f64,
    pub runs_ms_check: Vec<f64>,
    pub runs_ms_nocheck: Vec<f64>,
    pub hbm_bytes_per_s: f64,
    pub hbm_source: String,
}

impl BenchResult {
    /// Share of the checked attention's time the check costs.
    pub fn check_share(&self) -> f64 {
        (self.median_ms_check - self.median_ms_nocheck) / self.median_ms_check
    }

    /// Time the KV bytes take at the HBM limit.
    pub fn limit_ms(&self) -> f64 {
        self.kv_bytes as f64 / self.hbm_bytes_per_s * 1e3
    }

    /// The short table the device run prints last.
    pub fn table(&self) -> String {
        let gbps = |ms: f64| self.kv_bytes as f64 / (ms * 1e-3) / 1e9;
        format!(
            "| variant | median ms | KV GB/s | x HBM limit |\n|---|---|---|---|\n\
             | no tag check | {:.3} | {:.0} | {:.2} |\n\
             | tag check | {:.3} | {:.0} | {:.2} |\n\
             tag check share: {:.2}% (goal < 1%); HBM limit {:.2} TB/s ({}); \
             {} requests over {} pages ({:.2} GB), {} runs\n",
            self.median_ms_nocheck,
            gbps(self.median_ms_nocheck),
            self.median_ms_nocheck / self.limit_ms(),
            self.median_ms_check,
            gbps(self.median_ms_check),
            self.median_ms_check / self.limit_ms(),
            self.check_share() * 100.0,
            self.hbm_bytes_per_s / 1e12,
            self.hbm_source,
            self.requests,
            self.pool_pages,
            self.pool_bytes as f64 / 1e9,
            self.runs_ms_check.len(),
        )
    }
}

/// Peak HBM bandwidth from the device's memory clock and bus width (double data
/// rate), or [`H200_HBM_BYTES_PER_S`].
pub fn hbm_bandwidth(dev: &CudaDevice) -> (f64, String) {
    let ctx = dev.context();
    let clock = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    let bus = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    match (clock, bus) {
        (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => (
            f64::from(khz) * 1e3 * 2.0 * f64::from(bits) / 8.0,
            format!("device attributes: {} MHz x {bits} bits x 2", khz / 1000),
        ),
        _ => (
            H200_HBM_BYTES_PER_S,
            "H200 published figure (attributes unavailable)".into(),
        ),
    }
}

/// The median of `v` (NaN for none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The token the fill writes at pool position `i`.
fn fill_token(i: u64) -> Token {
    (i as u32).wrapping_mul(2_654_435_761) | 1
}

/// Run the benchmark.
pub fn run(dev: &CudaDevice, cfg: &BenchConfig) -> Result<BenchResult, GpuError> {
    let ps = cfg.page_size;
    let page_bytes = layout::page_floats(ps, key_width(ps)) as u64 * 4;
    let pages = u32::try_from(cfg.pool_bytes / page_bytes)
        .map_err(|_| GpuError::Shape(format!("{} bytes is too many pages", cfg.pool_bytes)))?;
    if pages < cfg.seq_pages.max(1) {
        return Err(GpuError::Shape(format!("pool of {pages} pages")));
    }
    let mut gpu = dev.gpu(pages, ps)?;
    let room = RoomKey::new(1, 1);
    let table = fill_pool(&mut gpu, room)?;
    let seq = cfg.seq_pages;
    let (batch, want) = echo_batch(&table, seq, ps, room);
    let mut d = gpu.upload_batch(&batch)?;
    drop(batch);
    let [nocheck, check] = time_attend(dev, &gpu, &mut d, cfg, &want)?;
    let (hbm, source) = hbm_bandwidth(dev);
    Ok(BenchResult {
        device: dev.name(),
        pool_pages: pages,
        pool_bytes: u64::from(pages + 1) * page_bytes,
        requests: pages,
        kv_bytes: u64::from(pages) * page_bytes,
        check_bytes: u64::from(pages) * u64::from(seq) * (8 + layout::TAG_WORDS as u64 * 8),
        median_ms_check: median(&check),
        median_ms_nocheck: median(&nocheck),
        runs_ms_check: check,
        runs_ms_nocheck: nocheck,
        hbm_bytes_per_s: hbm,
        hbm_source: source,
    })
}

/// Write every slot of the pool ([`fill_token`] of its position) under `room`,
/// generation 1; the page table of the whole pool.
fn fill_pool(gpu: &mut CudaGpu, room: RoomKey) -> Result<Vec<PageTag>, GpuError> {
    let (pages, ps) = (gpu.pages(), gpu.page_size());
    let table: Vec<PageTag> = (1..=pages)
        .map(|p| PageTag {
            page: PageId(p),
            gen: Generation(1),
        })
        .collect();
    let tokens: Vec<Token> = (0..u64::from(pages) * u64::from(ps))
        .map(fill_token)
        .collect();
    gpu.try_write_tokens(&table, 0, &tokens, room)?;
    Ok(table)
}

/// One request per page: `seq` pages from it on (wrapping), querying a position of its
/// first page; and the token each must echo.
fn echo_batch(table: &[PageTag], seq: u32, ps: u32, room: RoomKey) -> (HostBatch, Vec<Token>) {
    let pages = table.len() as u32;
    let mut batch = HostBatch::default();
    let mut want = Vec::with_capacity(pages as usize);
    let mut entries = Vec::with_capacity(seq as usize);
    for r in 0..pages {
        entries.clear();
        entries.extend((0..seq).map(|i| table[((r + i) % pages) as usize]));
        let q = u64::from(r % ps);
        batch.push(&entries, room, u64::from(seq) * u64::from(ps), q);
        want.push(fill_token(u64::from(r) * u64::from(ps) + q));
    }
    (batch, want)
}

/// Time the attention launch, alternately without and with the tag check, after
/// `cfg.warmup` rounds: each run's milliseconds `[without, with]`. The last round's
/// results must echo `want` with every flag clear.
fn time_attend(
    dev: &CudaDevice,
    gpu: &CudaGpu,
    d: &mut DeviceBatch,
    cfg: &BenchConfig,
    want: &[Token],
) -> Result<[Vec<f64>; 2], GpuError> {
    let ctx = dev.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..(cfg.warmup + cfg.runs) * 2 {
        let check = i % 2 == 1;
        start.record(gpu.stream())?;
        gpu.launch_attend(d, check)?;
        end.record(gpu.stream())?;
        end.synchronize()?;
        let ms = f64::from(start.elapsed_ms(&end)?);
        if i < cfg.warmup * 2 {
            continue;
        }
        times[usize::from(check)].push(ms);
        if i >= (cfg.warmup + cfg.runs) * 2 - 2 {
            let (got, flags) = gpu.batch_results(d)?;
            let bad = got
                .iter()
                .zip(want)
                .zip(&flags)
                .filter(|((g, w), f)| g != w || **f != layout::FLAG_OK)
                .count();
            if bad > 0 {
                return Err(GpuError::Shape(format!(
                    "{bad} of {} requests did not echo their token (check {check})",
                    want.len()
                )));
            }
        }
    }
    Ok(times)
}

/// `Gpu::pages` of the benchmark's pool for a config (what `run` would allocate).
pub fn pool_pages(cfg: &BenchConfig) -> u64 {
    cfg.pool_bytes / (layout::page_floats(cfg.page_size, key_width(cfg.page_size)) as u64 * 4)
}
