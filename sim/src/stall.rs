//! Stalls and skewed clocks: a node frozen for a window while the world runs on
//! ([`PausePlan`]), and each node's clock running at its own rate ([`ClockRates`]).
//!
//! A pause is a process that stops running (a GC pause, a long kernel, swap,
//! SIGSTOP): its timers fire late and its inputs wait in its receive queues, while
//! the other nodes' clocks, and the NICs, run on. Which inputs wait is the
//! transport's business ([`kvsim_engine::world::KvTransport::receiver_sees_writes`]):
//! a one-sided KV write lands in a frozen node's memory (no software of the receiver
//! runs for it), a two-sided one waits for the receiver's thread; completions and
//! control messages wait for the process. The simulator holds them
//! ([`crate::simulator`]); the model checker has the same fault as a bounded action
//! (`models`, `FaultBounds::pauses`).
//!
//! A clock rate scales the timers a node sets: a node whose clock runs slow by 10 %
//! waits 1/0.9 of a timeout's configured duration in true time. The compute timer
//! is not scaled: it is how long the device works, which no clock of the node
//! decides. Offsets need no fault: the engine compares no timestamps across nodes.

use crate::rng::{self, between, log_between, Component};
use crate::scenario::FaultSpec;
use kvsim_engine::env::Timer;
use kvsim_engine::ids::NodeId;
use kvsim_engine::trace::TraceEvent;
use rand::RngExt;

/// A node frozen for `len_ns`: from `at_ns`, or, for a pause `on_transfer`, from
/// the node's first transfer step after `at_ns` (a prefill node posting a KV write, a
/// decode node taking one into its pages), so that the process freezes mid-transfer,
/// where a peer's timeout then races it. A pause that finds no such step before the
/// heal never strikes; none lasts past the heal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PausePlan {
    pub node: NodeId,
    pub at_ns: u64,
    pub len_ns: u64,
    pub on_transfer: bool,
}

/// Pauses of prefill and decode nodes inside the safety phase (before `heal_at`), in
/// time order. `max_ns` is the scenario's longest pause scaled by the kind's level.
/// Four draws per pause, always.
pub fn draw_pauses(
    fs: &FaultSpec,
    seed: u64,
    nodes: &[NodeId],
    heal_at: u64,
    max_ns: u64,
) -> Vec<PausePlan> {
    let safety = heal_at.max(1);
    let mut p = rng::stream(seed, Component::Pauses);
    let count = between(&mut p, 1, u64::from(fs.pause.count));
    let max = max_ns.max(1_000_000);
    let mut pauses = Vec::new();
    for _ in 0..count {
        let ni = between(&mut p, 0, nodes.len() as u64 - 1) as usize;
        let at = between(&mut p, 0, safety - 1);
        let len = log_between(&mut p, 1_000_000, max);
        let on_transfer = p.random_bool(0.5);
        if at < heal_at {
            pauses.push(PausePlan {
                node: nodes[ni],
                at_ns: at,
                len_ns: len,
                on_transfer,
            });
        }
    }
    pauses.sort_by_key(|p| (p.at_ns, p.node));
    pauses
}

/// The most time pauses can add to any one node's work: the sum of every pause
/// (they may all strike one node, one after the other).
pub fn paused_total_ns(pauses: &[PausePlan]) -> u64 {
    pauses.iter().fold(0u64, |t, p| t.saturating_add(p.len_ns))
}

/// Does engine event `ev` make `node` a transfer step an armed pause strikes at?
pub fn transfer_step(node: NodeId, ev: &TraceEvent) -> bool {
    match ev {
        TraceEvent::KvSent { node: n, .. } | TraceEvent::KvLanded { node: n, .. } => *n == node,
        _ => false,
    }
}

/// Each node's clock rate in per mille of the true rate (index = node id): 1000 for
/// every node when skew is off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClockRates(pub Vec<u32>);

impl ClockRates {
    /// Draw a rate for each of `nodes` nodes, within `skew` per mille of 1000 (one
    /// draw per node, always).
    pub fn draw(seed: u64, nodes: usize, skew: u32) -> ClockRates {
        assert!(skew < 1000, "a clock rate must stay above 0");
        let mut c = rng::stream(seed, Component::Clocks);
        let skew = u64::from(skew);
        let rates = (0..nodes)
            .map(|_| (1000 - skew + between(&mut c, 0, 2 * skew)) as u32)
            .collect();
        ClockRates(rates)
    }

    /// The rate of `node` (1000 where none was drawn).
    pub fn rate(&self, node: NodeId) -> u32 {
        self.0.get(node.0 as usize).copied().unwrap_or(1000)
    }

    /// How long, in true time, `timer` set by `node` for `after_ns` of its own clock
    /// takes to fire.
    pub fn true_ns(&self, node: NodeId, timer: Timer, after_ns: u64) -> u64 {
        let rate = self.rate(node);
        if rate == 1000 || timer == Timer::Compute {
            return after_ns;
        }
        let scaled = u128::from(after_ns) * 1000 / u128::from(rate);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The slowest clock's stretch of a duration: what bounds every node's timeouts.
    pub fn slowest_ns(&self, ns: u64) -> u64 {
        let slowest = self.0.iter().copied().min().unwrap_or(1000).max(1);
        let scaled = u128::from(ns) * 1000 / u128::from(slowest);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The rates as the plan's description prints them (`n1 0.93x`), only the skewed.
    pub fn describe(&self) -> String {
        let skewed: Vec<String> = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, r)| **r != 1000)
            .map(|(i, r)| format!("n{i} {}.{:03}x", r / 1000, r % 1000))
            .collect();
        skewed.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_clock_stretches_timeouts_but_not_compute() {
        let c = ClockRates(vec![1000, 500, 2000]);
        let t = Timer::WaitingForKv(kvsim_engine::ids::RoomKey::default());
        assert_eq!(c.true_ns(NodeId(0), t, 100), 100);
        assert_eq!(c.true_ns(NodeId(1), t, 100), 200);
        assert_eq!(c.true_ns(NodeId(2), t, 100), 50);
        assert_eq!(c.true_ns(NodeId(1), Timer::Compute, 100), 100);
        assert_eq!(c.slowest_ns(100), 200);
    }

    #[test]
    fn drawn_rates_stay_within_the_skew() {
        for seed in 0..50 {
            let c = ClockRates::draw(seed, 5, 300);
            assert!(c.0.iter().all(|r| (700..=1300).contains(r)), "{c:?}");
        }
        assert!(ClockRates::draw(1, 3, 0).0.iter().all(|r| *r == 1000));
    }
}
