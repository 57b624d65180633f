//! The transfer path's throughput against a plain TCP copy of the same bytes (a
//! benchmark, `kvsim bench-transfer`; no test times anything).
//!
//! The transfer path, as `kvsim serve` runs it: KV writes of real `HostGpu` pages as
//! frames over a loopback TCP connection into a decode node's listener, whose
//! connection reader lands each write ([`WireLanding`]: the landing rule through the
//! node's `SharedPool`, then the payload read straight into the pages), and the
//! landings reported to a loop channel. The plain copy: the same number of KV bytes
//! written raw over a loopback TCP connection and read into a buffer.

use crate::gather::GatherWriter;
use crate::gpu::SharedGpu;
use crate::landing::{LandingRecord, WireLanding};
use crate::net::{spawn_listener, Inbound};
use crate::node::event::NodeEvent;
use crate::sync::atomic::AtomicBool;
use crate::sync::mpsc::channel;
use crate::sync::thread;
use crate::sync::Arc;
use crate::wire::write_frame_with;
use kvsim_engine::gpu::{Gpu, HostGpu};
use kvsim_engine::ids::{NodeId, PageTag, RoomKey, WriteId};
use kvsim_engine::kv::shared::SharedPool;
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// What one run measured.
#[derive(Clone, Copy, Debug)]
pub struct TransferFigures {
    /// KV bytes landed per second through the transfer path.
    pub landed_bytes_per_s: f64,
    /// The same bytes per second as a raw TCP copy.
    pub tcp_bytes_per_s: f64,
    /// The same writes over NIXL, when asked (`kvsim bench-transfer --nixl`).
    pub nixl_bytes_per_s: Option<f64>,
    pub kv_bytes: u64,
}

/// Seconds to land `writes` writes of these pages (page size, room, destinations,
/// payloads) over another path: NIXL's, `crate::nixl::bench::time_nixl`.
pub type OtherPath = fn(u32, RoomKey, &[PageTag], &[Vec<u32>], u32) -> std::io::Result<f64>;

/// Land `writes` writes of `chunk` pages each (pages of `page_size` tokens) and copy
/// the same bytes raw, `repeat` times, the two alternating (a run's first half is the
/// path on even runs and the copy on odd ones, so neither always goes first): one
/// figure a run.
pub fn bench_transfer(
    page_size: u32,
    chunk: u32,
    writes: u32,
    repeat: u32,
) -> std::io::Result<Vec<TransferFigures>> {
    bench_transfer_with(page_size, (chunk, writes, repeat), None)
}

/// [`bench_transfer`], and `other`'s path timed after the two in each run.
pub fn bench_transfer_with(
    page_size: u32,
    (chunk, writes, repeat): (u32, u32, u32),
    other: Option<OtherPath>,
) -> std::io::Result<Vec<TransferFigures>> {
    let pages = chunk;
    let room = RoomKey::new(1, 1);
    let pool = Arc::new(SharedPool::new(pages, page_size));
    let dst = pool
        .alloc(pages as usize, room)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    pool.expect_write(room, &dst)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let src = HostGpu::new(pages, page_size);
    let kv: Vec<Vec<u32>> = dst
        .iter()
        .map(|t| src.read_page(t.page))
        .collect::<Result<_, _>>()
        .expect("a host KV memory never fails");
    let kv_bytes_per_write: u64 = kv.iter().map(|p| p.len() as u64 * 4).sum();
    let total = kv_bytes_per_write * u64::from(writes);
    let mut runs = Vec::with_capacity(repeat as usize);
    for r in 0..repeat {
        let (path_s, tcp_s) = if r % 2 == 0 {
            let p = time_transfer_path(pool.clone(), room, &dst, &kv, writes)?;
            (p, time_plain_copy(&kv, writes, total)?)
        } else {
            let t = time_plain_copy(&kv, writes, total)?;
            (
                time_transfer_path(pool.clone(), room, &dst, &kv, writes)?,
                t,
            )
        };
        let other_s = match other {
            Some(f) => Some(f(page_size, room, &dst, &kv, writes)?),
            None => None,
        };
        runs.push(TransferFigures {
            landed_bytes_per_s: total as f64 / path_s,
            tcp_bytes_per_s: total as f64 / tcp_s,
            nixl_bytes_per_s: other_s.map(|s| total as f64 / s),
            kv_bytes: total,
        });
    }
    Ok(runs)
}

