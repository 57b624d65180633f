//! `Pending`: the events the simulator's queue holds (deliveries, timer fires,
//! client submits and cancels, crashes, restarts, pauses, partitions, the heal).
//! It only names them; the simulator's other files decide when they happen and
//! carry them out.

use crate::plan::Partition;
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, RequestId};
use kvsim_engine::msg::Carried;
use kvsim_engine::world::{Altered, DataFault};
use kvsim_oracle::schema::CancelHow;

/// Something scheduled to happen.
#[derive(Clone, Debug)]
pub(super) enum Pending<K> {
    Deliver {
        from: NodeId,
        to: NodeId,
        from_epoch: u32,
        to_epoch: u32,
        /// Not boxed: the queue moves keys, never the event ([`EventQueue`]).
        ///
        /// [`EventQueue`]: crate::queue::EventQueue
        msg: Carried<K>,
        /// A KV write whose failure was decided when it was sent.
        doomed: bool,
        /// A data fault the KV write suffers if it lands, with its salt.
        data: Option<(DataFault, u64)>,
        /// This KV write is a stale duplicate of an earlier one, and what it does
        /// ([`WriteHistory::duplicate`](kvsim_engine::world::WriteHistory::duplicate)).
        replay: Option<Altered>,
    },
    Fire {
        node: NodeId,
        timer: Timer,
        token: u64,
    },
    Submit {
        req: RequestId,
    },
    Cancel {
        req: RequestId,
        how: CancelHow,
    },
    Crash {
        node: NodeId,
        restart_ns: u64,
    },
    Restart {
        node: NodeId,
    },
    /// The node freezes for `len_ns` now, or is armed to freeze at its next transfer
    /// step ([`crate::stall::PausePlan`]).
    Pause {
        node: NodeId,
        len_ns: u64,
        on_transfer: bool,
    },
    PartitionStart(Partition),
    PartitionEnd(Partition),
    Heal,
}
