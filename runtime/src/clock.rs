//! Time for the runtime: the monotonic clock and a timer heap.
//!
//! Nodes read no clock; they set and cancel [`Timer`]s. The runtime keeps them in
//! [`kvsim_engine::world::Timers`] (the one rule for replacing and cancelling, shared
//! with every driver) with a token per setting, and in a heap ordered by deadline on
//! the monotonic clock. A replaced or cancelled timer stays in the heap until its
//! deadline and is recognised by its token, never fired.
//!
//! Under `--cfg shuttle` the clock is a virtual timeline the scheduler moves
//! (`crate::sync::timeline`), shared by the loops a test gives one [`Clock`], so the
//! timers of a schedule fire where the schedule says and nowhere else.

use crate::sync::mpsc::{Receiver, RecvTimeoutError};
use kvsim_engine::env::{Timer, TimerOp};
use kvsim_engine::ids::NodeId;
use kvsim_engine::world::Timers;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a loop with no timer pending waits before it looks again (wall clock only:
/// on shuttle's timeline it waits for its next event).
#[cfg(not(shuttle))]
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// The monotonic clock of one process: nanoseconds since it started.
#[cfg(not(shuttle))]
#[derive(Clone, Debug)]
pub struct Clock {
    start: std::time::Instant,
}

#[cfg(not(shuttle))]
impl Default for Clock {
    fn default() -> Self {
        Clock {
            start: std::time::Instant::now(),
        }
    }
}

#[cfg(not(shuttle))]
impl Clock {
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Another thread's clock on this one's timeline (the process's clock: the same).
    pub fn another(&self) -> Clock {
        self.clone()
    }

    /// The next item of `rx`, waiting at most `wait` (`None`: no timer is pending; the
    /// caller looks again after a while).
    pub fn recv<T>(&self, rx: &Receiver<T>, wait: Option<Duration>) -> Result<T, RecvTimeoutError> {
        rx.recv_timeout(wait.unwrap_or(IDLE_WAIT))
    }
}

/// A thread's virtual clock on a shuttle timeline: a node's loop's, or a thread's
/// that carries messages between loops. Time passes only while every thread with a
/// clock on the timeline waits in [`Clock::recv`].
#[cfg(shuttle)]
#[derive(Debug)]
pub struct Clock {
    timeline: crate::sync::Arc<crate::sync::timeline::Timeline>,
}

#[cfg(shuttle)]
impl Default for Clock {
    /// The first loop's clock on a new timeline.
    fn default() -> Self {
        let timeline = crate::sync::Arc::new(crate::sync::timeline::Timeline::default());
        timeline.enlist();
        Clock { timeline }
    }
}

#[cfg(shuttle)]
impl Drop for Clock {
    fn drop(&mut self) {
        self.timeline.leave();
    }
}

#[cfg(shuttle)]
impl Clock {
    /// Another thread's clock on this one's timeline.
    pub fn another(&self) -> Clock {
        self.timeline.enlist();
        Clock {
            timeline: self.timeline.clone(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.timeline.now_ns()
    }

    /// The next item of `rx`, waiting until `wait` has passed on the timeline
    /// (`None`: until one comes; `Err` only when every sender is gone).
    pub fn recv<T>(&self, rx: &Receiver<T>, wait: Option<Duration>) -> Result<T, RecvTimeoutError> {
        self.timeline.recv(rx, wait)
    }
}

/// Wall-clock nanoseconds since the Unix epoch: the trace's timestamps (every node of
/// a deployment on one machine, or with synchronised clocks, writes comparable ones).
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The pending timers of one node, by deadline.
#[derive(Debug, Default)]
pub struct TimerHeap {
    timers: Timers<u64>,
    heap: BinaryHeap<Reverse<(u64, u64, Timer)>>,
    next_token: u64,
}

impl TimerHeap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply a node's timer operation at monotonic time `now_ns`.
    pub fn apply(&mut self, node: NodeId, op: TimerOp, now_ns: u64) {
        self.next_token += 1;
        let token = self.next_token;
        self.timers.apply(node, op, token);
        if let TimerOp::Set { timer, after_ns } = op {
            self.heap
                .push(Reverse((now_ns.saturating_add(after_ns), token, timer)));
        }
    }

    /// How long until the next live deadline (`None`: nothing pending).
    pub fn wait(&mut self, node: NodeId, now_ns: u64) -> Option<Duration> {
        while let Some(Reverse((at, token, timer))) = self.heap.peek().copied() {
            if self.timers.get(node, timer) != Some(&token) {
                self.heap.pop();
                continue;
            }
            return Some(Duration::from_nanos(at.saturating_sub(now_ns)));
        }
        None
    }

    /// The next timer due at `now_ns`, taken out (it fires).
    pub fn due(&mut self, node: NodeId, now_ns: u64) -> Option<Timer> {
        while let Some(Reverse((at, token, timer))) = self.heap.peek().copied() {
            if self.timers.get(node, timer) != Some(&token) {
                self.heap.pop();
                continue;
            }
            if at > now_ns {
                return None;
            }
            self.heap.pop();
            self.timers.take(node, timer);
            return Some(timer);
        }
        None
    }

    /// `node`'s incarnation died: none of its timers fires (each stays in the heap
    /// until its deadline, recognised by its token as every replaced one is).
    pub fn crash(&mut self, node: NodeId) {
        self.timers.crash(node);
    }

    pub fn pending(&self) -> usize {
        self.timers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaced_and_cancelled_timers_never_fire() {
        let n = NodeId(1);
        let mut h = TimerHeap::new();
        let set = |after_ns| TimerOp::Set {
            timer: Timer::Compute,
            after_ns,
        };
        h.apply(n, set(10), 0);
        h.apply(n, set(50), 0); // replaces the first
        assert_eq!(h.due(n, 20), None, "the replaced setting must not fire");
        assert_eq!(h.wait(n, 20), Some(Duration::from_nanos(30)));
        assert_eq!(h.due(n, 50), Some(Timer::Compute));
        assert_eq!(h.due(n, 60), None);
        h.apply(n, set(5), 100);
        h.apply(
            n,
            TimerOp::Cancel {
                timer: Timer::Compute,
            },
            100,
        );
        assert_eq!(h.due(n, 1_000), None);
        assert_eq!(h.wait(n, 1_000), None);
        assert_eq!(h.pending(), 0);
    }
}
