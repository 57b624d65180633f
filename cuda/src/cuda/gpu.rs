//! One node's KV memory on a CUDA device ([`CudaGpu`]): its pool and tags, and every
//! operation as a `try_*` method that returns [`GpuError`] (writes, gathers, scatters,
//! tag checks, token decode, zeroing). Batched attention is [`super::batch`]'s; the
//! engine's `Gpu` trait on top is [`super::engine_gpu`]'s.

use crate::cuda::launch::{count, grid_stride, per_element, Kernels};
use crate::GpuError;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, PushKernelArg};
use kvsim_engine::gpu::layout::{self, TAG_WORDS};
use kvsim_engine::gpu::{TagMismatch, WriteTag};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};
use std::collections::BTreeSet;
use std::sync::Arc;

/// One node's KV memory on a CUDA device.
pub struct CudaGpu {
    pub(super) stream: Arc<CudaStream>,
    pub(super) k: Arc<Kernels>,
    pub(super) page_size: u32,
    pub(super) pages: u32,
    pub(super) key_width: usize,
    pub(super) scale: f32,
    pub(super) data: CudaSlice<f32>,
    pub(super) tags: CudaSlice<u64>,
}

impl CudaGpu {
    /// Copy to the device; an empty slice becomes one default element (CUDA cannot
    /// allocate zero bytes, and kernels never read past their counts).
    pub(super) fn htod<T: DeviceRepr + Default + Clone>(
        &self,
        v: &[T],
    ) -> Result<CudaSlice<T>, GpuError> {
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

    pub(super) fn page_floats(&self) -> usize {
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

    /// [`Gpu::write_tokens`](kvsim_engine::gpu::Gpu::write_tokens): one launch, or one
    /// per table entry in order when the touched entries repeat a page (so the last
    /// write wins, as on the CPU).
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

    /// [`Gpu::read_pages`](kvsim_engine::gpu::Gpu::read_pages): one gather and one copy
    /// for all pages.
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

    /// [`Gpu::write_page`](kvsim_engine::gpu::Gpu::write_page).
    pub fn try_write_page(
        &mut self,
        dst: PageTag,
        room: RoomKey,
        kv: &[u32],
    ) -> Result<(), GpuError> {
        let pf = self.page_floats();
        // `layout::payload_lands`: a payload of another shape (a hostile or
        // mismatched peer) is not applied; a short one lands its leading slots over
        // what the page holds (read back first), so the rest keep theirs.
        if dst.page.0 > self.pages
            || !layout::payload_lands(kv.len(), self.page_size, self.key_width)
        {
            return Ok(());
        }
        let mut page: Vec<u32> = if kv.len() < pf {
            let mut held = self.try_read_pages(&[dst.page])?;
            held.pop().unwrap_or_default()
        } else {
            Vec::new()
        };
        page.resize(pf, 0);
        page[..kv.len()].copy_from_slice(kv);
        let floats: Vec<f32> = page.iter().map(|&b| f32::from_bits(b)).collect();
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

    /// [`Gpu::page_tag`](kvsim_engine::gpu::Gpu::page_tag).
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

    /// [`Gpu::check_tags`](kvsim_engine::gpu::Gpu::check_tags): the tag check alone, in one kernel.
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
    pub(super) fn flag_result(
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

    /// [`Gpu::zero_page`](kvsim_engine::gpu::Gpu::zero_page) for several pages in one launch.
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
