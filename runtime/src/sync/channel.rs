//! Channels under shuttle (`--cfg shuttle` only): shuttle's, each with a count of the
//! items sent and not yet taken, so the timeline (`timeline`) lets time pass only
//! when nothing is queued for any thread that waits. The interface is the part of
//! std's `mpsc` the runtime uses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use shuttle::sync::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError};

/// The items a channel holds (sent, not taken). A std atomic: shuttle runs one task
/// at a time, and the count is no scheduling point.
#[derive(Clone, Debug, Default)]
pub struct Queued(Arc<AtomicUsize>);

impl Queued {
    pub fn is_empty(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }
    fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn take(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = shuttle::sync::mpsc::channel();
    let queued = Queued::default();
    (
        Sender {
            inner: tx,
            queued: queued.clone(),
        },
        Receiver { inner: rx, queued },
    )
}

#[derive(Debug)]
pub struct Sender<T> {
    inner: shuttle::sync::mpsc::Sender<T>,
    queued: Queued,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            inner: self.inner.clone(),
            queued: self.queued.clone(),
        }
    }
}

impl<T> Sender<T> {
    pub fn send(&self, t: T) -> Result<(), SendError<T>> {
        self.queued.add();
        let sent = self.inner.send(t);
        if sent.is_err() {
            self.queued.take();
        }
        sent
    }
}

#[derive(Debug)]
pub struct Receiver<T> {
    inner: shuttle::sync::mpsc::Receiver<T>,
    queued: Queued,
}

impl<T> Receiver<T> {
    fn took<E>(&self, r: Result<T, E>) -> Result<T, E> {
        if r.is_ok() {
            self.queued.take();
        }
        r
    }
    pub fn recv(&self) -> Result<T, RecvError> {
        self.took(self.inner.recv())
    }
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.took(self.inner.try_recv())
    }
    /// Shuttle's never times out: it waits for an item (the timeline's waits are
    /// `Clock::recv`).
    pub fn recv_timeout(&self, wait: Duration) -> Result<T, RecvTimeoutError> {
        self.took(self.inner.recv_timeout(wait))
    }
    pub fn iter(&self) -> Iter<'_, T> {
        Iter(self)
    }
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter(self)
    }
    /// What the channel holds, for the timeline.
    pub(crate) fn queued(&self) -> Queued {
        self.queued.clone()
    }
}

pub struct Iter<'a, T>(&'a Receiver<T>);

impl<T> Iterator for Iter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.0.recv().ok()
    }
}

pub struct TryIter<'a, T>(&'a Receiver<T>);

impl<T> Iterator for TryIter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.0.try_recv().ok()
    }
}

pub struct IntoIter<T>(Receiver<T>);

impl<T> Iterator for IntoIter<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.0.recv().ok()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter(self)
    }
}

impl<'a, T> IntoIterator for &'a Receiver<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        Iter(self)
    }
}
