//! A prefill node's side: the book of its receivers' registered memory, each KV write
//! posted as one NIXL WRITE with a notification, and the thread that polls the
//! transfers' state for their completions.

use super::agent::{make, Dram};
use crate::kvpath::{Carry, KvPath, NixlMeta, RemoteBook};
use crate::node::event::NodeEvent;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::mpsc::Sender;
use crate::sync::thread;
use crate::sync::{Arc, Mutex};
use kvsim_engine::gpu::layout::{encode_tag, TAG_WORDS};
use kvsim_engine::gpu::{HostMemory, Region, WireWords, WriteTag};
use kvsim_engine::ids::{NodeId, PageTag, RoomKey, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use nixl_sys::{Agent, MemType, OptArgs, RegistrationHandle, XferDescList, XferOp};
use nixl_sys::{XferRequest, XferStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the completion poller sleeps when no transfer finished.
const IDLE_POLL: Duration = Duration::from_micros(50);
/// Most page lists the book keeps bound (the oldest room's binding goes first).
const MOST_ROOMS: usize = 1 << 16;

/// What a notification says, as JSON text (NIXL notifications are byte strings the
/// receiver pulls, tagged with the sender's agent name).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Note {
    /// The write `id` of `from` placed its pages' bytes and tags at `dst`.
    Landed {
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
    },
    /// A message of `from` that says writes completed, ordered behind them.
    Msg { from: NodeId, msg: Msg },
}

impl Note {
    pub(super) fn from(&self) -> NodeId {
        match self {
            Note::Landed { from, .. } | Note::Msg { from, .. } => *from,
        }
    }
}

/// A receiver's agent and memory, as its metadata named them.
#[derive(Clone, Debug)]
struct Remote {
    node: NodeId,
    agent: String,
    memory: HostMemory,
}

/// A staging buffer registered with the writer's agent over its whole capacity (it
/// never grows, so its address holds), reused from write to write: registering
/// memory per write cost more than the copy.
struct Staging {
    buf: Vec<u8>,
    _reg: RegistrationHandle,
}

/// Most spare staging buffers a writer keeps.
const MOST_SPARE: usize = 64;

/// One write in flight: its transfer, and the staged bytes it reads from.
struct Posted {
    to: NodeId,
    id: WriteId,
    dst: Vec<PageTag>,
    req: XferRequest,
    staging: Staging,
}

#[derive(Default)]
struct Book {
    /// Each decode node's latest metadata.
    remotes: BTreeMap<NodeId, Remote>,
    /// The metadata each room's page list came after, in binding order.
    rooms: BTreeMap<RoomKey, (u64, Remote)>,
    bound: u64,
}

/// A prefill node's NIXL agent, its book of receivers, and its writes in flight.
pub struct NixlWriter {
    node: NodeId,
    agent: Agent,
    book: Mutex<Book>,
    posted: Mutex<Vec<Posted>>,
    spare: Mutex<Vec<Staging>>,
}

impl NixlWriter {
    /// A writer for prefill node `node`, its completions polled into `to_loop` until
    /// `stop`.
    pub fn start<K: Send + 'static>(
        node: NodeId,
        to_loop: Sender<NodeEvent<K>>,
        stop: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, String> {
        let name = format!("kvsim-{node}-p{}", std::process::id());
        let w = Arc::new(NixlWriter {
            node,
            agent: make(&name, false)?,
            book: Mutex::new(Book::default()),
            posted: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
        });
        let poll = w.clone();
        thread::Builder::new()
            .name(format!("{node}-nixl-poll"))
            .spawn(move || poll.poll(&to_loop, &stop))
            .map_err(|e| format!("nixl: the completion thread: {e}"))?;
        Ok(w)
    }

    fn lock_book(&self) -> crate::sync::MutexGuard<'_, Book> {
        self.book.lock().expect("nixl book poisoned")
    }

    /// The receiver `to`'s memory that `room`'s page list named.
    fn remote(&self, to: NodeId, room: RoomKey) -> Option<Remote> {
        let book = self.lock_book();
        book.rooms
            .get(&room)
            .map(|(_, r)| r.clone())
            .filter(|r| r.node == to)
    }

    /// Post `w` to `to` as one WRITE with its notification.
    fn post<K: WireWords>(&self, to: NodeId, w: &KvWrite<K>) -> Result<(), String> {
        let remote = self
            .remote(to, w.id.room)
            .ok_or_else(|| format!("no NIXL metadata of {to} for room {}", w.id.room))?;
        let mut staging = self.staging(staged_len(w))?;
        let (local, far) = stage(w, &remote.memory, &mut staging.buf)?;
        let mut l = XferDescList::new(MemType::Dram).map_err(|e| e.to_string())?;
        let mut r = XferDescList::new(MemType::Dram).map_err(|e| e.to_string())?;
        for (a, b) in local.iter().zip(&far) {
            l.add_desc(a.addr as usize, a.len as usize, 0);
            r.add_desc(b.addr as usize, b.len as usize, 0);
        }
        let note = Note::Landed {
            from: self.node,
            id: w.id,
            dst: w.dst.clone(),
        };
        let mut args = OptArgs::new().map_err(|e| e.to_string())?;
        let text = serde_json::to_vec(&note).map_err(|e| e.to_string())?;
        args.set_has_notification(true).map_err(|e| e.to_string())?;
        args.set_notification_message(&text)
            .map_err(|e| e.to_string())?;
        let req = self
            .agent
            .create_xfer_req(XferOp::Write, &l, &r, &remote.agent, Some(&args))
            .map_err(|e| format!("the transfer request: {e}"))?;
        self.agent
            .post_xfer_req(&req, None)
            .map_err(|e| format!("posting the transfer: {e}"))?;
        let p = Posted {
            to,
            id: w.id,
            dst: w.dst.clone(),
            req,
            staging,
        };
        self.posted.lock().expect("nixl posted poisoned").push(p);
        Ok(())
    }

    /// A registered staging buffer of at least `len` bytes: a spare one, or a new one.
    fn staging(&self, len: usize) -> Result<Staging, String> {
        let mut spare = self.spare.lock().expect("nixl spare poisoned");
        if let Some(i) = spare.iter().position(|s| s.buf.capacity() >= len) {
            return Ok(spare.swap_remove(i));
        }
        drop(spare);
        let buf = Vec::with_capacity(len.next_power_of_two());
        let region = Region {
            addr: buf.as_ptr() as u64,
            len: buf.capacity() as u64,
        };
        let reg = self
            .agent
            .register_memory(&Dram(region), None)
            .map_err(|e| format!("registering a staging buffer: {e}"))?;
        Ok(Staging { buf, _reg: reg })
    }

    /// A finished transfer's staging buffer, kept for the next write.
    fn give_back(&self, staging: Staging) {
        let mut spare = self.spare.lock().expect("nixl spare poisoned");
        if spare.len() < MOST_SPARE {
            spare.push(staging);
        }
    }

    /// Send `msg` to `to`'s agent as a notification, behind the room's writes.
    fn notify(&self, to: NodeId, room: RoomKey, msg: Msg) -> Result<(), Msg> {
        let Some(remote) = self.remote(to, room) else {
            return Err(msg);
        };
        let note = Note::Msg {
            from: self.node,
            msg,
        };
        let sent = serde_json::to_vec(&note)
            .ok()
            .map(|text| self.agent.send_notification(&remote.agent, &text, None));
        match (sent, note) {
            (Some(Ok(())), _) => Ok(()),
            (_, Note::Msg { msg, .. }) => Err(msg),
            (_, Note::Landed { .. }) => unreachable!("built as a message"),
        }
    }

    /// Poll every transfer in flight until `stop` or the loop is gone: a finished one
    /// lands and completes its write ([`NodeEvent::TransferDone`]), a failed one fails
    /// it back.
    fn poll<K>(&self, to_loop: &Sender<NodeEvent<K>>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let mut ended = Vec::new();
            {
                let mut posted = self.posted.lock().expect("nixl posted poisoned");
                let mut i = 0;
                while i < posted.len() {
                    match self.agent.get_xfer_status(&posted[i].req) {
                        Ok(XferStatus::InProgress) => i += 1,
                        state => ended.push((posted.swap_remove(i), state.is_ok())),
                    }
                }
            }
            if ended.is_empty() {
                thread::sleep(IDLE_POLL);
                continue;
            }
            for (p, ok) in ended {
                self.give_back(p.staging);
                let ev = match ok {
                    true => NodeEvent::TransferDone {
                        to: p.to,
                        id: p.id,
                        dst: p.dst,
                    },
                    false => NodeEvent::TransferFailed { to: p.to, id: p.id },
                };
                if to_loop.send(ev).is_err() {
                    return;
                }
            }
        }
    }
}

