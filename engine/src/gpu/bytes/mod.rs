//! A KV write's payload as a byte transport carries it, and its landing from those
//! bytes.
//!
//! On a byte transport (the runtime's TCP) a page's payload travels as its words, each
//! 4 bytes little-endian ([`WireWords`]). The receiver lands it with
//! [`crate::gpu::Gpu::land_bytes`], after the landing rule admitted the write
//! (`kv::landing::land_with`): the backend hands the transport the memory the bytes
//! go to, and the transport fills it. [`land_bytes_by_page`] is the general way (the
//! bytes into one buffer the caller keeps, then [`crate::gpu::Gpu::write_page`] per page);
//! a backend whose memory holds the words as they travel ([`crate::gpu::HostGpu`]) gives
//! the transport the destination pages' own memory instead, so the bytes are copied
//! once, from the socket into the pages.

pub(super) mod wire;

pub use crate::gpu::seam::land_bytes_by_page;
pub use wire::{payload_bytes, ByteWrite, Fill, LandBytesError, Landed, WireWords};
