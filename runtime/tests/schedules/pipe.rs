//! A connection's bytes in process: what a link writes arrives at the reader in small
//! segments, each a channel message, with the scheduler's turns between them (a
//! payload arrives over time, as over TCP). The writer's end dropped is the
//! connection's end once the reader has read what was sent.

use kvsim_runtime::clock::Clock;
use kvsim_runtime::sync::mpsc::{Receiver, Sender};
use kvsim_runtime::sync::thread::yield_now;
use shuttle::rand::{thread_rng, RngCore};
use std::io::{self, Read, Write};

/// Bytes per segment.
const SEGMENT: usize = 8;
/// Most scheduler turns the writer gives away between two segments.
const GAP: u64 = 16;

/// The writing end.
pub struct PipeWriter(pub Sender<Vec<u8>>);

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(SEGMENT);
        self.0
            .send(buf[..n].to_vec())
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        for _ in 0..thread_rng().next_u64() % (GAP + 1) {
            yield_now();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading end; it waits for the next segment on the deployment's timeline.
pub struct PipeReader {
    rx: Receiver<Vec<u8>>,
    clock: Clock,
    segment: Vec<u8>,
    pos: usize,
}

impl PipeReader {
    pub fn new(rx: Receiver<Vec<u8>>, clock: Clock) -> Self {
        PipeReader {
            rx,
            clock,
            segment: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.segment.len() {
            match self.clock.recv(&self.rx, None) {
                Ok(s) => (self.segment, self.pos) = (s, 0),
                // Every writer is gone: the connection's end.
                Err(_) => return Ok(0),
            }
        }
        let n = (self.segment.len() - self.pos).min(buf.len());
        buf[..n].copy_from_slice(&self.segment[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
