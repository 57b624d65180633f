//! Frames between nodes: a 4-byte big-endian length, then the frame's head in postcard
//! (the engine's own serde form, encoded compactly: integers as variable-length
//! LEB128). A message travels whole in its head ([`Head::Msg`]). A KV write (not a
//! message: a writer posts it, `Carried::Write`) travels as a head of its own
//! ([`KvHead`]) names the write, its pages and each page payload's length in words; the
//! payload follows the head as raw bytes (each word 4 bytes little-endian), so the
//! receiver can read it straight into the destination pages once the landing rule
//! admitted the write (`crate::node::WireLanding`), and a refused write's bytes into a
//! scratch buffer. A head over [`MAX_FRAME`], a payload over [`MAX_FRAME`], a head that
//! does not parse or has bytes left after it end the connection with an error naming
//! the reason. JSON was the first encoding (about
//! 6% of a plain TCP copy), then bincode 1.3 (replaced: a RustSec advisory), then
//! postcard for whole frames (a KV word took one to five bytes); figures in
//! docs/PERFORMANCE-LOG.md. A hostile length prefix inside a head cannot make the reader
//! allocate much past the head: postcard reads every byte from the head itself, and
//! serde preallocates at most 1 MiB for a sequence whatever length it claims.

use crate::kvpath::NixlMeta;
use kvsim_engine::gpu::bytes::payload_bytes;
use kvsim_engine::gpu::WireWords;
use kvsim_engine::ids::{NodeId, PageTag, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use serde::{Deserialize, Serialize, Serializer};
use std::io::{self, BufRead, IoSlice, IoSliceMut, Read, Write};
use std::time::Instant;

/// The largest frame head, and the largest KV payload, accepted, in bytes (a KV write
/// of many host pages fits).
pub const MAX_FRAME: u32 = 256 << 20;

/// One message or KV write on the wire, with the node that sent it.
#[derive(Debug)]
pub struct Frame<K> {
    pub from: NodeId,
    pub msg: Carried<K>,
}

/// A message's frame head: the message whole, with the node that sent it.
#[derive(Debug, Serialize, Deserialize)]
pub struct MsgFrame {
    pub from: NodeId,
    pub msg: Msg,
}

/// A KV write's frame head: the write but its payload, and the length of each page's
/// payload in words (`words[i]` for the `i`-th payload; one per destination page in a
/// well-formed write, which the landing rule checks). The payload follows the head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvHead {
    pub from: NodeId,
    pub id: WriteId,
    pub src: Vec<PageTag>,
    pub dst: Vec<PageTag>,
    pub words: Vec<u32>,
}

impl KvHead {
    /// The bytes of the payload that follows the head.
    pub fn payload_bytes(&self) -> u64 {
        payload_bytes(&self.words)
    }
}

/// What a frame's head carries.
#[derive(Debug, Deserialize)]
pub enum Head {
    Msg(MsgFrame),
    Kv(KvHead),
    /// A decode node's NIXL agent and registered memory (`--transport nixl`), first on
    /// each of its connections.
    Nixl(NixlMeta),
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("frame length {0} exceeds the limit of {MAX_FRAME} bytes")]
    TooLong(u32),
    #[error("KV payload of {0} bytes exceeds the limit of {MAX_FRAME} bytes")]
    PayloadTooLong(u64),
    #[error("frame does not parse: {0}")]
    Parse(#[from] postcard::Error),
    #[error("frame does not parse: {0} bytes left after its message")]
    Trailing(usize),
}

#[derive(Serialize)]
struct FrameRef<'a> {
    from: NodeId,
    msg: &'a Msg,
}

