//! A crash and a restart: what a crash does to each message in flight (the one crash
//! walk of every driver) and the one way a node becomes its next incarnation.

use super::arrival::{failed_completion, WriteFailure};
use super::writes::WritesInFlight;
use crate::decode::DecodeNode;
use crate::gpu::Gpu;
use crate::ids::{NodeId, WriteId};
use crate::kv::PageRecords;
use crate::msg::Carried;
use crate::msg::Msg;
use crate::node::Node;
use crate::prefill::PrefillNode;
use std::fmt::Debug;

/// Why a message that [`crash_fate`] fails back failed: a KV write to the crashed
/// node lost its receiver; a READ response from it lost its source.
pub fn crash_failure(crashed: NodeId, to: NodeId) -> WriteFailure {
    if to == crashed {
        WriteFailure::ReceiverGone
    } else {
        WriteFailure::SourceGone
    }
}

/// What a crash of `crashed` does to one message in flight from `from` to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashFate {
    /// Unaffected: it travels on.
    Keep,
    /// Lost with the dead incarnation's connections.
    Lose,
    /// A KV write to the dead incarnation, or the response of a READ the dead
    /// incarnation was serving: it fails, and this failed completion travels to the
    /// node that posted it (the completion's `id.writer`) instead.
    FailBack(Msg),
    /// One of the dead incarnation's own KV writes: flushed from its NIC, never applied.
    Flush,
}

/// One rule for every driver: a KV write to the dead incarnation fails back (its
/// memory registration is gone); any other message to it stays on its way and reaches
/// the restarted incarnation late, if it is up by then ([`arrival`](crate::world::arrival)), as a completion
/// of a write the dead one posted does; the dead incarnation's own KV writes are
/// flushed; its control messages travel on. The response of a READ the dead
/// incarnation's NIC was serving (a KV write from it that another node posted:
/// [`is_read_response`](crate::world::is_read_response)) is cut with the connection:
/// the reader's NIC completes its READ with an error (a transport error, NIXL's
/// `NIXL_ERR_REMOTE_DISCONNECT`), so the reader is never left waiting for it.
pub fn crash_fate<K>(crashed: NodeId, from: NodeId, to: NodeId, msg: &Carried<K>) -> CrashFate {
    if to == crashed {
        match failed_completion(msg) {
            Some(done) if from != crashed => CrashFate::FailBack(done),
            Some(_) => CrashFate::Lose,
            None => CrashFate::Keep,
        }
    } else if from == crashed && msg.is_rdma() {
        match (msg.write_id(), failed_completion(msg)) {
            (Some(id), Some(done)) if id.writer != crashed => CrashFate::FailBack(done),
            _ => CrashFate::Flush,
        }
    } else {
        CrashFate::Keep
    }
}

/// One message in flight as the crash walk sees it, borrowed from the driver's own
/// record of it.
#[derive(Clone, Copy, Debug)]
pub struct Flying<'a, K> {
    pub from: NodeId,
    pub to: NodeId,
    pub msg: &'a Carried<K>,
    /// The incarnations of its sender and receiver when it was sent, where the driver
    /// records them (`None`: the driver keeps no incarnations with its messages, so
    /// every message to or from the crashed node is the dead incarnation's).
    pub epochs: Option<(u32, u32)>,
    /// A stale duplicate of a KV write that already landed, which the driver replays.
    pub duplicate: bool,
}

/// How a message that a crash left in flight travels on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Travel {
    /// Unaffected by the crash.
    OnItsWay,
    /// On its way to the dead incarnation: it reaches the restarted one, late.
    Late,
}

/// What the crash of `node`'s incarnation `dead` did to what was in flight: the one
/// crash walk of every driver (the simulator's queue, the model checker's network, the
/// harness's flights, the runtime's posted writes). Each message meets
/// [`crash_fate`]; what is taken out of flight is listed here, in the order walked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashWalk<T> {
    pub node: NodeId,
    /// The incarnation that died.
    pub dead: u32,
    /// What travels on, in the order walked.
    pub kept: Vec<(T, Travel)>,
    /// The dead incarnation's own KV writes, flushed with its NIC's queue, never
    /// applied: the crash record's `flushed` list.
    pub flushed: Vec<WriteId>,
    /// KV writes to the dead incarnation and READ responses it was serving, each with
    /// the failed completion that travels to its poster instead (the completion's
    /// `id.writer`: a write's sender, a READ response's receiver).
    pub failed: Vec<(T, Msg)>,
    /// Lost with the dead incarnation's connections.
    pub lost: Vec<T>,
}