/// The bytes [`stage`] writes for `w`.
fn staged_len<K: WireWords>(w: &KvWrite<K>) -> usize {
    let words: usize = w.kv.iter().map(|p| p.wire_words().len()).sum();
    words * 4 + w.dst.len() * TAG_WORDS * 8
}

/// Each span of a write's staged bytes, with the remote span it goes to.
type Spans = (Vec<Region>, Vec<Region>);

/// Stage `w` into `out` (emptied; its capacity holds [`staged_len`], so it does not
/// move): each page's payload, then each page's tag words as its writer means them.
/// The pairs of descriptors (staged, remote) that carry them; `Err` for a destination
/// outside the receiver's pool.
fn stage<K: WireWords>(
    w: &KvWrite<K>,
    memory: &HostMemory,
    out: &mut Vec<u8>,
) -> Result<Spans, String> {
    assert!(
        out.capacity() >= staged_len(w),
        "a staging buffer never grows"
    );
    out.clear();
    let (mut spans, mut far) = (Vec::new(), Vec::new());
    for (t, kv) in w.dst.iter().zip(&w.kv) {
        let page = memory
            .page(t.page)
            .ok_or_else(|| format!("{t} is outside the receiver's pool"))?;
        let words = kv.wire_words();
        spans.push((out.len(), words.len() * 4));
        far.push(Region {
            addr: page.addr,
            len: words.len() as u64 * 4,
        });
        out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    }
    for t in &w.dst {
        let tag = memory
            .tag(t.page)
            .ok_or_else(|| format!("{t} is outside the receiver's pool"))?;
        let words = encode_tag(Some(WriteTag {
            room: w.id.room,
            gen: t.gen,
        }));
        spans.push((out.len(), tag.len as usize));
        far.push(tag);
        out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    }
    let base = out.as_ptr() as u64;
    let local = spans
        .into_iter()
        .map(|(at, len)| Region {
            addr: base + at as u64,
            len: len as u64,
        })
        .collect();
    Ok((local, far))
}

