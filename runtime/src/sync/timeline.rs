//! Time under shuttle (`--cfg shuttle` only): one virtual timeline that the loops'
//! clocks share, moved only by the scheduler's choices, so a schedule replays exactly.
//!
//! Each thread on the timeline (a node's loop, and each thread that carries messages
//! between loops: [`Timeline::enlist`]) waits for its next input through
//! [`Timeline::recv`]. Time passes only while every one of them waits with nothing
//! queued for it (`channel`'s counts: nothing is being handled, nothing is on its
//! way), and then only at one in [`TIMEOUT_ODDS`] of
//! a waiting loop's turns, drawn from shuttle's random source (recorded in the
//! schedule), so the other threads (a test's clients) may act first: the timeline
//! moves to the earliest deadline waited for, as a discrete-event simulator moves its
//! clock to the next event, and that loop stops waiting. So a timer fires at or after
//! its deadline, and never while the deployment could do anything else; what a timer
//! races is the simulator's and the model checker's business (their pauses and
//! delays), the threads' interleavings are this one's. A thread with no deadline
//! blocks until an input comes.

use crate::sync::channel::Queued;
use crate::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use shuttle::rand::{thread_rng, RngCore};
use std::collections::BTreeMap;
use std::time::Duration;

/// Time passes at one of this many turns of a waiting loop.
pub const TIMEOUT_ODDS: u32 = 8;

/// The shared timeline: now, its loops, and what each waiting one waits for.
#[derive(Debug, Default)]
pub struct Timeline {
    // A std lock under shuttle: the scheduler runs one task at a time on one thread,
    // and no task switches while holding it (nothing inside is a shuttle operation),
    // so it is never contended and is no scheduling point.
    state: std::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    now_ns: u64,
    /// How many threads run on the timeline.
    threads: usize,
    /// Waiter number -> its deadline (`None`: it waits for an event only), and what
    /// its channel holds (a waiter with something queued is about to go on).
    waiting: BTreeMap<u64, (Option<u64>, Queued)>,
    next_waiter: u64,
}

impl Timeline {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Poisoned only by a panic in the few lines that hold it, which have none.
        self.state.lock().expect("timeline lock poisoned")
    }

    /// One more thread runs on the timeline.
    pub fn enlist(&self) {
        self.state().threads += 1;
    }

    /// A thread left the timeline.
    pub fn leave(&self) {
        self.state().threads -= 1;
    }

    pub fn now_ns(&self) -> u64 {
        self.state().now_ns
    }

    /// The next item of `rx`, waiting until `wait` has passed on the timeline
    /// (`None`: until an item comes).
    pub fn recv<T>(&self, rx: &Receiver<T>, wait: Option<Duration>) -> Result<T, RecvTimeoutError> {
        let waited = wait.map(|w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX));
        let (waiter, deadline) = {
            let mut s = self.state();
            let deadline = waited.map(|w| s.now_ns.saturating_add(w));
            s.next_waiter += 1;
            let waiter = s.next_waiter;
            s.waiting.insert(waiter, (deadline, rx.queued()));
            (waiter, deadline)
        };
        let got = match deadline {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => self.until(rx, deadline),
        };
        self.state().waiting.remove(&waiter);
        got
    }

    fn until<T>(&self, rx: &Receiver<T>, deadline: u64) -> Result<T, RecvTimeoutError> {
        loop {
            match rx.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if self.now_ns() >= deadline {
                return Err(RecvTimeoutError::Timeout);
            }
            if thread_rng().next_u32().is_multiple_of(TIMEOUT_ODDS) {
                self.pass();
            } else {
                shuttle::thread::yield_now();
            }
        }
    }

    /// Time passes to the earliest deadline waited for, if every thread waits and
    /// nothing is queued for any of them.
    fn pass(&self) {
        let mut s = self.state();
        if s.waiting.len() < s.threads || s.waiting.values().any(|(_, q)| !q.is_empty()) {
            return;
        }
        if let Some(next) = s.waiting.values().filter_map(|(d, _)| *d).min() {
            s.now_ns = s.now_ns.max(next);
        }
    }
}
