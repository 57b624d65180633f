//! The decode step's cost: one [`Gpu::attend_batch`] for a batch of requests (on a
//! device backend one upload, one launch and one synchronisation for the whole tick)
//! against one call per request (`check_tags`, then `attend`: the loop the trait's
//! default `attend_batch` runs, which is what a decode tick cost before batching).
//!
//! Each request owns `seq_pages` pages of its own room, written by [`Gpu::write_tokens`];
//! its query position is chosen so that every request echoes a different token. Times
//! are host wall time of the whole step (each variant's synchronisations included),
//! medians over `runs` after `warmup`, the two variants alternating. Every run's tokens
//! are compared with what the fill wrote, so a fast wrong path fails instead of
//! reporting. No timing assertion: the figures go to docs/PERFORMANCE.md by hand.

use crate::bench::median;
use kvsim_engine::gpu::{ids, AttendRequest, DeviceError, Gpu, TagError, WriteError};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey, Token};
use std::time::Instant;

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct StepConfig {
    /// Requests in the decode batch.
    pub batch: u32,
    /// Pages in each request's page table (every one tag-checked).
    pub seq_pages: u32,
    pub warmup: u32,
    pub runs: u32,
}

impl StepConfig {
    /// Pages a backend needs for this configuration (each request's pages its own).
    pub fn pages(&self) -> u32 {
        self.batch * self.seq_pages
    }
}

/// The measured medians, in microseconds per decode step.
#[derive(Clone, Copy, Debug)]
pub struct StepResult {
    pub batch: u32,
    pub median_us_batched: f64,
    pub median_us_per_request: f64,
}

impl StepResult {
    /// One table row: batch size, both medians, their ratio.
    pub fn row(&self) -> String {
        format!(
            "| {} | {:.1} | {:.1} | {:.1}x |",
            self.batch,
            self.median_us_batched,
            self.median_us_per_request,
            self.median_us_per_request / self.median_us_batched
        )
    }
}

/// Why the step benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Tag(#[from] TagError),
    #[error("{0}")]
    Wrong(String),
}

/// The token the fill writes at position `pos` of request `r`.
fn fill_token(r: u32, pos: u64) -> Token {
    (r.wrapping_mul(40_503) ^ (pos as u32).wrapping_mul(2_654_435_761)) | 1
}

/// One request's pages, room and query: what the step reads and what it must echo.
struct Request {
    table: Vec<PageTag>,
    room: RoomKey,
    query: u64,
    want: Token,
}

impl Request {
    /// The attention request of this request's decode step.
    fn attend(&self, seq_len: u64) -> AttendRequest<'_> {
        AttendRequest {
            pages: &self.table,
            room: self.room,
            seq_len,
            query_pos: self.query,
        }
    }
}

/// Write every request's pages under its own room; the requests.
fn fill<G: Gpu>(gpu: &mut G, cfg: &StepConfig) -> Result<Vec<Request>, StepError> {
    let ps = u64::from(gpu.page_size());
    let seq_len = u64::from(cfg.seq_pages) * ps;
    let mut out = Vec::with_capacity(cfg.batch as usize);
    for r in 0..cfg.batch {
        let table: Vec<PageTag> = (0..cfg.seq_pages)
            .map(|i| PageTag {
                page: PageId(r * cfg.seq_pages + i + 1),
                gen: Generation(1),
            })
            .collect();
        let room = RoomKey::new(r + 1, 1);
        let tokens: Vec<Token> = (0..seq_len).map(|p| fill_token(r, p)).collect();
        gpu.write_tokens(&table, 0, &tokens, room)?;
        let query = u64::from(r) % seq_len;
        let want = fill_token(r, query);
        out.push(Request {
            table,
            room,
            query,
            want,
        });
    }
    Ok(out)
}

