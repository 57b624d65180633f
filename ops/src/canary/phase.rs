//! One phase of a canary: planned requests run on a pool of workers, each with its
//! own connection state, through a transport the caller gives. What a request is and
//! how it is sent is the caller's; this file owns only the workers and the queue.

use crate::canary::plan::{Outcome, Planned};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a phase's workers connect and send.
pub(super) struct Transport<'a, C> {
    /// One worker's connection state.
    pub(super) connect: &'a (dyn Fn() -> C + Sync),
    pub(super) send: &'a (dyn Fn(&mut C, &Planned) -> Outcome + Sync),
    /// No request starts after this instant (the rest of the phase is not sent).
    pub(super) until: Option<Instant>,
}

/// Run planned requests on `concurrency` workers, each with its own connection state,
/// reporting the count done to `progress` (when given) every 100 ms.
pub(super) fn run_phase<C>(
    plans: Vec<Planned>,
    concurrency: usize,
    transport: &Transport<'_, C>,
    progress: Option<&dyn Fn(usize)>,
) -> Vec<Outcome> {
    let count = plans.len();
    let (connect, send, until) = (transport.connect, transport.send, transport.until);
    let queue = Arc::new(Mutex::new(plans.into_iter().rev().collect::<Vec<_>>()));
    let out = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            let (queue, out, done) = (queue.clone(), out.clone(), done.clone());
            s.spawn(move || {
                let mut client = connect();
                loop {
                    if until.is_some_and(|t| Instant::now() >= t) {
                        // Past the deadline: what is left is not sent.
                        let left = queue.lock().map(|mut q| q.drain(..).count()).unwrap_or(0);
                        done.fetch_add(left, Ordering::Relaxed);
                        return;
                    }
                    let next = queue.lock().ok().and_then(|mut q| q.pop());
                    let Some(p) = next else { return };
                    let o = send(&mut client, &p);
                    if let Ok(mut v) = out.lock() {
                        v.push(o);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if let Some(progress) = progress {
            loop {
                let d = done.load(Ordering::Relaxed);
                progress(d);
                if d >= count {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    let mut v = Arc::try_unwrap(out)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    v.sort_by_key(|o| o.plan.n);
    v
}
