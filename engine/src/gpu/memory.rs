//! [`HostMemory`]: where a host backend's pages and page tags live, as a transport
//! that registers memory with a NIC-like library (NIXL) needs them: two regions and
//! the layout that places each page's floats and each page's tag words in them. The
//! addresses are the backend's own (its buffers never move once made); this module
//! reads no memory and computes only offsets ([`layout`]'s, the ones the backend and
//! the CUDA kernels use).

use crate::gpu::layout::{self, TAG_WORDS};
use crate::ids::PageId;

/// One registered region: its first byte's address and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
}

/// A host backend's KV memory: the pages' floats and the page tags' words, each one
/// region, and the layout in them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostMemory {
    /// Every page's slots, `f32` each (page 0 is the null page, never handed out).
    pub data: Region,
    /// Every page's tag, [`TAG_WORDS`] `u64` words each.
    pub tags: Region,
    pub pages: u32,
    pub page_size: u32,
    pub key_width: usize,
}

impl HostMemory {
    /// The address of `page`'s first float and the page's length in bytes, or `None`
    /// for a page outside the pool.
    pub fn page(&self, page: PageId) -> Option<Region> {
        if page.0 > self.pages {
            return None;
        }
        let floats = layout::page_slot_offset(page.0, 0, self.page_size, self.key_width);
        Some(Region {
            addr: self.data.addr + floats as u64 * 4,
            len: layout::page_floats(self.page_size, self.key_width) as u64 * 4,
        })
    }

    /// The address of `page`'s tag words and their length in bytes, or `None` for a
    /// page outside the pool.
    pub fn tag(&self, page: PageId) -> Option<Region> {
        if page.0 > self.pages {
            return None;
        }
        let bytes = (TAG_WORDS * 8) as u64;
        Some(Region {
            addr: self.tags.addr + u64::from(page.0) * bytes,
            len: bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page's floats and tag lie inside their region, one after another.
    #[test]
    fn pages_and_tags_tile_their_regions() {
        let m = HostMemory {
            data: Region { addr: 4096, len: 0 },
            tags: Region { addr: 8192, len: 0 },
            pages: 3,
            page_size: 4,
            key_width: 4,
        };
        let (p1, p2) = (m.page(PageId(1)).unwrap(), m.page(PageId(2)).unwrap());
        assert_eq!(p1.addr + p1.len, p2.addr);
        assert_eq!(m.tag(PageId(2)).unwrap().addr, 8192 + 2 * 24);
        assert!(m.page(PageId(4)).is_none() && m.tag(PageId(4)).is_none());
    }
}
