//! The engine's `Gpu` trait on [`CudaGpu`]: each method is its `try_*` method, with a
//! CUDA error carried as the engine's [`DeviceError`] (the node fails the request, the
//! process goes on). The operations themselves are [`super::gpu`]'s and
//! [`super::batch`]'s.

use crate::cuda::gpu::CudaGpu;
use crate::GpuError;
use kvsim_engine::gpu::layout;
use kvsim_engine::gpu::{
    digest_tokens, AttendRequest, DeviceError, Gpu, TagError, TagMismatch, WriteError, WriteTag,
};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};

/// A CUDA error inside trait method `op`, as the engine's error channel carries it: the
/// node fails the request it was serving, the process goes on.
fn device(op: &'static str, e: GpuError) -> DeviceError {
    DeviceError {
        op,
        detail: e.to_string(),
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
