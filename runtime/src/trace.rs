//! One node's trace file: the documented schema (docs/TRACE.md), header first, then
//! one entry per record with wall-clock timestamps, so `kvsim audit` merges the files
//! of every node of a deployment by time.

use crate::clock::wall_ns;
use kvsim_oracle::schema::{entry_line, header_line, Entry, Record, RunHeader};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// A node's trace writer.
#[derive(Debug)]
pub struct Tracer {
    out: BufWriter<File>,
    seq: u64,
    dirty: bool,
}

impl Tracer {
    /// Create `path` and write the run header.
    pub fn create(path: &Path, header: &RunHeader) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(header_line(header).as_bytes())?;
        out.write_all(b"\n")?;
        Ok(Tracer {
            out,
            seq: 0,
            dirty: false,
        })
    }

    /// Write one record, stamped now. A write error is reported once on stderr and
    /// tracing continues (the serving path never stops for its trace).
    pub fn write(&mut self, rec: Record) {
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
        if let Err(err) = self.out.write_all(line.as_bytes()) {
            eprintln!("kvsim serve: trace write failed: {err}");
        }
    }

    /// Write out what is buffered (nothing to do when nothing was written since).
    pub fn flush(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        if let Err(err) = self.out.flush() {
            eprintln!("kvsim serve: trace flush failed: {err}");
        }
    }
}
