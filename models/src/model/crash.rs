//! A crash of a prefill or a decode node inside one transition: the node restarts
//! at once into its next incarnation, and the world's crash walk decides the fate of
//! each message in flight.
//!
//! Only the crash itself: the transition around it is [`crate::model::tx`].

use crate::model::tx::Tx;
use crate::model_state::{note, Envelope, KvNode};
use kvsim_engine::ids::{NodeId, WriteId};
use kvsim_engine::msg::{Carried, Msg};
use kvsim_engine::world::{self, CrashWalk, Flying};
use kvsim_oracle::schema::{FaultEvent, Record};

impl Tx<'_> {
    /// The prefill or decode node crashes and restarts at once into its next
    /// incarnation: the world's rules ([`world::crash_fate`]) decide each message in
    /// flight, its timers die ([`Timers::crash`](world::Timers::crash)). `budget`: an environment fault (it
    /// counts against the crash bound), not a restart the node asked for.
    pub(super) fn crash(&mut self, node: NodeId, budget: bool) {
        let Some(kv) = self.s.kv_node(node) else {
            return;
        };
        let busy = match kv {
            KvNode::Prefill(i) => self.s.prefills[i].get().live_requests() > 0,
            KvNode::Decode(i) => {
                let d = self.s.decodes[i].get();
                d.requests() > 0 || d.quarantined_rooms() > 0
            }
        };
        if budget {
            self.s.book(|b| {
                b.faults.crashes += 1;
                if busy {
                    b.faults.busy_crashes += 1;
                }
            });
        }
        let f = self.s.faults();
        if f.frozen_node() == Some(node) || f.is_overdue(node) {
            // A frozen process can be killed; its successor is neither frozen nor late.
            self.s.book(|b| {
                if b.faults.frozen_node() == Some(node) {
                    b.faults.frozen = 0;
                }
                if b.faults.is_overdue(node) {
                    b.faults.overdue = 0;
                }
            });
        }
        let dead = self.s.epoch(node);
        match kv {
            KvNode::Prefill(i) => self.s.prefills[i].update(|n| world::restart(n, dead + 1)),
            KvNode::Decode(i) => self.s.decodes[i].update(|n| world::restart(n, dead + 1)),
        }
        self.event_text(|| format!("{node} crashes and restarts into a new incarnation"));
        self.forget_incarnation(node);
        let (flushed, failed) = self.crash_walk(node, dead);
        self.record(&Record::Fault(FaultEvent::Crash {
            node,
            epoch: dead,
            flushed,
        }));
        self.fail_back(node, failed);
        self.record(&Record::Fault(FaultEvent::Restart {
            node,
            epoch: dead + 1,
        }));
        if let KvNode::Decode(i) = kv {
            // The new incarnation has no quarantine and no retry count: every note of
            // a room use is its, but those another decode node holds.
            let s = &self.s;
            let elsewhere = |room| {
                let others = s.decodes.iter().enumerate().filter(|&(j, _)| j != i);
                others
                    .map(|(_, d)| d)
                    .any(|d| d.get().room_phase(room).is_some())
            };
            let notes = s.book.get().notes.iter().map(|(k, _)| *k);
            let rooms: Vec<_> = notes.filter(|&room| !elsewhere(room)).collect();
            for room in rooms {
                self.s.unnote(room, note::DRAIN_RETRIED);
            }
        }
    }

    /// What dies with `node`'s incarnation besides its messages: its timers (with its
    /// timer wheel), its spent timers, and the kept copies of writes to or from it.
    #[inline]
    fn forget_incarnation(&mut self, node: NodeId) {
        self.s.timers.crash(node);
        // The dead incarnation's timers are gone with its timer wheel.
        self.s.forget_spent(|n, _| n != node);
        // A kept copy of a write to or from the dead incarnation is gone with its
        // connections (the simulator's write history forgets them; one already on its
        // way is dropped as it arrives).
        if self
            .s
            .stale
            .iter()
            .any(|c| c.get().env.from == node || c.get().env.to == node)
        {
            self.s
                .stale
                .retain(|c| c.get().env.from != node && c.get().env.to != node);
        }
    }

    /// The world's crash walk ([`CrashWalk`], with [`world::crash_fate`]) over the
    /// messages in flight at the crash of `node`'s incarnation `dead`: the ones kept stay
    /// in the network (a message to the dead incarnation reaches the next one at once:
    /// the model has no time); returns the dead incarnation's flushed writes and the
    /// writes to it that fail back, with their completions.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn crash_walk(
        &mut self,
        node: NodeId,
        dead: u32,
    ) -> (Vec<WriteId>, Vec<(NodeId, NodeId, Msg)>) {
        let net = std::mem::take(&mut self.s.net);
        let walk = CrashWalk::new(node, dead).walk(net, |e| {
            let env = e.get();
            Some(Flying {
                from: env.from,
                to: env.to,
                msg: &env.msg,
                epochs: None,
                duplicate: false,
            })
        });
        self.s.net = walk.kept.into_iter().map(|(e, _)| e).collect();
        let failed = walk.failed.into_iter();
        let failed = failed.map(|(e, done)| (e.get().from, e.get().to, done));
        (walk.flushed, failed.collect())
    }

    /// Writes to the dead incarnation of `node` and READ responses it was serving
    /// fail: the oracle hears each, and its failed completion travels to its poster
    /// (a write's sender, a READ response's reader).
    #[inline]
    fn fail_back(&mut self, node: NodeId, failed: Vec<(NodeId, NodeId, Msg)>) {
        for (from, to, done) in failed {
            if let Some(write) = done.write_id() {
                self.record(&Record::WriteFailed {
                    from,
                    to,
                    write,
                    reason: world::crash_failure(node, to),
                });
            }
            let (poster, other) = if to == node { (from, to) } else { (to, from) };
            self.s.send(Envelope {
                from: other,
                to: poster,
                msg: Carried::Msg(done),
            });
        }
    }
}
