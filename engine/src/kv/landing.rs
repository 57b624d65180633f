//! Landing a KV write at its destination: the one function every driver calls.
//!
//! On real hardware a KV write reaches decode's memory without decode's scheduler:
//! the NIC writes it. In the engine that is [`land`]: the gate (defense 4's check at
//! landing, against the node's one ownership record) and the memory write, nothing
//! else. The simulator, the model checker and the hand-stepped driver reach it through
//! `world::receive` (a delivered KV write, by the transport's row); the hardware
//! runtime calls it on the node's transfer thread, with the node's [`SharedPool`] as
//! the gate, concurrently with the node's loop, and hands the result to the node as an
//! input (`Input::Landed`, through `DecodeNode::handle` and its peer check), which
//! traces it and completes the write.
//!
//! The rule (the same for both records): a write of room use `room` lands in `dst`
//! only when every destination tag is current (same generation), the page belongs to
//! `room`, and the page is owned or quarantined, but not `Ready`: once decode accepted
//! the room's transfer every write of it has landed (the writer reports the transfer
//! only after its last completion), and decode appends its own KV to the last page, so
//! a remote write arriving then (a stale duplicate of one that landed, a data fault of
//! the world) would overwrite it. Quarantine accepts its room's writes:
//! it is the state that exists because those writes may still land, and it ends only
//! on the writer's drain ack, after the last completion (docs/DECISIONS.md, "Writes
//! into quarantined pages"). The gate exists only on a two-sided transport with
//! `landing_gate` on (`EngineConfig::landing_gated`); otherwise (one-sided RDMA, the default)
//! a write lands wherever it points inside the registered pool, as RDMA WRITE does.

use super::pool::PagePool;
use super::shared::{SharedError, SharedPool, WriteGuard};
use crate::gpu::Gpu;
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};

/// Why a write did not land: the first destination refused and the reason, in the
/// words the trace's `KvRefused` event carries.
#[derive(
    Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Refusal {
    pub tag: Option<PageTag>,
    pub reason: String,
}

/// A record that can admit a KV write into one page. The guard keeps the page from
/// being freed or handed out again until the write is applied and the guard dropped.
pub trait WriteGate {
    type Guard<'a>
    where
        Self: 'a;

    /// Admit a write of `room` into `tag`, or say why not.
    fn admit(&self, room: RoomKey, tag: PageTag) -> Result<Self::Guard<'_>, String>;
}

impl WriteGate for PagePool {
    type Guard<'a> = ();

    fn admit(&self, room: RoomKey, t: PageTag) -> Result<(), String> {
        match self.record(t.page) {
            None => Err("not a pool page".into()),
            Some(r) if r.gen != t.gen => Err(format!("stale generation (page is at {})", r.gen)),
            Some(r) if r.owner != Some(room) => Err(format!("owned by {:?}", r.owner)),
            Some(r) if !r.state.takes_remote_writes() => Err(format!("page is {}", r.state)),
            Some(_) => Ok(()),
        }
    }
}

impl WriteGate for SharedPool {
    type Guard<'a> = WriteGuard<'a>;

