//! TCP between nodes: one outgoing connection per peer, reconnected with backoff, and
//! a listener whose connections feed the node's loop (and a decode node's KV writes
//! to its transfer thread).
//!
//! Loss is what it is on real hardware: a message that cannot be written (no
//! connection, or the connection broke under it) is reported to the loop as
//! [`NodeEvent::SendFailed`], and a broken connection as [`NodeEvent::PeerLost`]; the loop applies
//! the engine's rule (lost, or a failed completion for a KV write).

use crate::node::NodeEvent;
use crate::wire::{read_frame_with, write_frame_with};
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::Msg;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufReader, BufWriter, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The first wait before a reconnection, doubled per failure up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// A KV write as the transfer thread takes it: its sender, the message, and whether
/// the connection it came on is still open.
pub type Incoming<K> = (NodeId, Msg<K>, Arc<AtomicBool>);

/// Where a node's incoming messages go.
pub struct Inbound<K> {
    pub to_loop: Sender<NodeEvent<K>>,
    /// A decode node's transfer thread (KV writes go there, with their connection's
    /// liveness: a write still queued when its connection closed is not applied).
    pub transfer: Option<Sender<Incoming<K>>>,
}

impl<K> Clone for Inbound<K> {
    fn clone(&self) -> Self {
        Inbound {
            to_loop: self.to_loop.clone(),
            transfer: self.transfer.clone(),
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
    K: DeserializeOwned + Send + 'static,
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

fn read_conn<K: DeserializeOwned>(
    me: NodeId,
    stream: TcpStream,
    inbound: Inbound<K>,
    stop: Arc<AtomicBool>,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let alive = Arc::new(AtomicBool::new(true));
    read_frames(me, stream, &inbound, &stop, &alive);
    alive.store(false, Ordering::Release);
}

fn read_frames<K: DeserializeOwned>(
    me: NodeId,
    stream: TcpStream,
    inbound: &Inbound<K>,
    stop: &AtomicBool,
    alive: &Arc<AtomicBool>,
) {
    let mut r = BufReader::with_capacity(1 << 16, stream);
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match read_frame_with::<K, _>(&mut r, &mut buf) {
            Ok(Some(f)) => {
                let sent = match (&inbound.transfer, &f.msg) {
                    (Some(t), Msg::KvWrite { .. }) => {
                        t.send((f.from, f.msg, alive.clone())).is_ok()
                    }
                    _ => inbound
                        .to_loop
                        .send(NodeEvent::Msg {
                            from: f.from,
                            msg: f.msg,
                        })
                        .is_ok(),
                };
                if !sent {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                eprintln!("kvsim serve: {me}: closing a connection: {e}");
                return;
            }
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
    rx: Receiver<Msg<K>>,
    to_loop: Sender<NodeEvent<K>>,
    (connected, incarnation): (Arc<AtomicBool>, Arc<AtomicU32>),
    stop: Arc<AtomicBool>,
) -> std::io::Result<thread::JoinHandle<()>>
where
    K: Serialize + Send + 'static,
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
                epoch: incarnation.load(Ordering::Acquire),
                incarnation,
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
                batch.retain(|m| !link.flushed(m));
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
    conn: Option<BufWriter<TcpStream>>,
    backoff: Duration,
    next_try: Instant,
    connected: Arc<AtomicBool>,
    /// Set by the connection's watcher when the peer closed it.
    dead: Arc<AtomicBool>,
    to_loop: Sender<NodeEvent<K>>,
    /// The frame encoding buffer, kept from frame to frame.
    buf: Vec<u8>,
    /// The writer's incarnation the connection was opened by, and the writer's now.
    epoch: u32,
    incarnation: Arc<AtomicU32>,
}

impl<K: Send + 'static> Link<K> {
    /// The writer restarted in process: the connection its dead incarnation wrote on
    /// closes (the receiver's reader ends, so the transfer thread applies none of the
    /// dead one's writes still queued behind it), and the next write reconnects.
    fn follow_incarnation(&mut self) {
        let now = self.incarnation.load(Ordering::Acquire);
        if now == self.epoch {
            return;
        }
        assert!(
            now > self.epoch,
            "{}: incarnation {now} after {}",
            self.me,
            self.epoch
        );
        self.drop_conn();
        self.next_try = Instant::now();
        self.epoch = now;
    }

    /// A KV write of a dead incarnation of the writer: flushed with its NIC's queue,
    /// never sent (the crash record lists it).
    fn flushed(&self, msg: &Msg<K>) -> bool {
        matches!(msg, Msg::KvWrite { id, .. } if id.epoch < self.epoch)
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
                self.conn = Some(BufWriter::with_capacity(1 << 16, s));
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

    fn write(&mut self, me: NodeId, batch: &[Msg<K>]) -> bool
    where
        K: Serialize,
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
