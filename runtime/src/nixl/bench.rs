//! NIXL's side of `kvsim bench-transfer --nixl`: the same KV writes as the TCP path's
//! benchmark ([`crate::bench`]) posted through a prefill node's [`NixlWriter`] into a
//! decode node's memory registered by a [`NixlReceiver`], both in this process (two
//! agents, UCX over loopback TCP), timed from the first post to the last completion
//! the writer's poller reports. Each write is staged and registered as `kvsim serve`
//! does it; the receiver's progress thread runs with its delay
//! ([`super::PROGRESS_DELAY_US`]), the writer's is off (its poller drives progress).

use super::{NixlReceiver, NixlWriter};
use crate::gpu::SharedGpu;
use crate::kvpath::{Carry, KvPath, RemoteBook};
use crate::node::event::NodeEvent;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::mpsc::channel;
use crate::sync::Arc;
use kvsim_engine::gpu::{Gpu, HostGpu};
use kvsim_engine::ids::{NodeId, PageTag, RoomKey, WriteId};
use kvsim_engine::msg::{Carried, KvWrite};
use std::time::{Duration, Instant};

/// Seconds to land `writes` KV writes of `kv` into `dst` of a fresh host memory over
/// NIXL.
pub fn time_nixl(
    page_size: u32,
    room: RoomKey,
    dst: &[PageTag],
    kv: &[Vec<u32>],
    writes: u32,
) -> std::io::Result<f64> {
    let err = |why: String| std::io::Error::other(why);
    let (me, writer) = (NodeId(2), NodeId(1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut gpu = SharedGpu::new(HostGpu::new(dst.len() as u32, page_size));
    let memory = gpu
        .host_memory()
        .ok_or_else(|| err("host memory has no regions".into()))?;
    let (rx_tx, _rx_rx) = channel::<NodeEvent<Vec<u32>>>();
    let owned = (
        Box::new(gpu) as Box<dyn std::any::Any + Send + Sync>,
        memory,
    );
    let receiver = NixlReceiver::start(me, owned, rx_tx, stop.clone()).map_err(err)?;
    let (tx, done) = channel::<NodeEvent<Vec<u32>>>();
    let w = NixlWriter::start(writer, tx, stop.clone()).map_err(err)?;
    w.meta(receiver.meta.clone());
    w.page_list(me, room);
    let t0 = Instant::now();
    for chunk in 0..writes {
        let id = WriteId {
            writer,
            epoch: 0,
            room,
            chunk,
        };
        let write = KvWrite {
            id,
            src: Vec::new(),
            dst: dst.to_vec(),
            kv: kv.to_vec(),
        };
        if let Carry::Undeliverable(_) | Carry::NotMine(_) = w.carry(me, Carried::Write(write)) {
            return Err(err("the writer did not take the write".into()));
        }
    }
    let mut landed = 0;
    while landed < writes {
        match done.recv_timeout(Duration::from_secs(60)) {
            Ok(NodeEvent::TransferDone { .. }) => landed += 1,
            Ok(NodeEvent::TransferFailed { id, .. }) => {
                return Err(err(format!("the transfer of {id} failed")))
            }
            Ok(_) => {}
            Err(_) => return Err(err("the NIXL path stalled".into())),
        }
    }
    let s = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    Ok(s)
}
