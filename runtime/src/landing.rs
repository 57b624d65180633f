//! Where a decode node's KV writes land: off its connections ([`WireLanding`], what
//! `kvsim serve` runs) or off a channel ([`transfer_thread`], writes that arrive
//! whole), concurrently with the node's loop, never through it. This is the receiver's
//! copy of a two-sided transport (TCP: a thread takes each write off the wire), as
//! `world::receive` states it for every driver: the writer's peer rule and the landing
//! gate before any byte lands, then the landing handed to the node as
//! `Input::Landed`, which traces it and completes the write.
//!
//! Both judge a write the same way, by the engine's functions: [`world::write_arrival`]
//! against the node's current incarnation ([`LandingRecord`]), then the receiver's
//! copy, [`world::copy_in`] (the one definition `world::receive` lands a two-sided
//! write by: the writer's peer rule, then the landing rule,
//! [`kvsim_engine::kv::land_with`]), gated by the node's one ownership record (the
//! [`SharedPool`] its loop decides with); both report the landing to the loop, where
//! the node traces it and completes the write. What differs is only
//! where the payload comes from: a write's pages ([`land`]), or the bytes that follow
//! a KV head on the connection, read straight into the destination pages' memory
//! ([`Gpu::land_bytes`]) once the rule admitted the write, and into a scratch buffer
//! when it did not.

use crate::gpu::SharedGpu;
use crate::net::{Incoming, Lander};
use crate::node::event::NodeEvent;
use crate::sync::mpsc::{Receiver, Sender};
use crate::sync::{Arc, RwLock, RwLockReadGuard};
use crate::wire::{read_payload, skip_payload, FrameReader, KvHead, WireError};
use kvsim_engine::gpu::{ByteWrite, Gpu, LandBytesError, WireWords};
use kvsim_engine::ids::NodeId;
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::kv::{land, land_with, Refusal};
use kvsim_engine::msg::KvWrite;
use kvsim_engine::world::{self, Arrival, Arriving, KvTransport};
use std::io::Read;
use std::time::Instant;

/// The record a decode node's transfer thread lands writes with: the [`SharedPool`] of
/// the node's current incarnation, replaced when the node restarts in process. A
/// landing holds it from the arrival rule to the memory write, so a restart waits for
/// the landing in progress, and every later write is judged by the new incarnation's
/// record and epoch.
#[derive(Debug)]
pub struct LandingRecord {
    current: RwLock<Arc<SharedPool>>,
    /// The planted race of the schedule test (`--cfg shuttle` only): a landing lets go
    /// of the record as soon as it took it.
    #[cfg(shuttle)]
    planted: bool,
}

/// The current incarnation's record, as a landing holds it: a restart waits until it
/// goes.
pub struct Current<'a>(Held<'a>);

enum Held<'a> {
    Guard(RwLockReadGuard<'a, Arc<SharedPool>>),
    /// The planted race: the record, its guard already dropped.
    #[cfg(shuttle)]
    Dropped(Arc<SharedPool>),
}

impl std::ops::Deref for Current<'_> {
    type Target = Arc<SharedPool>;

    fn deref(&self) -> &Arc<SharedPool> {
        match &self.0 {
            Held::Guard(g) => g,
            #[cfg(shuttle)]
            Held::Dropped(pool) => pool,
        }
    }
}

impl LandingRecord {
    pub fn new(pool: Arc<SharedPool>) -> Arc<Self> {
        Arc::new(LandingRecord {
            current: RwLock::new(pool),
            #[cfg(shuttle)]
            planted: false,
        })
    }

    /// A record whose landings drop their guard as soon as they take it (the schedule
    /// test's planted race, `tests/schedules.rs`): a restart then need not wait for a
    /// landing in progress, which goes on writing the dead incarnation's pages into
    /// memory the new incarnation owns.
    #[cfg(shuttle)]
    pub fn with_planted_race(pool: Arc<SharedPool>) -> Arc<Self> {
        Arc::new(LandingRecord {
            current: RwLock::new(pool),
            planted: true,
        })
    }

