//! KV memory shared by a decode node's loop and its transfer thread.
//!
//! On hardware a KV write reaches device memory through the NIC while the scheduler
//! computes; here the memory is one [`Gpu`] behind a lock, used by the node's loop
//! (attention, its own writes) and by the transfer thread (landing writes). Who may
//! write which page is not decided here: the transfer thread writes only under a
//! [`kvsim_engine::kv::shared::WriteGuard`] from the node's one ownership record.

use crate::sync::{Arc, Mutex, MutexGuard};
use kvsim_engine::gpu::bytes::{ByteWrite, Fill, Landed};
use kvsim_engine::gpu::{DeviceError, Gpu, HostMemory, TagError, WireWords, WriteError, WriteTag};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};

/// A [`Gpu`] shared between threads (each call takes the lock once).
#[derive(Debug)]
pub struct SharedGpu<G>(Arc<Mutex<G>>);

impl<G> Clone for SharedGpu<G> {
    fn clone(&self) -> Self {
        SharedGpu(self.0.clone())
    }
}

impl<G: Gpu> SharedGpu<G> {
    pub fn new(gpu: G) -> Self {
        SharedGpu(Arc::new(Mutex::new(gpu)))
    }

    fn lock(&self) -> MutexGuard<'_, G> {
        // A thread that panicked while writing KV leaves memory of unknown content:
        // every user stops loudly too.
        self.0
            .lock()
            .expect("KV memory lock poisoned: a thread panicked mid-write")
    }
}

impl<G: Gpu> Gpu for SharedGpu<G> {
    type Kv = G::Kv;

    fn page_size(&self) -> u32 {
        self.lock().page_size()
    }
    fn pages(&self) -> u32 {
        self.lock().pages()
    }
    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError> {
        self.lock().write_tokens(pages, start, tokens, room)
    }
    fn read_page(&self, page: PageId) -> Result<Self::Kv, DeviceError> {
        self.lock().read_page(page)
    }
    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Self::Kv) -> Result<(), WriteError> {
        self.lock().write_page(dst, room, kv)
    }
    /// The lock is held while `fill` reads the payload (the transport bounds how long:
    /// `crate::net::STALL`).
    fn land_bytes(&mut self, w: ByteWrite<'_>, fill: &mut Fill<'_>) -> Landed
    where
        Self::Kv: WireWords,
    {
        self.lock().land_bytes(w, fill)
    }
    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        self.lock().page_tag(page)
    }
    fn host_memory(&mut self) -> Option<HostMemory> {
        self.lock().host_memory()
    }
    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        self.lock().attend(pages, seq_len, query_pos)
    }
    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        self.lock().token_at(pages, pos)
    }
    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        self.lock().zero_page(page)
    }
    fn digest(&self, pages: &[PageId], tokens: u64) -> Result<u64, DeviceError> {
        self.lock().digest(pages, tokens)
    }
    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        self.lock().check_tags(pages, room)
    }
}