/// The decode step as one batch; the tokens in batch order.
fn step_batched<G: Gpu>(gpu: &G, reqs: &[AttendRequest<'_>]) -> Result<Vec<Token>, StepError> {
    gpu.attend_batch(reqs, true)?
        .into_iter()
        .map(|r| r.map_err(|m| StepError::Tag(m.into())))
        .collect()
}

/// The decode step as one check and one attention call per request.
fn step_per_request<G: Gpu>(gpu: &G, reqs: &[AttendRequest<'_>]) -> Result<Vec<Token>, StepError> {
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        gpu.check_tags(r.pages, r.room)?;
        out.push(gpu.attend(&ids(r.pages), r.seq_len, r.query_pos)?);
    }
    Ok(out)
}

/// Run the benchmark on `gpu`, which must have at least [`StepConfig::pages`] pages.
pub fn run<G: Gpu>(gpu: &mut G, cfg: &StepConfig) -> Result<StepResult, StepError> {
    if gpu.pages() < cfg.pages() || cfg.batch == 0 || cfg.seq_pages == 0 {
        return Err(StepError::Wrong(format!(
            "a batch of {} requests of {} pages needs {} pages; the backend has {}",
            cfg.batch,
            cfg.seq_pages,
            cfg.pages(),
            gpu.pages()
        )));
    }
    let seq_len = u64::from(cfg.seq_pages) * u64::from(gpu.page_size());
    let requests = fill(gpu, cfg)?;
    let reqs: Vec<AttendRequest<'_>> = requests.iter().map(|r| r.attend(seq_len)).collect();
    let want: Vec<Token> = requests.iter().map(|r| r.want).collect();
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..(cfg.warmup + cfg.runs) * 2 {
        let per_request = i % 2 == 1;
        let t0 = Instant::now();
        let got = if per_request {
            step_per_request(&*gpu, &reqs)?
        } else {
            step_batched(&*gpu, &reqs)?
        };
        let us = t0.elapsed().as_secs_f64() * 1e6;
        if got != want {
            let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            return Err(StepError::Wrong(format!(
                "{bad} of {} requests did not echo their token (per request: {per_request})",
                want.len()
            )));
        }
        if i >= cfg.warmup * 2 {
            times[usize::from(per_request)].push(us);
        }
    }
    let [batched, single] = times;
    Ok(StepResult {
        batch: cfg.batch,
        median_us_batched: median(&batched),
        median_us_per_request: median(&single),
    })
}

/// The table header of [`StepResult::row`].
pub const TABLE_HEAD: &str =
    "| batch | attend_batch us/step | per request us/step | per request / batch |\n|---|---|---|---|";

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::gpu::HostGpu;

    fn cfg(batch: u32) -> StepConfig {
        StepConfig {
            batch,
            seq_pages: 4,
            warmup: 1,
            runs: 3,
        }
    }

    #[test]
    fn both_variants_echo_every_request_on_the_host() {
        for batch in [1, 7, 32] {
            let c = cfg(batch);
            let mut gpu = HostGpu::new(c.pages(), 16);
            let r = run(&mut gpu, &c).expect("the host backend echoes every request");
            assert_eq!(r.batch, batch);
            assert!(r.median_us_batched.is_finite() && r.median_us_per_request.is_finite());
        }
    }

    /// The comparison fires: a page overwritten under another room after the fill
    /// fails the tag check, and the benchmark stops instead of timing it.
    #[test]
    fn a_foreign_page_stops_the_benchmark() {
        let c = cfg(4);
        let mut gpu = HostGpu::new(c.pages(), 16);
        let reqs = fill(&mut gpu, &c).expect("fill");
        let seq_len = 4 * 16;
        let intruder = RoomKey::new(99, 1);
        gpu.write_tokens(&reqs[2].table[1..2], 0, &[7; 16], intruder)
            .expect("overwrite");
        let ar: Vec<AttendRequest<'_>> = reqs.iter().map(|r| r.attend(seq_len)).collect();
        assert!(matches!(step_batched(&gpu, &ar), Err(StepError::Tag(_))));
        assert!(matches!(
            step_per_request(&gpu, &ar),
            Err(StepError::Tag(_))
        ));
    }

    #[test]
    fn too_few_pages_is_an_error_naming_the_need() {
        let c = cfg(8);
        let mut gpu = HostGpu::new(c.pages() - 1, 16);
        let e = run(&mut gpu, &c).expect_err("too small");
        assert!(e.to_string().contains("needs 32 pages"), "{e}");
    }
}