    /// The current incarnation's record, held until the guard goes.
    pub fn current(&self) -> Current<'_> {
        // Nothing panics while holding it but a landing on a broken record, after
        // which no landing may go on.
        let guard = self
            .current
            .read()
            .expect("landing record poisoned: a landing panicked");
        #[cfg(shuttle)]
        if self.planted {
            return Current(Held::Dropped(Arc::clone(&guard)));
        }
        Current(Held::Guard(guard))
    }

    /// The node restarted with `pool`: waits for the landing in progress.
    pub(crate) fn replace(&self, pool: Arc<SharedPool>) {
        let mut cur = self
            .current
            .write()
            .expect("landing record poisoned: a landing panicked");
        assert!(
            pool.epoch() > cur.epoch(),
            "a restarted incarnation's record has a higher epoch"
        );
        *cur = pool;
    }
}

/// The decode node's transfer thread: every KV write that arrives for this node is
/// judged by the world's arrival rule against the current incarnation (a tag of an
/// earlier incarnation fails; a write whose connection closed before it was taken is
/// flushed), then copied in by the world's one rule for a receiver's copy,
/// [`world::copy_in`] (the writer's peer rule, then the engine's [`land`] on that
/// incarnation's shared record and memory), and reported to the node's loop. The
/// thread does not know a room's prefill node: the node checks it at the landing.
pub fn transfer_thread<G: Gpu>(
    rx: Receiver<Incoming<G::Kv>>,
    record: Arc<LandingRecord>,
    mut gpu: SharedGpu<G>,
    page_tags: bool,
    to_loop: Sender<NodeEvent<G::Kv>>,
) {
    for (from, msg, conn_alive) in rx {
        // A write still queued when its connection closed is the dead sender's NIC
        // queue (or one its live sender fails back itself): never applied.
        let sender_alive = conn_alive.load(crate::sync::atomic::Ordering::Acquire);
        let pool = record.current();
        let ev = match arrive(from, msg, sender_alive, &pool) {
            Arrived::Deliver(KvWrite { id, dst, kv, .. }) => {
                let copied = world::copy_in(from, id, None, || {
                    land(&**pool, &mut gpu, page_tags, id.room, &dst, &kv)
                });
                NodeEvent::Landed {
                    from,
                    id,
                    dst,
                    landing: copied.and_then(|l| l),
                }
            }
            Arrived::Drop => continue,
            Arrived::Fail(ev) => ev,
        };
        drop(pool);
        if to_loop.send(ev).is_err() {
            return;
        }
    }
}

/// What the arrival rule made of a KV write.
enum Arrived<K> {
    /// Delivered: it lands.
    Deliver(KvWrite<K>),
    /// Failed on arrival: what the loop hears of it.
    Fail(NodeEvent<K>),
    /// Dropped: the loop hears nothing.
    Drop,
}

/// One KV write of `from`, judged by the world's arrival rule on `pool`'s incarnation.
fn arrive<K>(from: NodeId, msg: KvWrite<K>, sender_alive: bool, pool: &SharedPool) -> Arrived<K> {
    let at = Arriving {
        sender_alive,
        receiver_alive: true,
        receiver_restarted: false,
        receiver_epoch: pool.epoch(),
        partitioned: false,
        injected_failure: false,
        // This connection reader is the TCP transport's receiver copy.
        transport: KvTransport::TwoSided,
    };
    match world::write_arrival(&msg, &at) {
        Arrival::Fail { reason, completion } => Arrived::Fail(NodeEvent::WriteFailedHere {
            from,
            id: msg.id,
            reason,
            completion,
        }),
        Arrival::Drop(_) => Arrived::Drop,
        Arrival::Deliver => Arrived::Deliver(msg),
    }
}

/// A decode node's landing of the KV writes that arrive on its connections, run by
/// each connection's reader ([`crate::net`]): the write's head is judged as the
/// [`transfer_thread`] judges a message (its writer, the arrival rule, the landing
/// rule, on the current incarnation's record), then its payload is read from the
/// connection straight into the destination pages ([`Gpu::land_bytes`]) while the
/// rule's holds keep them, and the landing reported to the loop. A write that is
/// refused or fails on arrival has its payload read through the connection's scratch
/// buffer: none of its bytes reach the pages.
pub struct WireLanding<G: Gpu> {
    /// The node whose connections these are: a write it posted itself is its own
    /// RDMA READ's response (vLLM's pull), which its NIC places
    /// ([`world::is_read_response`]).
    pub node: NodeId,
    pub record: Arc<LandingRecord>,
    pub gpu: SharedGpu<G>,
    /// The landing gate (defense 4b).
    pub page_tags: bool,
    pub to_loop: Sender<NodeEvent<G::Kv>>,
}

