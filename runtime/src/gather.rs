//! `GatherWriter`: a link's buffered writer that never copies a large part.
//!
//! A link writes frames: a length, a head, and for a KV write the pages' own memory as
//! the payload (`wire::write_frame_with`). `std::io::BufWriter` copies every write
//! smaller than its capacity into its buffer, so a KV payload of a few pages (a 24 KiB
//! page at page size 64) was copied once in user space before the kernel copied it
//! again. This writer copies small writes (lengths, heads, control messages, a payload
//! under [`DIRECT`]) into its buffer, as `BufWriter` does, and hands a large one to the socket in one vectored
//! write together with what is buffered ahead of it: no user-space copy of a payload,
//! and no extra system call (the buffered bytes go in the same `writev`).

use std::io::{self, IoSlice, Write};

/// A write (all its parts together) at least this long is written from its own
/// memory, not copied.
pub const DIRECT: usize = 16 << 10;

/// Buffered writer over `W` that gathers large parts instead of copying them.
#[derive(Debug)]
pub struct GatherWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> GatherWriter<W> {
    /// A writer with a buffer of `capacity` bytes (at least [`DIRECT`]: every part
    /// that is copied fits it).
    pub fn with_capacity(capacity: usize, inner: W) -> Self {
        GatherWriter {
            inner,
            buf: Vec::with_capacity(capacity.max(DIRECT)),
        }
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// Bytes buffered and not yet written.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Write the buffered bytes ahead of `parts` and as much of `parts` as the socket
    /// takes, in vectored writes; the count is of `parts`' bytes only. Returns once the
    /// buffer is empty and at least one byte of `parts` is written (or `parts` is).
    fn write_through(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut done = 0;
        while done < self.buf.len() {
            let mut iov = Vec::with_capacity(parts.len() + 1);
            iov.push(IoSlice::new(&self.buf[done..]));
            iov.extend(parts.iter().map(|p| IoSlice::new(p)));
            let n = match self.inner.write_vectored(&iov) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.drain(..done);
                    return Err(e);
                }
            };
            let pending = self.buf.len() - done;
            if n > pending {
                self.buf.clear();
                return Ok(n - pending);
            }
            done += n;
        }
        self.buf.clear();
        self.inner.write_vectored(parts)
    }
}

impl<W: Write> Write for GatherWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(data)])
    }

    fn write_vectored(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total < DIRECT && self.buf.len() + total <= self.buf.capacity() {
            parts.iter().for_each(|p| self.buf.extend_from_slice(p));
            return Ok(total);
        }
        // A large part, or small ones that do not fit behind what is buffered: the
        // buffer goes out with them.
        self.write_through(parts)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut done = 0;
        while done < self.buf.len() {
            match self.inner.write(&self.buf[done..]) {
                Ok(0) => {
                    self.buf.drain(..done);
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.drain(..done);
                    return Err(e);
                }
            }
        }
        self.buf.clear();
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that takes at most `max` bytes a call and counts its calls.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(data)])
        }

        fn write_vectored(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            let mut left = self.max;
            for p in parts {
                let n = p.len().min(left);
                self.out.extend_from_slice(&p[..n]);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            Ok(self.max - left)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn write_all_vectored(w: &mut impl Write, mut parts: &mut [IoSlice<'_>]) {
        while !parts.is_empty() {
            let n = w.write_vectored(parts).unwrap();
            assert!(n > 0, "a vectored write made no progress");
            IoSlice::advance_slices(&mut parts, n);
        }
    }

    fn frames() -> Vec<Vec<u8>> {
        (0..40u32)
            .map(|i| {
                let len = [4, 60, 3_000, DIRECT, 3 * DIRECT + 7][i as usize % 5];
                (0..len).map(|b| (b as u32 ^ i) as u8).collect()
            })
            .collect()
    }

    /// Every byte arrives once and in order, whatever the sink takes a call, and
    /// parts of every size: small ones copied, large ones gathered.
    #[test]
    fn bytes_arrive_in_order_under_short_writes() {
        for max in [1, 7, 4_096, DIRECT + 3, usize::MAX / 2] {
            let sink = Trickle {
                out: Vec::new(),
                max,
                calls: 0,
            };
            let mut w = GatherWriter::with_capacity(64 << 10, sink);
            let mut want = Vec::new();
            for (i, f) in frames().iter().enumerate() {
                want.extend_from_slice(f);
                if i % 3 == 0 {
                    w.write_all(f).unwrap();
                } else {
                    let (a, b) = f.split_at(f.len() / 2);
                    write_all_vectored(&mut w, &mut [IoSlice::new(a), IoSlice::new(b)]);
                }
            }
            w.flush().unwrap();
            assert_eq!(w.buffered(), 0, "a flush leaves nothing buffered");
            assert!(
                w.inner.out == want,
                "sink max {max}: bytes lost or reordered"
            );
        }
    }

    /// A large part is not copied: it goes out in the same call as the small parts
    /// buffered ahead of it, one call for both.
    #[test]
    fn a_large_part_goes_out_with_the_buffer_in_one_call() {
        let sink = Trickle {
            out: Vec::new(),
            max: usize::MAX / 2,
            calls: 0,
        };
        let mut w = GatherWriter::with_capacity(64 << 10, sink);
        w.write_all(&[1, 2, 3, 4]).unwrap();
        w.write_all(&[5; 100]).unwrap();
        assert_eq!(w.inner.calls, 0, "small parts are buffered");
        w.write_all(&vec![9; DIRECT]).unwrap();
        assert_eq!(w.inner.calls, 1, "buffer and payload in one vectored write");
        assert_eq!(w.buffered(), 0);
        assert_eq!(w.inner.out.len(), 104 + DIRECT);
    }
}
