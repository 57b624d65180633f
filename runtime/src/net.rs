//! TCP between nodes: one outgoing connection per peer, reconnected with backoff, and
//! a listener whose connections feed the node's loop (and a decode node's KV writes
//! to its transfer thread).
//!
//! Loss is what it is on real hardware: a message that cannot be written (no
//! connection, or the connection broke under it) is reported to the loop as
//! [`NodeEvent::SendFailed`], and a broken connection as [`NodeEvent::PeerLost`]; the loop applies
//! the engine's rule (lost, or a failed completion for a KV write).

use crate::gather::GatherWriter;
use crate::kvpath::RemoteBook;
use crate::node::event::NodeEvent;
use crate::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use crate::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use crate::sync::thread;
use crate::sync::Arc;
use crate::wire::{read_head, read_payload, write_frame_with, Head, KvHead};
use crate::wire::{FrameReader, WireError};
use kvsim_engine::gpu::WireWords;
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufRead, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The first wait before a reconnection, doubled per failure up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// The longest a connection's reader waits for the next bytes of a frame it has begun
/// (and between frames, for its stop flag), and the longest a KV payload may take to
/// arrive whole: a peer that stalls part way loses its connection, so it holds the
/// pages it is landing in (and the node's memory lock) at most this long.
pub const STALL: Duration = Duration::from_secs(2);
/// The reader's buffer ([`FrameReader`]): frames' heads come through it (one read
/// takes many small frames); of a KV payload only the bytes it had read ahead are
/// copied out of it, the rest is read straight into the pages.
const READ_BUF: usize = 64 << 10;

/// A KV write as the transfer thread takes it: its sender, the write, and whether
/// the connection it came on is still open.
pub type Incoming<K> = (NodeId, KvWrite<K>, Arc<AtomicBool>);

/// A decode node's landing of the KV writes that arrive on its connections
/// ([`crate::node::WireLanding`]).
pub trait Lander<K>: Send + Sync {
    /// Judge the write `head` and land its payload, which follows on `r`, reading all
    /// of it (into the destination pages when the write lands, else through
    /// `scratch`); tell the node's loop. `Ok(false)`: the loop is gone. An error ends
    /// the connection.
    fn take(
        &self,
        head: KvHead,
        r: &mut FrameReader<dyn Read + '_>,
        scratch: &mut Vec<u8>,
    ) -> Result<bool, WireError>;
}

/// Where a node's incoming messages go.
pub struct Inbound<K> {
    pub to_loop: Sender<NodeEvent<K>>,
    /// A decode node's landing: its KV writes land from the connection they arrive on,
    /// straight into the node's memory. Without one a KV write goes to the loop as a
    /// message.
    pub landing: Option<Arc<dyn Lander<K>>>,
    /// A writer's book of its receivers' NIXL memory (`--transport nixl`): fed the
    /// metadata frames and told of each page list, in the order they arrive.
    pub book: Option<Arc<dyn RemoteBook>>,
}

impl<K> Clone for Inbound<K> {
    fn clone(&self) -> Self {
        Inbound {
            to_loop: self.to_loop.clone(),
            landing: self.landing.clone(),
            book: self.book.clone(),
        }
    }
}