impl<G> Lander<G::Kv> for WireLanding<G>
where
    G: Gpu + Send,
    G::Kv: WireWords,
{
    fn take(
        &self,
        head: KvHead,
        r: &mut FrameReader<dyn Read + '_>,
        scratch: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let KvHead {
            from,
            id,
            src,
            dst,
            words,
        } = head;
        if world::is_read_response(self.node, id) {
            // One-sided whatever the connection: no receiver copy, no peer rule, no
            // gate. The loop lands it by the world's rule (`world::receive`), which
            // completes the READ and notifies the source.
            let kv = read_payload(r, &words)?;
            let write = KvWrite { id, src, dst, kv };
            return Ok(self.to_loop.send(NodeEvent::Write { from, write }).is_ok());
        }
        let bytes = kvsim_engine::gpu::bytes::payload_bytes(&words);
        let pool = self.record.current();
        let msg = KvWrite {
            id,
            src,
            dst,
            kv: Vec::new(),
        };
        let ev = match arrive(from, msg, true, &pool) {
            Arrived::Deliver(KvWrite { id, dst, .. }) => {
                let copied = world::copy_in(from, id, None, || {
                    self.land_payload(&pool, id.room, &dst, &words, r, scratch)
                });
                let landing = match copied {
                    // Refused by the peer rule: none of its bytes were read.
                    Err(refusal) => Err((refusal, false)),
                    Ok(landed) => landed?,
                };
                if matches!(landing, Err((_, false))) {
                    skip_payload(r, bytes, scratch)?;
                }
                NodeEvent::Landed {
                    from,
                    id,
                    dst,
                    landing: landing.map_err(|(refusal, _)| refusal),
                }
            }
            Arrived::Drop => {
                skip_payload(r, bytes, scratch)?;
                return Ok(true);
            }
            Arrived::Fail(ev) => {
                skip_payload(r, bytes, scratch)?;
                ev
            }
        };
        drop(pool);
        Ok(self.to_loop.send(ev).is_ok())
    }
}