/// [`Head`] as it is written, borrowing the message.
#[derive(Serialize)]
#[serde(bound = "K: WireWords")]
enum HeadRef<'a, K> {
    Msg(FrameRef<'a>),
    Kv(KvHeadRef<'a, K>),
    Nixl(&'a NixlMeta),
}

/// [`KvHead`] as it is written: the page lists and the payloads' lengths, borrowed.
#[derive(Serialize)]
#[serde(bound = "K: WireWords")]
struct KvHeadRef<'a, K> {
    from: NodeId,
    id: WriteId,
    src: &'a [PageTag],
    dst: &'a [PageTag],
    #[serde(serialize_with = "word_counts")]
    words: &'a [K],
}

fn word_counts<K: WireWords, S: Serializer>(kv: &&[K], s: S) -> Result<S::Ok, S::Error> {
    // Each payload is at most MAX_FRAME bytes (checked before the head is written).
    s.collect_seq(kv.iter().map(|p| p.wire_words().len() as u32))
}

/// Write `msg` (a message or a KV write) from `from` as one frame.
pub fn write_frame<K: WireWords, W: Write>(
    w: &mut W,
    from: NodeId,
    msg: &Carried<K>,
) -> Result<(), WireError> {
    write_frame_with(w, from, msg, &mut Vec::new())
}

/// [`write_frame`] encoding the head into `buf`, a buffer the caller keeps from frame
/// to frame (a connection's writer encodes every head into the same memory instead of
/// asking the allocator for a fresh block per frame). A KV write's payload is written
/// from the message's pages as it is, after the head.
pub fn write_frame_with<K: WireWords, W: Write>(
    w: &mut W,
    from: NodeId,
    msg: &Carried<K>,
    buf: &mut Vec<u8>,
) -> Result<(), WireError> {
    let head = match msg {
        Carried::Write(KvWrite { id, src, dst, kv }) => {
            let bytes: u64 = kv.iter().map(|p| p.wire_words().len() as u64 * 4).sum();
            if bytes > u64::from(MAX_FRAME) {
                return Err(WireError::PayloadTooLong(bytes));
            }
            HeadRef::Kv(KvHeadRef {
                from,
                id: *id,
                src,
                dst,
                words: kv,
            })
        }
        Carried::Msg(msg) => HeadRef::Msg(FrameRef { from, msg }),
    };
    buf.clear();
    *buf = postcard::to_extend(&head, std::mem::take(buf))?;
    let len = u32::try_from(buf.len()).map_err(|_| WireError::TooLong(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(WireError::TooLong(len));
    }
    w.write_all(&len.to_be_bytes())?;
    w.write_all(buf)?;
    match msg {
        Carried::Write(write) => write_payload(w, &write.kv),
        Carried::Msg(_) => Ok(()),
    }
}

/// A decode node's NIXL metadata as one frame (no payload follows).
pub fn nixl_frame(meta: &NixlMeta) -> Result<Vec<u8>, WireError> {
    let head: HeadRef<'_, Vec<u32>> = HeadRef::Nixl(meta);
    let body = postcard::to_stdvec(&head)?;
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    (len <= MAX_FRAME)
        .then_some(())
        .ok_or(WireError::TooLong(len))?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// The pages' words as little-endian bytes: on a little-endian host the words' own
/// memory, every page in one vectored write (a buffered writer passes a payload at
/// least its size straight to the socket, a [`crate::gather::GatherWriter`] one of
/// 16 KiB or more).
fn write_payload<K: WireWords, W: Write>(w: &mut W, kv: &[K]) -> Result<(), WireError> {
    if cfg!(target_endian = "little") {
        let mut parts: Vec<IoSlice<'_>> = kv
            .iter()
            .map(|p| IoSlice::new(bytemuck::cast_slice(p.wire_words())))
            .collect();
        return Ok(write_all_vectored(w, &mut parts)?);
    }
    const WORDS: usize = 1024;
    let mut out = [0u8; WORDS * 4];
    for part in kv.iter().flat_map(|p| p.wire_words().chunks(WORDS)) {
        for (o, word) in out.chunks_exact_mut(4).zip(part) {
            o.copy_from_slice(&word.to_le_bytes());
        }
        w.write_all(&out[..part.len() * 4])?;
    }
    Ok(())
}

/// `write_all` over several buffers, in order.
fn write_all_vectored<W: Write>(w: &mut W, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match w.write_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read one frame; `Ok(None)` at a clean end of the stream.
pub fn read_frame<K: WireWords, R: Read>(r: &mut R) -> Result<Option<Frame<K>>, WireError> {
    read_frame_with(r, &mut Vec::new())
}

/// [`read_frame`] reading the frame's head into `buf`, a buffer the caller keeps from
/// frame to frame (it grows to the largest head seen, never past [`MAX_FRAME`]); a KV
/// write's payload is read into pages of its own; a NIXL metadata frame is passed over.
pub fn read_frame_with<K: WireWords, R: Read>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Frame<K>>, WireError> {
    Ok(match read_head(r, buf)? {
        None => None,
        Some(Head::Nixl(_)) => return read_frame_with(r, buf),
        Some(Head::Msg(MsgFrame { from, msg })) => Some(Frame {
            from,
            msg: Carried::Msg(msg),
        }),
        Some(Head::Kv(h)) => {
            let kv = read_payload(r, &h.words)?;
            let KvHead {
                from, id, src, dst, ..
            } = h;
            Some(Frame {
                from,
                msg: Carried::Write(KvWrite { id, src, dst, kv }),
            })
        }
    })
}

/// Read one frame's head; `Ok(None)` at a clean end of the stream. A KV head's
/// payload follows on `r`: the caller reads it ([`read_payload`],
/// [`FrameReader::read_payload_into`], [`skip_payload`]) before the next head.
pub fn read_head<R: Read + ?Sized>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Head>, WireError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(WireError::TooLong(len));
    }
    buf.resize(len as usize, 0);
    r.read_exact(buf)?;
    let (head, rest) = postcard::take_from_bytes::<Head>(buf)?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    match &head {
        Head::Kv(h) if h.payload_bytes() > u64::from(MAX_FRAME) => {
            Err(WireError::PayloadTooLong(h.payload_bytes()))
        }
        _ => Ok(Some(head)),
    }
}

/// A KV head's payload read into pages of their own, `words[i]` words each.
pub fn read_payload<K: WireWords, R: Read + ?Sized>(
    r: &mut R,
    words: &[u32],
) -> Result<Vec<K>, WireError> {
    let mut kv = Vec::with_capacity(words.len().min(1 << 16));
    for &n in words {
        let mut page = vec![0u32; n as usize];
        r.read_exact(bytemuck::cast_slice_mut(&mut page[..]))?;
        page.iter_mut().for_each(|w| *w = u32::from_le(*w));
        kv.push(K::from_wire_words(page));
    }
    Ok(kv)
}

/// Read and drop `bytes` payload bytes through `scratch` (kept by the caller; it
/// grows to at most 64 KiB): a refused write's payload, never written anywhere.
pub fn skip_payload<R: Read + ?Sized>(
    r: &mut R,
    mut bytes: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    const STEP: u64 = 64 << 10;
    scratch.resize(bytes.min(STEP) as usize, 0);
    while bytes > 0 {
        let n = bytes.min(scratch.len() as u64) as usize;
        r.read_exact(&mut scratch[..n])?;
        bytes -= n as u64;
    }
    Ok(())
}

/// A connection's reader. Heads come through its buffer, which each read fills as far
/// as the stream has bytes; a KV payload ([`FrameReader::read_payload_into`]) takes
/// the bytes the buffer already holds, then is read from the stream straight into its
/// pages, with the buffer's space as the last part of the same vectored read, so the
/// frames that follow come in with it (one system call takes many small frames, and
/// no payload byte passes through the buffer unless it was read ahead with a head).
pub struct FrameReader<R: ?Sized> {
    buf: Box<[u8]>,
    pos: usize,
    filled: usize,
    inner: R,
}

impl<R: Read> FrameReader<R> {
    pub fn with_capacity(capacity: usize, inner: R) -> Self {
        FrameReader {
            buf: vec![0; capacity].into_boxed_slice(),
            pos: 0,
            filled: 0,
            inner,
        }
    }
}

impl<R: Read + ?Sized> FrameReader<R> {
    /// Fill `bufs` completely, in order (`read_exact` over several buffers), failing
    /// once `deadline` has passed between reads (a peer that stalls part way).
    pub fn read_payload_into(
        &mut self,
        mut bufs: &mut [IoSliceMut<'_>],
        deadline: Instant,
    ) -> io::Result<()> {
        let ahead = (&self.buf[self.pos..self.filled]).read_vectored(bufs)?;
        self.pos += ahead;
        IoSliceMut::advance_slices(&mut bufs, ahead);
        while !bufs.is_empty() {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer stalled part way through a KV payload",
                ));
            }
            let want: usize = bufs.iter().map(|b| b.len()).sum();
            let mut parts: Vec<IoSliceMut<'_>> = bufs
                .iter_mut()
                .map(|b| IoSliceMut::new(&mut b[..]))
                .collect();
            parts.push(IoSliceMut::new(&mut self.buf));
            let n = match self.inner.read_vectored(&mut parts) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended part way through a KV payload",
                    ))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            drop(parts);
            IoSliceMut::advance_slices(&mut bufs, n.min(want));
            (self.pos, self.filled) = (0, n.saturating_sub(want));
        }
        Ok(())
    }
}