/// Seconds to land `writes` KV writes of `kv` into `dst` through the transfer path: a
/// decode node's listener and its connection's landing, fed frames over loopback TCP.
fn time_transfer_path(
    pool: Arc<SharedPool>,
    room: RoomKey,
    dst: &[PageTag],
    kv: &[Vec<u32>],
    writes: u32,
) -> std::io::Result<f64> {
    let (me, writer) = (NodeId(2), NodeId(1));
    let stop = Arc::new(AtomicBool::new(false));
    let (loop_tx, loop_rx) = channel::<NodeEvent<Vec<u32>>>();
    let landing = Arc::new(WireLanding {
        node: me,
        gpu: SharedGpu::new(HostGpu::new(dst.len() as u32, pool.page_size())),
        record: LandingRecord::new(pool),
        page_tags: true,
        to_loop: loop_tx.clone(),
    });
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    spawn_listener(
        me,
        listener,
        Inbound {
            to_loop: loop_tx,
            landing: Some(landing),
            book: None,
        },
        stop.clone(),
    )?;
    // One message, re-sent with the next chunk's id: the sender reads the same pages
    // each time, as the plain copy re-sends one block.
    let mut w = KvWrite {
        id: WriteId {
            writer,
            epoch: 0,
            room,
            chunk: 0,
        },
        src: Vec::<PageTag>::new(),
        dst: dst.to_vec(),
        kv: kv.to_vec(),
    };
    let (mut conn, mut buf) = (connected(addr, writer, room, &loop_rx)?, Vec::new());
    let t0 = Instant::now();
    for i in 0..writes {
        w.id.chunk = i;
        let m = Carried::Write(w);
        write_frame_with(&mut conn, writer, &m, &mut buf)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let Carried::Write(back) = m else {
            unreachable!("the write just wrapped")
        };
        w = back;
    }
    conn.flush()?;
    let mut landed = 0u32;
    while landed < writes {
        match loop_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(NodeEvent::Landed { landing, .. }) => {
                landing.map_err(|r| std::io::Error::other(r.reason))?;
                landed += 1;
            }
            Ok(_) => {}
            Err(_) => return Err(std::io::Error::other("the transfer path stalled")),
        }
    }
    let path_s = t0.elapsed().as_secs_f64();
    stop.store(true, crate::sync::atomic::Ordering::Relaxed);
    Ok(path_s)
}

/// A connection to the listener at `addr`, written as a link writes (`net::spawn_peer`:
/// a 64 KiB [`GatherWriter`]), up and its reader running: a first message was taken.
fn connected(
    addr: std::net::SocketAddr,
    writer: NodeId,
    room: RoomKey,
    loop_rx: &crate::sync::mpsc::Receiver<NodeEvent<Vec<u32>>>,
) -> std::io::Result<GatherWriter<TcpStream>> {
    let mut w = GatherWriter::with_capacity(1 << 16, TcpStream::connect(addr)?);
    let hello = Carried::<Vec<u32>>::Msg(Msg::DrainAck { room });
    write_frame_with(&mut w, writer, &hello, &mut Vec::new())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    w.flush()?;
    match loop_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(NodeEvent::Msg { .. }) => Ok(w),
        _ => Err(std::io::Error::other(
            "the listener never took the connection",
        )),
    }
}

/// Seconds to copy the bytes of `kv`, `writes` times (`total` bytes), raw over
/// loopback TCP into a reading thread's buffer.
fn time_plain_copy(kv: &[Vec<u32>], writes: u32, total: u64) -> std::io::Result<f64> {
    let raw = TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw.local_addr()?;
    let reader = thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = raw.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n as u64;
        }
    });
    let block: Vec<u8> = kv
        .iter()
        .flat_map(|p| p.iter().flat_map(|w| w.to_le_bytes()))
        .collect();
    let mut s = TcpStream::connect(raw_addr)?;
    let t1 = Instant::now();
    for _ in 0..writes {
        s.write_all(&block)?;
    }
    drop(s);
    let got = reader
        .join()
        .map_err(|_| std::io::Error::other("reader panicked"))??;
    let tcp_s = t1.elapsed().as_secs_f64();
    if got != total {
        return Err(std::io::Error::other(format!(
            "copied {got} of {total} bytes"
        )));
    }
    Ok(tcp_s)
}

#[cfg(test)]
mod tests {
    /// The benchmark runs end to end on a tiny size and lands every write (no timing is
    /// asserted).
    #[test]
    fn transfer_bench_lands_every_write() {
        let runs = super::bench_transfer(4, 2, 8, 2).unwrap();
        assert_eq!(runs.len(), 2, "one figure a run");
        for f in runs {
            assert!(f.kv_bytes > 0);
            assert!(f.landed_bytes_per_s > 0.0 && f.tcp_bytes_per_s > 0.0);
        }
    }
}