impl<G: Gpu> WireLanding<G>
where
    G::Kv: WireWords,
{
    /// The landing rule on `pool`, then the payload read from `r` into the pages.
    /// `Err`: the payload did not arrive (the connection cannot go on). `Ok(Err)`: the
    /// landing was refused, with `true` when the payload was already read (the backend
    /// refused it after it arrived), `false` when none of it was.
    fn land_payload(
        &self,
        pool: &SharedPool,
        room: kvsim_engine::ids::RoomKey,
        dst: &[kvsim_engine::ids::PageTag],
        words: &[u32],
        r: &mut FrameReader<dyn Read + '_>,
        scratch: &mut Vec<u8>,
    ) -> Result<Result<(), (Refusal, bool)>, WireError> {
        let deadline = Instant::now() + crate::net::STALL;
        let mut gpu = self.gpu.clone();
        let mut fill = |bufs: &mut [std::io::IoSliceMut<'_>]| r.read_payload_into(bufs, deadline);
        let landed = land_with(
            pool,
            &mut gpu,
            self.page_tags,
            room,
            dst,
            words.len(),
            |gpu| {
                let w = ByteWrite {
                    dst,
                    room,
                    words,
                    scratch,
                };
                gpu.land_bytes(w, &mut fill)
            },
        );
        match landed {
            Ok(Ok(())) => Ok(Ok(())),
            Ok(Err(LandBytesError::Payload(e))) => Err(e.into()),
            Ok(Err(LandBytesError::Write { tag, error })) => Ok(Err((
                Refusal {
                    tag: Some(tag),
                    reason: error.to_string(),
                },
                true,
            ))),
            Err(refusal) => Ok(Err((refusal, false))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::mpsc::channel;
    use crate::wire::{read_head, write_frame, Head};
    use kvsim_engine::gpu::HostGpu;
    use kvsim_engine::ids::{PageTag, RoomKey, WriteId};
    use kvsim_engine::msg::Carried;

    const PAGES: u32 = 4;
    const PAGE: u32 = 4;

    /// A decode node's landing on a fresh record and host memory, the pages it gave
    /// `room` (expecting its write), and the loop's end of the channel.
    fn landing(
        room: RoomKey,
        pages: usize,
    ) -> (
        WireLanding<HostGpu>,
        Vec<PageTag>,
        Receiver<NodeEvent<Vec<u32>>>,
    ) {
        let pool = Arc::new(SharedPool::new(PAGES, PAGE));
        let dst = pool.alloc(pages, room).unwrap();
        pool.expect_write(room, &dst).unwrap();
        let (to_loop, rx) = channel();
        let l = WireLanding {
            node: NodeId(2),
            record: LandingRecord::new(pool),
            gpu: SharedGpu::new(HostGpu::new(PAGES, PAGE)),
            page_tags: true,
            to_loop,
        };
        (l, dst, rx)
    }

    fn write(room: RoomKey, chunk: u32, dst: Vec<PageTag>, kv: Vec<Vec<u32>>) -> Carried<Vec<u32>> {
        let writer = NodeId(1);
        let id = WriteId {
            writer,
            epoch: 0,
            room,
            chunk,
        };
        let src = Vec::new();
        Carried::Write(KvWrite { id, src, dst, kv })
    }

    /// The frames of `msgs` from node 1, each taken by `l` off one stream: what each
    /// take returned.
    fn take_all(l: &WireLanding<HostGpu>, msgs: &[Carried<Vec<u32>>]) -> Vec<Result<bool, String>> {
        let mut bytes = Vec::new();
        for m in msgs {
            write_frame(&mut bytes, NodeId(1), m).unwrap();
        }
        let (mut r, mut buf, mut scratch) = (
            FrameReader::with_capacity(64, &bytes[..]),
            Vec::new(),
            Vec::new(),
        );
        let mut out = Vec::new();
        while let Ok(Some(Head::Kv(h))) = read_head(&mut r, &mut buf) {
            out.push(l.take(h, &mut r, &mut scratch).map_err(|e| e.to_string()));
        }
        out
    }

    fn landed(rx: &Receiver<NodeEvent<Vec<u32>>>) -> Vec<Result<(), Refusal>> {
        rx.try_iter()
            .filter_map(|ev| match ev {
                NodeEvent::Landed { landing, .. } => Some(landing),
                _ => None,
            })
            .collect()
    }

    /// A write the landing rule refuses (into a page another room use owns) has its
    /// payload read off the connection and dropped: none of its bytes reach the page,
    /// and the next write on the same connection lands whole.
    #[test]
    fn a_refused_writes_bytes_never_reach_the_pages() {
        let (room, other) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
        let (l, dst, rx) = landing(room, 2);
        let floats = l.gpu.read_page(dst[0].page).unwrap().len();
        let (poison, good) = (vec![0xdead_beef; floats], vec![0x3f80_0000; floats]);
        let msgs = [
            write(other, 0, vec![dst[0]], vec![poison]),
            write(room, 1, vec![dst[1]], vec![good.clone()]),
        ];
        assert_eq!(take_all(&l, &msgs), vec![Ok(true), Ok(true)]);
        let got = landed(&rx);
        assert_eq!(got.len(), 2, "both writes reported: {got:?}");
        let refusal = got[0].clone().unwrap_err();
        assert!(refusal.reason.starts_with("owned by"), "{refusal:?}");
        assert_eq!(got[1], Ok(()));
        let untouched = l.gpu.read_page(dst[0].page).unwrap();
        assert!(untouched.iter().all(|&w| w == 0), "refused bytes landed");
        assert_eq!(l.gpu.page_tag(dst[0].page).unwrap(), None);
        assert_eq!(l.gpu.read_page(dst[1].page).unwrap(), good);
    }

    /// The bytes a write lands from the connection are what `kv::land` lands from the
    /// message, page for page and tag for tag, whatever the payloads' shapes: whole
    /// pages, a torn page (its leading slots), a payload of no slot shape (not
    /// applied), and a page named twice (the last payload wins).
    #[test]
    fn bytes_land_as_the_message_lands() {
        let room = RoomKey::new(1, 1);
        let (l, dst, rx) = landing(room, 3);
        let floats = l.gpu.read_page(dst[0].page).unwrap().len();
        let page = |seed: u32| {
            (0..floats as u32)
                .map(|i| i * 7 + seed)
                .collect::<Vec<u32>>()
        };
        let mut torn = page(2);
        torn.truncate(floats / 2);
        let mut odd = page(3);
        odd.push(9);
        let msgs = [
            write(room, 0, dst[..2].to_vec(), vec![page(1), torn]),
            write(room, 1, vec![dst[2]], vec![odd]),
            write(room, 2, vec![dst[0], dst[0]], vec![page(4), page(5)]),
        ];
        assert_eq!(take_all(&l, &msgs), vec![Ok(true); 3]);
        assert_eq!(landed(&rx), vec![Ok(()); 3]);
        let (mut reference, pool) = (HostGpu::new(PAGES, PAGE), SharedPool::new(PAGES, PAGE));
        for m in &msgs {
            let Carried::Write(KvWrite { dst, kv, .. }) = m else {
                unreachable!()
            };
            land(&pool, &mut reference, false, room, dst, kv).unwrap();
        }
        for t in &dst {
            assert_eq!(l.gpu.read_page(t.page), reference.read_page(t.page), "{t}");
            assert_eq!(l.gpu.page_tag(t.page), reference.page_tag(t.page), "{t}");
        }
    }

    /// A write whose id names another writer than its sender lands nothing: the
    /// world's receiver copy ([`world::copy_in`]) refuses it by the peer rule before
    /// any byte is read into the pages, and the next write on the connection lands.
    #[test]
    fn a_write_naming_another_writer_lands_nothing() {
        let room = RoomKey::new(1, 1);
        let (l, dst, rx) = landing(room, 2);
        let floats = l.gpu.read_page(dst[0].page).unwrap().len();
        let mut forged = write(room, 0, vec![dst[0]], vec![vec![7; floats]]);
        if let Carried::Write(w) = &mut forged {
            w.id.writer = NodeId(5);
        }
        let good = write(room, 1, vec![dst[1]], vec![vec![9; floats]]);
        assert_eq!(take_all(&l, &[forged, good]), vec![Ok(true), Ok(true)]);
        let got = landed(&rx);
        let refusal = got[0].clone().unwrap_err();
        assert!(
            refusal.reason.contains("names another writer"),
            "{refusal:?}"
        );
        assert_eq!(got[1], Ok(()));
        assert!(l
            .gpu
            .read_page(dst[0].page)
            .unwrap()
            .iter()
            .all(|&w| w == 0));
        assert_eq!(l.gpu.read_page(dst[1].page).unwrap(), vec![9; floats]);
    }

    /// A connection that ends part way through a payload ends with an error naming
    /// it, and the loop hears nothing of the write (its writer fails it back).
    #[test]
    fn a_payload_cut_short_ends_the_connection() {
        let room = RoomKey::new(1, 1);
        let (l, dst, rx) = landing(room, 1);
        let floats = l.gpu.read_page(dst[0].page).unwrap().len();
        let mut bytes = Vec::new();
        write_frame(
            &mut bytes,
            NodeId(1),
            &write(room, 0, dst, vec![vec![1; floats]]),
        )
        .unwrap();
        bytes.truncate(bytes.len() - 3);
        let (mut r, mut buf, mut scratch) = (
            FrameReader::with_capacity(64, &bytes[..]),
            Vec::new(),
            Vec::new(),
        );
        let Ok(Some(Head::Kv(h))) = read_head(&mut r, &mut buf) else {
            panic!("the head reads whole");
        };
        let err = l.take(h, &mut r, &mut scratch).unwrap_err();
        assert!(
            err.to_string().contains("part way through a KV payload"),
            "{err}"
        );
        assert!(rx.try_recv().is_err(), "nothing reported");
    }
}
