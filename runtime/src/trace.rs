//! One node's trace: a file in the documented schema (docs/TRACE.md), header first,
//! then one entry per record with wall-clock timestamps, so `kvsim audit` merges the
//! files of every node of a deployment by time; or a [`TraceLog`] in memory that every
//! node of an in-process deployment writes to, in the order they traced.

use crate::clock::wall_ns;
use crate::sync::{Arc, Mutex};
use kvsim_oracle::schema::{entry_line, header_line, Entry, Record, RunHeader};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// A node's trace writer.
#[derive(Debug)]
pub struct Tracer {
    out: Sink,
    seq: u64,
    dirty: bool,
}

#[derive(Debug)]
enum Sink {
    File(BufWriter<File>),
    Log(TraceLog),
}

/// The trace of a deployment in one process, kept in memory: every node's entries in
/// the order they were traced (a node traces what it did before a message it caused
/// leaves it, so the order is causal), each stamped with its position in the log
/// (as `at_ns` and `seq`), so a run replayed exactly logs the same bytes.
#[derive(Clone, Debug, Default)]
pub struct TraceLog(Arc<Mutex<Vec<Entry>>>);

impl TraceLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().clone()
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Vec<Entry>> {
        // A node that panicked while appending leaves a log of unknown shape.
        self.0.lock().expect("trace log poisoned: a node panicked")
    }

    fn push(&self, rec: Record) {
        let mut log = self.lock();
        let at = log.len() as u64 + 1;
        log.push(Entry {
            at_ns: at,
            seq: at,
            rec,
        });
    }
}

impl Tracer {
    /// Create `path` and write the run header.
    pub fn create(path: &Path, header: &RunHeader) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(header_line(header).as_bytes())?;
        out.write_all(b"\n")?;
        Ok(Tracer {
            out: Sink::File(out),
            seq: 0,
            dirty: false,
        })
    }

    /// A tracer that appends to `log` (whose header the caller keeps).
    pub fn log(log: TraceLog) -> Self {
        Tracer {
            out: Sink::Log(log),
            seq: 0,
            dirty: false,
        }
    }

    /// Write one record, stamped now. A write error is reported once on stderr and
    /// tracing continues (the serving path never stops for its trace).
    pub fn write(&mut self, rec: Record) {
        let out = match &mut self.out {
            Sink::File(out) => out,
            Sink::Log(log) => return log.push(rec),
        };
        self.seq += 1;
        self.dirty = true;
        let e = Entry {
            at_ns: wall_ns(),
            seq: self.seq,
            rec,
        };
        // The line and its end in one write: the buffer never goes out holding a line
        // without its end (which a kill could then leave torn at the file's end).
        let mut line = entry_line(&e);
        line.push('\n');
        if let Err(err) = out.write_all(line.as_bytes()) {
            eprintln!("kvsim serve: trace write failed: {err}");
        }
    }

    /// Write out what is buffered (nothing to do when nothing was written since).
    pub fn flush(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        if let Sink::File(out) = &mut self.out {
            if let Err(err) = out.flush() {
                eprintln!("kvsim serve: trace flush failed: {err}");
            }
        }
    }
}