impl<T> CrashWalk<T> {
    /// The crash of `node`'s incarnation `dead`, before anything in flight is walked.
    pub fn new(node: NodeId, dead: u32) -> Self {
        CrashWalk {
            node,
            dead,
            kept: Vec::new(),
            flushed: Vec::new(),
            failed: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// The incarnation that replaces the dead one.
    pub fn epoch(&self) -> u32 {
        self.dead + 1
    }

    /// Walk what a driver holds in flight; `view` says what each entry is (`None`:
    /// not a message, such as a driver's own scheduled event; it stays as it is).
    pub fn walk<K>(
        mut self,
        flights: impl IntoIterator<Item = T>,
        view: impl for<'a> Fn(&'a T) -> Option<Flying<'a, K>>,
    ) -> Self {
        for item in flights {
            self.judge(item, &view);
        }
        self
    }

    /// The writes the dead incarnation posted where they left the driver's hands (the
    /// runtime's [`WritesInFlight`]): each is a KV write from the crashed node, which
    /// [`crash_fate`] flushes. They leave flight, in (receiver, id) order.
    pub fn flush_posted(mut self, writes: &mut WritesInFlight) -> Self {
        self.flushed.extend(writes.crash());
        assert!(writes.is_empty(), "a crash leaves no write in flight");
        self
    }

    /// One message in flight: a stale duplicate to or from the dead incarnation is lost
    /// with its connection (its writer expects no completion for it); a message sent to
    /// or by an earlier incarnation than the dead one is not touched; any other meets
    /// [`crash_fate`].
    fn judge<K>(&mut self, item: T, view: &impl for<'a> Fn(&'a T) -> Option<Flying<'a, K>>) {
        let (node, dead) = (self.node, self.dead);
        let Some(f) = view(&item) else {
            self.kept.push((item, Travel::OnItsWay));
            return;
        };
        let (from, to) = (f.from, f.to);
        if f.duplicate && (to == node || from == node) {
            self.lost.push(item);
            return;
        }
        let of_dead = match f.epochs {
            None => true,
            Some((from_epoch, to_epoch)) => {
                (to == node && to_epoch == dead) || (from == node && from_epoch == dead)
            }
        };
        if !of_dead {
            self.kept.push((item, Travel::OnItsWay));
            return;
        }
        match crash_fate(node, from, to, f.msg) {
            CrashFate::Keep if to == node => self.kept.push((item, Travel::Late)),
            CrashFate::Keep => self.kept.push((item, Travel::OnItsWay)),
            CrashFate::Lose => self.lost.push(item),
            CrashFate::FailBack(done) => self.failed.push((item, done)),
            CrashFate::Flush => {
                let id = f.msg.write_id();
                assert!(id.is_some(), "only a KV write is flushed");
                self.flushed.extend(id);
            }
        }
    }
}

/// A node a driver restarts: a prefill or decode node, or a [`Node`] (never the
/// router). Sealed: only the engine implements it, and only [`restart`] carries it out,
/// so no driver changes a node's state but through `handle` and this one restart.
pub trait Incarnation: sealed::Reincarnate {}

mod sealed {
    /// The engine's own half of [`super::Incarnation`]: out of reach of every driver.
    pub trait Reincarnate {
        fn reincarnate(&mut self, epoch: u32);
    }
}

impl<G: Gpu> sealed::Reincarnate for PrefillNode<G> {
    fn reincarnate(&mut self, epoch: u32) {
        PrefillNode::reincarnate(self, epoch);
    }
}
impl<G: Gpu, P: PageRecords> sealed::Reincarnate for DecodeNode<G, P> {
    fn reincarnate(&mut self, epoch: u32) {
        DecodeNode::reincarnate(self, epoch);
    }
}
impl<G: Gpu, P: PageRecords> sealed::Reincarnate for Node<G, P> {
    fn reincarnate(&mut self, epoch: u32) {
        Node::reincarnate(self, epoch);
    }
}
impl<G: Gpu> Incarnation for PrefillNode<G> {}
impl<G: Gpu, P: PageRecords> Incarnation for DecodeNode<G, P> {}
impl<G: Gpu, P: PageRecords> Incarnation for Node<G, P> {}

/// The restart every driver carries out after a crash ([`CrashWalk`]): `node` becomes
/// its next incarnation, `epoch`, a new process on the same KV memory (its volatile
/// state gone, its page record started over in the new epoch); nothing of the dead
/// incarnation's decisions survives. The driver has already forgotten the dead
/// incarnation's timers and walked its messages. `epoch` must exceed every earlier
/// one.
///
/// # Panics
/// On the router (no driver restarts it) and on an epoch that is not higher.
pub fn restart(node: &mut impl Incarnation, epoch: u32) {
    sealed::Reincarnate::reincarnate(node, epoch);
}