impl<R: Read + ?Sized> Read for FrameReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.filled && out.len() >= self.buf.len() {
            return self.inner.read(out);
        }
        let n = self.fill_buf()?.read(out)?;
        self.consume(n);
        Ok(n)
    }
}

impl<R: Read + ?Sized> BufRead for FrameReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.filled {
            self.filled = self.inner.read(&mut self.buf)?;
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..self.filled])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.filled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::RoomKey;

    #[test]
    fn frames_round_trip_and_bad_ones_are_named() {
        let f: Frame<Vec<u32>> = Frame {
            from: NodeId(2),
            msg: Carried::Msg(Msg::DrainAck {
                room: RoomKey::new(3, 1),
            }),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, f.from, &f.msg).unwrap();
        write_frame(&mut buf, f.from, &f.msg).unwrap();
        let mut r = &buf[..];
        let a: Frame<Vec<u32>> = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(a.from, NodeId(2));
        assert_eq!(a.msg, f.msg);
        assert!(read_frame::<Vec<u32>, _>(&mut r).unwrap().is_some());
        assert!(read_frame::<Vec<u32>, _>(&mut r).unwrap().is_none());
        let huge = (MAX_FRAME + 1).to_be_bytes();
        let err = read_frame::<Vec<u32>, _>(&mut &huge[..]).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
        let mut junk = 3u32.to_be_bytes().to_vec();
        junk.extend([0xff, 0xff, 0xff]);
        let err = read_frame::<Vec<u32>, _>(&mut &junk[..]).unwrap_err();
        assert!(err.to_string().contains("does not parse"), "{err}");
    }

    /// A frame whose message ends before its length does is refused (postcard reads
    /// a message from the front of its bytes; the rest must be empty), and a KV write
    /// of real pages round-trips word for word.
    #[test]
    fn trailing_bytes_are_refused_and_kv_words_round_trip() {
        use kvsim_engine::ids::{Generation, PageId, PageTag, WriteId};
        let room = RoomKey::new(3, 1);
        let kv = vec![vec![0u32, 1, u32::MAX, 0x3f80_0000, 0xdead_beef]];
        let msg: Carried<Vec<u32>> = Carried::Write(KvWrite {
            id: WriteId {
                writer: NodeId(1),
                epoch: 0,
                room,
                chunk: 0,
            },
            src: Vec::new(),
            dst: vec![PageTag {
                page: PageId(4),
                gen: Generation(2),
            }],
            kv,
        });
        let mut buf = Vec::new();
        write_frame(&mut buf, NodeId(1), &msg).unwrap();
        let back: Frame<Vec<u32>> = read_frame(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(back.msg, msg);
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let mut padded = (len + 1).to_be_bytes().to_vec();
        padded.extend(&buf[4..]);
        padded.push(0);
        let err = read_frame::<Vec<u32>, _>(&mut &padded[..]).unwrap_err();
        assert!(
            err.to_string().contains("1 bytes left after its message"),
            "{err}"
        );
    }

    /// Every reason the engine gives travels in a frame (postcard reads only
    /// self-describing-free forms: an internally tagged enum would not parse).
    #[test]
    fn every_reason_travels_in_a_frame() {
        use kvsim_engine::msg::{Status, Why};
        use kvsim_engine::trace::Side;
        let whys = [
            Why::PromptTooLong {
                tokens: 700,
                limit: 512,
            },
            Why::ReplyTooLong {
                tokens: 700,
                new_tokens: 4,
                limit: 512,
            },
            Why::QueueFull { side: Side::Decode },
            Why::NodeStopped {
                side: Side::Prefill,
            },
            Why::RejectedAtIntake,
            Why::TransferRefused,
            Why::TransferFailed,
            Why::InvalidRequest {
                max_new_tokens_limit: 8,
            },
            Why::NoRoom,
            Why::Timeout,
            Why::DeviceFailed { side: Side::Decode },
        ];
        for why in whys {
            let msg: Carried<Vec<u32>> = Carried::Msg(Msg::DecodeFinished {
                room: RoomKey::new(3, 1),
                status: Status::BAD_REQUEST,
                why: Some(why),
            });
            let mut buf = Vec::new();
            write_frame(&mut buf, NodeId(2), &msg).unwrap();
            let back: Frame<Vec<u32>> = read_frame(&mut &buf[..]).unwrap().unwrap();
            assert_eq!(back.msg, msg, "{why}");
        }
    }

    /// A KV head whose payload lengths add up past [`MAX_FRAME`] is refused before any
    /// byte of the payload is read or any memory is set aside for it, naming the
    /// length. (A KV write inside a message head cannot be written: a `Msg` holds
    /// none.)
    #[test]
    fn a_hostile_payload_length_is_refused_at_the_head() {
        use kvsim_engine::ids::{Generation, PageId, PageTag, WriteId};
        let room = RoomKey::new(3, 1);
        let id = WriteId {
            writer: NodeId(1),
            epoch: 0,
            room,
            chunk: 0,
        };
        let tag = PageTag {
            page: PageId(1),
            gen: Generation(1),
        };
        let head = KvHead {
            from: NodeId(1),
            id,
            src: Vec::new(),
            dst: vec![tag, tag],
            words: vec![u32::MAX, u32::MAX],
        };
        let frame = |bytes: Vec<u8>| {
            let mut f = (bytes.len() as u32).to_be_bytes().to_vec();
            f.extend(bytes);
            f
        };
        // Variant 1 of the head is a KV head.
        let mut bytes = vec![1u8];
        bytes.extend(postcard::to_stdvec(&head).unwrap());
        let f = frame(bytes);
        let err = read_head(&mut &f[..], &mut Vec::new()).unwrap_err();
        let want = format!(
            "KV payload of {} bytes exceeds the limit",
            8 * u64::from(u32::MAX)
        );
        assert!(err.to_string().contains(&want), "{err}");
        let err = read_frame::<Vec<u32>, _>(&mut &f[..]).unwrap_err();
        assert!(err.to_string().contains(&want), "{err}");
    }

    /// A KV write's payload follows its head as the pages' words, 4 bytes each,
    /// little-endian, as they are: the frame is its head and exactly those bytes.
    #[test]
    fn a_kv_payload_travels_as_its_words() {
        use kvsim_engine::ids::{Generation, PageId, PageTag, WriteId};
        let words = vec![vec![1u32, 0xdead_beef], vec![u32::MAX]];
        let msg: Carried<Vec<u32>> = Carried::Write(KvWrite {
            id: WriteId {
                writer: NodeId(1),
                epoch: 0,
                room: RoomKey::new(3, 1),
                chunk: 0,
            },
            src: Vec::new(),
            dst: vec![
                PageTag {
                    page: PageId(1),
                    gen: Generation(1)
                };
                2
            ],
            kv: words,
        });
        let mut buf = Vec::new();
        write_frame(&mut buf, NodeId(1), &msg).unwrap();
        let head = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let payload = &buf[4 + head..];
        let want: Vec<u8> = [1u32, 0xdead_beef, u32::MAX]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(payload, &want[..]);
        let mut r = &buf[..];
        let Some(Head::Kv(h)) = read_head(&mut r, &mut Vec::new()).unwrap() else {
            panic!("a KV head");
        };
        assert_eq!((h.words, r.len()), (vec![2, 1], want.len()));
    }
}