/// Accept connections on `listener` until `stop`; each connection's frames go to
/// `inbound`. A connection whose frame is unusable is closed with a message on stderr.
pub fn spawn_listener<K>(
    me: NodeId,
    listener: TcpListener,
    inbound: Inbound<K>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<()>>
where
    K: DeserializeOwned + WireWords + Send + 'static,
{
    listener.set_nonblocking(true)?;
    thread::Builder::new()
        .name(format!("{me}-listen"))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let inbound = inbound.clone();
                        let stop = stop.clone();
                        let _ = thread::Builder::new()
                            .name(format!("{me}-conn"))
                            .spawn(move || read_conn(me, stream, inbound, stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => {
                        eprintln!("kvsim serve: {me}: accept failed: {e}");
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
}

fn read_conn<K: DeserializeOwned + WireWords>(
    me: NodeId,
    stream: TcpStream,
    inbound: Inbound<K>,
    stop: Arc<AtomicBool>,
) {
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(STALL)).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut r = FrameReader::with_capacity(READ_BUF, stream);
    if let Err(e) = read_frames(&mut r, &inbound, &stop) {
        eprintln!("kvsim serve: {me}: closing a connection: {e}");
    }
}

/// The frames of one connection, until its end, `stop`, or the loop is gone (`Ok`),
/// or an unusable frame (the error): each message to the node's loop, each KV write
/// to its landing. What reads a TCP connection; a test's in-process byte stream too
/// (`tests/schedules.rs`).
pub fn read_frames<K: DeserializeOwned + WireWords, R: Read>(
    r: &mut FrameReader<R>,
    inbound: &Inbound<K>,
    stop: &AtomicBool,
) -> Result<(), WireError> {
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    while next_frame_begins(r, stop)? {
        let sent = match read_head(r, &mut buf)? {
            None => return Ok(()),
            Some(Head::Msg(f)) => {
                if let (Some(book), Msg::KvMeta { room, .. }) = (&inbound.book, &f.msg) {
                    book.page_list(f.from, *room);
                }
                inbound
                    .to_loop
                    .send(NodeEvent::Msg {
                        from: f.from,
                        msg: f.msg,
                    })
                    .is_ok()
            }
            Some(Head::Nixl(meta)) => {
                if let Some(book) = &inbound.book {
                    book.meta(meta);
                }
                true
            }
            Some(Head::Kv(head)) => match &inbound.landing {
                Some(l) => l.take(head, r, &mut scratch)?,
                None => {
                    // No landing here (not a decode node): the loop hands the write
                    // to the world's rule (`world::receive`), which fails it back.
                    let kv = read_payload(r, &head.words)?;
                    let KvHead {
                        from, id, src, dst, ..
                    } = head;
                    let write = KvWrite { id, src, dst, kv };
                    inbound
                        .to_loop
                        .send(NodeEvent::Write { from, write })
                        .is_ok()
                }
            },
        };
        if !sent {
            return Ok(());
        }
    }
    Ok(())
}

/// Wait for the next frame's first byte: `false` at the connection's end or `stop`
/// (checked every [`STALL`] while the connection is idle).
fn next_frame_begins<R: Read>(
    r: &mut FrameReader<R>,
    stop: &AtomicBool,
) -> Result<bool, WireError> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match r.fill_buf() {
            Ok(b) => return Ok(!b.is_empty()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The link to one peer: a thread that owns the connection and writes the queue's
/// messages as frames, reconnecting with backoff. `connected` says whether a
/// connection is up right now. `incarnation` is the writer's: when it moves on (an
/// in-process restart, [`crate::seam::NodeRuntime::close_links`]) the link closes the
/// connection the dead incarnation wrote on and drops the dead one's KV writes still
/// queued (flushed with its NIC's queue), before it writes anything more.
pub fn spawn_peer<K>(
    me: NodeId,
    peer: NodeId,
    addr: SocketAddr,
    rx: Receiver<Carried<K>>,
    to_loop: Sender<NodeEvent<K>>,
    (connected, incarnation, hello): (Arc<AtomicBool>, Arc<AtomicU32>, Hello),
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<()>>
where
    K: Serialize + WireWords + Send + 'static,
{
    thread::Builder::new()
        .name(format!("{me}-to-{peer}"))
        .spawn(move || {
            let mut link = Link {
                me,
                peer,
                addr,
                conn: None,
                backoff: BACKOFF_MIN,
                next_try: Instant::now(),
                connected,
                dead: Arc::new(AtomicBool::new(false)),
                to_loop: to_loop.clone(),
                buf: Vec::new(),
                writer: Incarnation::new(incarnation),
                hello,
            };
            while !stop.load(Ordering::Relaxed) {
                let msg = match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        link.follow_incarnation();
                        link.ensure();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                };
                let mut batch = vec![msg];
                while batch.len() < 256 {
                    match rx.try_recv() {
                        Ok(m) => batch.push(m),
                        Err(_) => break,
                    }
                }
                link.follow_incarnation();
                batch.retain(|m| !link.writer.flushed(m));
                if batch.is_empty() {
                    continue;
                }
                if !link.ensure() {
                    for msg in batch {
                        let _ = to_loop.send(NodeEvent::SendFailed { to: peer, msg });
                    }
                    continue;
                }
                let ok = link.write(me, &batch);
                if !ok {
                    for msg in batch {
                        let _ = to_loop.send(NodeEvent::SendFailed { to: peer, msg });
                    }
                    let _ = to_loop.send(NodeEvent::PeerLost { peer });
                }
            }
        })
}

struct Link<K> {
    me: NodeId,
    peer: NodeId,
    addr: SocketAddr,
    conn: Option<GatherWriter<TcpStream>>,
    backoff: Duration,
    next_try: Instant,
    connected: Arc<AtomicBool>,
    /// Set by the connection's watcher when the peer closed it.
    dead: Arc<AtomicBool>,
    to_loop: Sender<NodeEvent<K>>,
    /// The frame encoding buffer, kept from frame to frame.
    buf: Vec<u8>,
    writer: Incarnation,
    hello: Hello,
}

/// The frame a link writes first on each connection it opens (a decode node's NIXL
/// metadata, `--transport nixl`), already encoded; `None` for none.
pub type Hello = Option<Arc<Vec<u8>>>;

/// A link's view of its writer's incarnation: the one its connection was opened by,
/// and the writer's now (which [`crate::seam::NodeRuntime::close_links`] moves on at
/// an in-process restart). Every link follows it, over TCP or in process.
#[derive(Debug)]
pub struct Incarnation {
    epoch: u32,
    now: Arc<AtomicU32>,
}

impl Incarnation {
    pub fn new(now: Arc<AtomicU32>) -> Self {
        Incarnation {
            epoch: now.load(Ordering::Acquire),
            now,
        }
    }

    /// Whether the writer moved on to a new incarnation since the connection was
    /// opened: the connection its dead incarnation wrote on must close, and from here
    /// the link follows the new one.
    pub fn moved_on(&mut self, me: NodeId) -> bool {
        let now = self.now.load(Ordering::Acquire);
        if now == self.epoch {
            return false;
        }
        assert!(
            now > self.epoch,
            "{me}: incarnation {now} after {}",
            self.epoch
        );
        self.epoch = now;
        true
    }

    /// A KV write of a dead incarnation of the writer: flushed with its NIC's queue,
    /// never sent (the crash record lists it).
    pub fn flushed<K>(&self, msg: &Carried<K>) -> bool {
        matches!(msg, Carried::Write(w) if w.id.epoch < self.epoch)
    }
}

impl<K: Send + 'static> Link<K> {
    /// The writer restarted in process: the connection its dead incarnation wrote on
    /// closes (the receiver's reader ends, so the transfer thread applies none of the
    /// dead one's writes still queued behind it), and the next write reconnects.
    fn follow_incarnation(&mut self) {
        if self.writer.moved_on(self.me) {
            self.drop_conn();
            self.next_try = Instant::now();
        }
    }

    /// Connected, or reconnected now if the backoff allows.
    fn ensure(&mut self) -> bool {
        if self.conn.is_some() && self.dead.load(Ordering::Relaxed) {
            self.drop_conn();
        }
        if self.conn.is_some() {
            return true;
        }
        if Instant::now() < self.next_try {
            return false;
        }
        match TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                // The peer never writes on this connection: a read that ends means it
                // closed (its process died), and the writes posted on it fail back.
                let dead = Arc::new(AtomicBool::new(false));
                if let Ok(mut watch) = s.try_clone() {
                    let (d, tx, peer) = (dead.clone(), self.to_loop.clone(), self.peer);
                    let _ = thread::Builder::new()
                        .name(format!("{}-watch-{peer}", self.me))
                        .spawn(move || {
                            let mut buf = [0u8; 64];
                            while let Ok(n) = std::io::Read::read(&mut watch, &mut buf) {
                                if n == 0 {
                                    break;
                                }
                            }
                            d.store(true, Ordering::Relaxed);
                            let _ = tx.send(NodeEvent::PeerLost { peer });
                        });
                }
                self.dead = dead;
                let mut w = GatherWriter::with_capacity(1 << 16, s);
                if let Some(hello) = &self.hello {
                    if w.write_all(hello).is_err() {
                        self.next_try = Instant::now() + self.backoff;
                        return false;
                    }
                }
                self.conn = Some(w);
                self.backoff = BACKOFF_MIN;
                self.connected.store(true, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.next_try = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
    }

    fn write(&mut self, me: NodeId, batch: &[Carried<K>]) -> bool
    where
        K: Serialize + WireWords,
    {
        let Some(w) = &mut self.conn else {
            return false;
        };
        let buf = &mut self.buf;
        let ok = batch
            .iter()
            .all(|m| write_frame_with(w, me, m, buf).is_ok())
            && w.flush().is_ok();
        if !ok {
            self.drop_conn();
            self.next_try = Instant::now();
        }
        ok
    }

    /// Close the connection (its watcher's clone too).
    fn drop_conn(&mut self) {
        if let Some(w) = self.conn.take() {
            let _ = w.get_ref().shutdown(std::net::Shutdown::Both);
        }
        self.connected.store(false, Ordering::Relaxed);
    }
}
