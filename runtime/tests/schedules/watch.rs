//! The decode node's KV memory under watch: every write that reaches it (a landing, a
//! decode step's own KV) must be for a page the node's live incarnation holds at that
//! generation, as loom's models assert of their pages (`engine/tests/loom_shared.rs`,
//! `Kv::write`). A KV write the live record does not admit is the landing rule broken
//! at the memory itself, whatever the trace then says (a landing that the dead
//! incarnation finished is traced as failed back, and its bytes are in the pages).

use kvsim_engine::gpu::bytes::{ByteWrite, Fill, Landed};
use kvsim_engine::gpu::{DeviceError, Gpu, TagError, WireWords, WriteError, WriteTag};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_runtime::sync::{Arc, Mutex};

/// The record of the node's live incarnation, as its loop publishes it after each
/// restart.
#[derive(Clone, Debug)]
pub struct Live(Arc<Mutex<Arc<SharedPool>>>);

impl Live {
    pub fn new(pool: Arc<SharedPool>) -> Self {
        Live(Arc::new(Mutex::new(pool)))
    }

    pub fn set(&self, pool: Arc<SharedPool>) {
        *self.0.lock().expect("live record lock") = pool;
    }

    /// Every page of `tags` is the live record's at that generation.
    fn admit(&self, tags: &[PageTag], what: &str) {
        let pool = self.0.lock().expect("live record lock").clone();
        for t in tags {
            let now = pool.tag(t.page);
            assert!(
                now == Some(*t),
                "{what} for {t} reached memory whose live incarnation (epoch {}) holds \
                 page {} as {now:?}: a KV write its record does not admit",
                pool.epoch(),
                t.page
            );
        }
    }
}

/// A node's memory; with a [`Live`] record, under watch.
#[derive(Debug)]
pub struct Watched<G> {
    pub inner: G,
    pub live: Option<Live>,
}

impl<G: Gpu> Watched<G> {
    fn admit(&self, tags: &[PageTag], what: &str) {
        if let Some(live) = &self.live {
            live.admit(tags, what);
        }
    }
}

impl<G: Gpu> Gpu for Watched<G> {
    type Kv = G::Kv;

    fn page_size(&self) -> u32 {
        self.inner.page_size()
    }
    fn pages(&self) -> u32 {
        self.inner.pages()
    }
    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError> {
        self.admit(pages, "a token write");
        self.inner.write_tokens(pages, start, tokens, room)
    }
    fn read_page(&self, page: PageId) -> Result<Self::Kv, DeviceError> {
        self.inner.read_page(page)
    }
    fn write_page(&mut self, dst: PageTag, room: RoomKey, kv: &Self::Kv) -> Result<(), WriteError> {
        self.admit(&[dst], "a KV write");
        self.inner.write_page(dst, room, kv)
    }
    fn land_bytes(&mut self, w: ByteWrite<'_>, fill: &mut Fill<'_>) -> Landed
    where
        Self::Kv: WireWords,
    {
        // The payload arrives while this runs: the pages must be the live record's
        // when the bytes start landing and still when they are in.
        let dst = w.dst.to_vec();
        self.admit(&dst, "a byte landing");
        let landed = self.inner.land_bytes(w, fill);
        self.admit(&dst, "a byte landing");
        landed
    }
    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        self.inner.page_tag(page)
    }
    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        self.inner.check_tags(pages, room)
    }
    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        self.inner.attend(pages, seq_len, query_pos)
    }
    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        self.inner.token_at(pages, pos)
    }
    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        self.inner.zero_page(page)
    }
}