    /// One atomic step takes the hold when the generation is current and the state
    /// admits a write; the owner is then checked under the book. Refusals are worded
    /// as [`PagePool`]'s gate words them, in the same order of checks.
    fn admit(&self, room: RoomKey, t: PageTag) -> Result<WriteGuard<'_>, String> {
        match self.begin_landing_for(room, t) {
            Ok(g) => Ok(g),
            Err(SharedError::OutOfRange { .. }) => Err("not a pool page".into()),
            Err(SharedError::StaleTag { current, .. }) => {
                Err(format!("stale generation (page is at {current})"))
            }
            Err(SharedError::NotOwner { owner, .. }) => Err(format!("owned by {owner:?}")),
            Err(SharedError::NotWritable { state, .. }) => {
                // A page that is neither owned nor quarantined has no owner, unless it
                // is another room's: report the owner first, as the pool does.
                match self.record(t.page).and_then(|r| r.owner) {
                    Some(o) if o != room => Err(format!("owned by {:?}", Some(o))),
                    None => Err(format!("owned by {:?}", None::<RoomKey>)),
                    _ => Err(format!("page is {state}")),
                }
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The peer rule of a KV write's receiver: the write's id names its sender as the
/// writer, and a room whose prefill node the receiver knows (`room_prefill`) is
/// written only by that node. For a room it does not know there is no recorded peer:
/// the write is judged by the page tags alone. Asked before a receiver's copy lands
/// anything (`world::copy_in`) and by the decode node at the landing.
pub fn writer_rule(from: NodeId, id: WriteId, room_prefill: Option<NodeId>) -> Result<(), String> {
    if id.writer != from {
        return Err(format!("the write {id} names another writer"));
    }
    match room_prefill {
        Some(p) if p != from => Err(format!("{}'s prefill node is {p}", id.room)),
        _ => Ok(()),
    }
}

/// Land one KV write of `room` (the chunk `kv`, one page each, into `dst`) in `gpu`,
/// gated by `gate` when `check_tags` (defense 4). All or nothing: a refused page
/// refuses the whole chunk, and nothing of it is written.
pub fn land<W: WriteGate + ?Sized, G: Gpu>(
    gate: &W,
    gpu: &mut G,
    check_tags: bool,
    room: RoomKey,
    dst: &[PageTag],
    kv: &[G::Kv],
) -> Result<(), Refusal> {
    land_with(gate, gpu, check_tags, room, dst, kv.len(), |gpu| {
        for (t, page) in dst.iter().zip(kv) {
            // Every page was checked to be a pool page, so the range check cannot
            // refuse; a device that fails refuses the write (its writer's completion
            // says so, and the room's transfer fails), whatever part of it was applied.
            gpu.write_page(*t, room, page).map_err(|e| Refusal {
                tag: Some(*t),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    })?
}

/// The landing rule of a write of `room` carrying `payloads` page payloads into `dst`,
/// then the memory write: `write` runs only once the rule admitted every destination,
/// with every page held until it returns, and its result is the landing's. The rule:
/// one payload per page, every page inside the registered memory (the NIC's check,
/// defenses or not), and when `check_tags`, each page admitted by `gate` (defense 4).
/// [`land`] writes payloads it holds; a byte transport reads the payload into the
/// pages inside `write` (`Gpu::land_bytes`), so a refused write's bytes never reach them.
pub fn land_with<W: WriteGate + ?Sized, G: Gpu, T>(
    gate: &W,
    gpu: &mut G,
    check_tags: bool,
    room: RoomKey,
    dst: &[PageTag],
    payloads: usize,
    write: impl FnOnce(&mut G) -> T,
) -> Result<T, Refusal> {
    if dst.len() != payloads {
        return Err(Refusal {
            tag: dst.first().copied(),
            reason: "payload and page list differ in length".into(),
        });
    }
    // The NIC refuses an address outside the registered memory, defenses or not.
    let pool = gpu.pages();
    if let Some(t) = dst
        .iter()
        .find(|t| crate::gpu::layout::check_page_write(pool, t.page.0).is_err())
    {
        return Err(Refusal {
            tag: Some(*t),
            reason: "not a pool page".into(),
        });
    }
    let mut guards = Vec::new();
    if check_tags {
        guards.reserve(dst.len());
        for &t in dst {
            match gate.admit(room, t) {
                Ok(g) => guards.push(g),
                Err(reason) => {
                    return Err(Refusal {
                        tag: Some(t),
                        reason,
                    })
                }
            }
        }
    }
    let written = write(gpu);
    assert!(
        !check_tags || guards.len() == dst.len(),
        "every page held while written"
    );
    drop(guards);
    Ok(written)
}