impl RemoteBook for NixlWriter {
    fn meta(&self, meta: NixlMeta) {
        if let Err(e) = self.agent.load_remote_md(&meta.md) {
            eprintln!(
                "kvsim serve: nixl: {}'s metadata does not load: {e}",
                meta.node
            );
            return;
        }
        let remote = Remote {
            node: meta.node,
            agent: meta.agent,
            memory: meta.memory,
        };
        self.lock_book().remotes.insert(meta.node, remote);
    }

    fn page_list(&self, from: NodeId, room: RoomKey) {
        let mut book = self.lock_book();
        let Some(remote) = book.remotes.get(&from).cloned() else {
            return;
        };
        book.bound += 1;
        let at = book.bound;
        book.rooms.insert(room, (at, remote));
        if book.rooms.len() > MOST_ROOMS {
            let oldest = book
                .rooms
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                book.rooms.remove(&k);
            }
        }
    }
}

impl<K: WireWords + Send> KvPath<K> for NixlWriter {
    fn carry(&self, to: NodeId, msg: Carried<K>) -> Carry<K> {
        match msg {
            Carried::Write(w) => match self.post(to, &w) {
                Ok(()) => Carry::Taken,
                Err(why) => {
                    eprintln!("kvsim serve: nixl: write {} to {to}: {why}", w.id);
                    Carry::Undeliverable(Carried::Write(w))
                }
            },
            Carried::Msg(m @ (Msg::KvDone { .. } | Msg::DrainAck { .. })) => {
                let room = m.room().expect("KvDone and DrainAck name their room");
                match self.notify(to, room, m) {
                    Ok(()) => Carry::Taken,
                    Err(m) => Carry::NotMine(Carried::Msg(m)),
                }
            }
            other => Carry::NotMine(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::{Generation, PageId};

    fn tag(page: u32, gen: u64) -> PageTag {
        PageTag {
            page: PageId(page),
            gen: Generation(gen),
        }
    }

    fn memory() -> HostMemory {
        let mut gpu = kvsim_engine::gpu::HostGpu::new(4, 2);
        kvsim_engine::gpu::Gpu::host_memory(&mut gpu).expect("host memory")
    }

    fn write(dst: Vec<PageTag>, kv: Vec<Vec<u32>>) -> KvWrite<Vec<u32>> {
        let id = WriteId {
            writer: NodeId(1),
            epoch: 0,
            room: RoomKey::new(3, 1),
            chunk: 0,
        };
        KvWrite {
            id,
            src: Vec::new(),
            dst,
            kv,
        }
    }

    /// A write stages each payload, then each page's tag words as its writer means
    /// them (room use and page generation), and each staged span goes to that page's
    /// floats or tag in the receiver's memory, length for length.
    #[test]
    fn a_write_stages_its_payloads_then_its_tags() {
        let m = memory();
        let tags = [tag(1, 1), tag(3, 2)];
        let w = write(tags.to_vec(), vec![vec![7, 8], vec![9]]);
        let mut staged = Vec::with_capacity(staged_len(&w));
        let (local, far) = stage(&w, &m, &mut staged).unwrap();
        assert_eq!(local.len(), 4);
        assert_eq!(
            far[0],
            Region {
                addr: m.page(PageId(1)).unwrap().addr,
                len: 8
            }
        );
        assert_eq!(
            far[1],
            Region {
                addr: m.page(PageId(3)).unwrap().addr,
                len: 4
            }
        );
        assert_eq!(far[2], m.tag(PageId(1)).unwrap());
        assert_eq!(far[3], m.tag(PageId(3)).unwrap());
        let words: Vec<u32> = staged[..12]
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(words, vec![7, 8, 9]);
        let tag = encode_tag(Some(WriteTag {
            room: w.id.room,
            gen: tags[1].gen,
        }));
        let at = 12 + TAG_WORDS * 8;
        let got: Vec<u64> = staged[at..at + TAG_WORDS * 8]
            .chunks(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, tag.to_vec());
        for (l, f) in local.iter().zip(&far) {
            assert_eq!(l.len, f.len);
        }
    }

    /// A destination outside the receiver's pool is refused before anything is posted.
    #[test]
    fn a_page_outside_the_pool_is_refused() {
        let w = write(vec![tag(5, 1)], vec![vec![1]]);
        let mut out = Vec::with_capacity(staged_len(&w));
        assert!(stage(&w, &memory(), &mut out)
            .unwrap_err()
            .contains("outside"));
    }
}
