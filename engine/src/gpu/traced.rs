//! The device operations a node makes and states as trace events: a KV write
//! ([`write_traced`], [`trace_write`]), a device failure as a fault ([`device_fault`]),
//! and zero-on-free ([`zero_pages`], [`zero_on_free`], defense 7). The backends
//! themselves trace nothing.

use crate::counters::Counters;
use crate::gpu::errors::{DeviceError, WriteError};
use crate::gpu::seam::Gpu;
use crate::ids::{NodeId, PageId, PageTag, RoomKey, Token};
use crate::trace::{NodeFault, Trace, TraceEvent};

/// Write the KV of `tokens` at sequence positions `start..` of `pages` for `room` and
/// state it as a [`TraceEvent::KvWritten`] naming only the pages it touched (offsets
/// renumbered from the first of them, the sequence position `start` kept as `pos`). Every KV write a node makes goes through here.
/// A write the backend refuses (past the page list, outside the pool) is stated as a
/// [`NodeFault::WriteRefused`], a device failure as a [`NodeFault::DeviceFailed`], and
/// returned: the caller fails the request.
#[allow(clippy::too_many_arguments)]
pub fn write_traced<G: Gpu, E: Trace>(
    gpu: &mut G,
    env: &mut E,
    node: NodeId,
    pages: &[PageTag],
    start: u64,
    tokens: &[Token],
    room: RoomKey,
) -> Result<(), WriteError> {
    let written = gpu.write_tokens(pages, start, tokens, room);
    trace_write(
        env,
        (node, room),
        (pages, start),
        tokens,
        gpu.page_size(),
        written,
    )
}

/// State what became of a KV write of `tokens` at positions `start..` of `pages` by
/// `node` for `room` (`written`: the backend's answer, on a device of `page_size`
/// slots a page), as [`write_traced`] does; the write itself ran elsewhere (a
/// [`crate::compute::Job`] on the device).
pub fn trace_write<E: Trace>(
    env: &mut E,
    (node, room): (NodeId, RoomKey),
    (pages, start): (&[PageTag], u64),
    tokens: &[Token],
    page_size: u32,
    written: Result<(), WriteError>,
) -> Result<(), WriteError> {
    if let Err(e) = written {
        let fault = match &e {
            WriteError::Refused(r) => NodeFault::WriteRefused {
                room,
                error: r.to_string(),
            },
            WriteError::Device(d) => device_fault(Some(room), d),
        };
        env.trace(TraceEvent::Fault { node, fault });
        return Err(e);
    }
    if tokens.is_empty() {
        return Ok(());
    }
    // In range: the backend refused anything else.
    let ps = u64::from(page_size);
    let first = (start / ps) as usize;
    let last = ((start + tokens.len() as u64 - 1) / ps) as usize;
    assert!(last < pages.len(), "the backend wrote inside the page list");
    env.trace(TraceEvent::KvWritten {
        node,
        room,
        pages: pages[first..=last].to_vec(),
        start: start - first as u64 * ps,
        tokens: tokens.len() as u64,
        pos: Some(start),
    });
    Ok(())
}

/// The fault a node states when its device failed serving `room` (`None`: the
/// operation served no one request, such as zeroing a freed page).
pub fn device_fault(room: Option<RoomKey>, e: &DeviceError) -> NodeFault {
    NodeFault::DeviceFailed {
        room,
        op: e.op.to_string(),
        error: e.detail.clone(),
    }
}

/// Zero freed `pages` (defense 7, zero-on-free) and return the ones zeroed, in order.
/// A page the device failed to zero is left out (its contents are unknown, so no
/// `PagesZeroed` may claim it) and its error handed to `failed`; the rest go on.
pub fn zero_pages<G: Gpu>(
    gpu: &mut G,
    pages: &[PageId],
    failed: &mut impl FnMut(DeviceError),
) -> Vec<PageId> {
    let mut zeroed = Vec::with_capacity(pages.len());
    for &p in pages {
        match gpu.zero_page(p) {
            Ok(()) => zeroed.push(p),
            Err(e) => failed(e),
        }
    }
    assert!(zeroed.len() <= pages.len());
    zeroed
}

/// Defense 7, zero-on-free, after a release of `released`: zero those `is_free` says
/// are back on the free list, state each device failure as a fault through `counters`
/// (that page is left out: its contents are unknown), and state the pages zeroed as one
/// `PagesZeroed`.
pub fn zero_on_free<G: Gpu, E: Trace>(
    gpu: &mut G,
    env: &mut E,
    (node, counters): (NodeId, &mut Counters),
    released: &[PageTag],
    is_free: impl Fn(PageId) -> bool,
) {
    let freed: Vec<PageId> = released
        .iter()
        .map(|t| t.page)
        .filter(|&p| is_free(p))
        .collect();
    let zeroed = zero_pages(gpu, &freed, &mut |e| {
        counters.fault(env, node, device_fault(None, &e))
    });
    assert!(freed.len() <= released.len());
    // O(zeroed x freed) per release: debug only.
    debug_assert!(
        zeroed.iter().all(|p| freed.contains(p)),
        "only freed pages are zeroed"
    );
    if !zeroed.is_empty() {
        env.trace(TraceEvent::PagesZeroed {
            node,
            pages: zeroed,
        });
    }
}
