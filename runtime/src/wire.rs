//! Frames between nodes: a 4-byte big-endian length, then one [`Frame`] in postcard
//! (the engine's own serde form of the message, encoded compactly: integers as
//! variable-length LEB128, so a KV payload of `u32` words costs one to five bytes a
//! word). A frame over [`MAX_FRAME`], one that does not parse, or one with bytes left
//! after its message ends the connection with an error naming the reason. JSON was the
//! first encoding (about 6% of a plain TCP copy), then bincode 1.3 (fixed-width
//! integers), replaced because it is unmaintained (a RustSec advisory); figures in
//! docs/PERFORMANCE.md. A hostile length prefix inside a frame cannot make the reader
//! allocate much past the frame: postcard reads every byte from the frame itself, and
//! serde preallocates at most 1 MiB for a sequence whatever length it claims.

use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::Msg;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// The largest frame accepted, in bytes (a KV write of many host pages fits).
pub const MAX_FRAME: u32 = 256 << 20;

/// One message on the wire, with the node that sent it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Frame<K> {
    pub from: NodeId,
    pub msg: Msg<K>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("frame length {0} exceeds the limit of {MAX_FRAME} bytes")]
    TooLong(u32),
    #[error("frame does not parse: {0}")]
    Parse(#[from] postcard::Error),
    #[error("frame does not parse: {0} bytes left after its message")]
    Trailing(usize),
}

#[derive(Serialize)]
struct FrameRef<'a, K> {
    from: NodeId,
    msg: &'a Msg<K>,
}

/// Write `msg` from `from` as one frame.
pub fn write_frame<K: Serialize, W: Write>(
    w: &mut W,
    from: NodeId,
    msg: &Msg<K>,
) -> Result<(), WireError> {
    write_frame_with(w, from, msg, &mut Vec::new())
}

/// [`write_frame`] encoding into `buf`, a buffer the caller keeps from frame to frame
/// (a connection's writer encodes every frame into the same memory instead of asking
/// the allocator for a fresh, page-faulting block per KV write).
pub fn write_frame_with<K: Serialize, W: Write>(
    w: &mut W,
    from: NodeId,
    msg: &Msg<K>,
    buf: &mut Vec<u8>,
) -> Result<(), WireError> {
    buf.clear();
    *buf = postcard::to_extend(&FrameRef { from, msg }, std::mem::take(buf))?;
    let len = u32::try_from(buf.len()).map_err(|_| WireError::TooLong(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(WireError::TooLong(len));
    }
    w.write_all(&len.to_be_bytes())?;
    w.write_all(buf)?;
    Ok(())
}

/// Read one frame; `Ok(None)` at a clean end of the stream.
pub fn read_frame<K: DeserializeOwned, R: Read>(r: &mut R) -> Result<Option<Frame<K>>, WireError> {
    read_frame_with(r, &mut Vec::new())
}

/// [`read_frame`] reading the frame's bytes into `buf`, a buffer the caller keeps from
/// frame to frame (it grows to the largest frame seen, never past [`MAX_FRAME`]).
pub fn read_frame_with<K: DeserializeOwned, R: Read>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Frame<K>>, WireError> {
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
    let (frame, rest) = postcard::take_from_bytes(buf)?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    Ok(Some(frame))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::RoomKey;

    #[test]
    fn frames_round_trip_and_bad_ones_are_named() {
        let f: Frame<Vec<u32>> = Frame {
            from: NodeId(2),
            msg: Msg::DrainAck {
                room: RoomKey::new(3, 1),
            },
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
        let msg: Msg<Vec<u32>> = Msg::KvWrite {
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
        };
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
            let msg: Msg<Vec<u32>> = Msg::DecodeFinished {
                room: RoomKey::new(3, 1),
                status: Status::BAD_REQUEST,
                why: Some(why),
            };
            let mut buf = Vec::new();
            write_frame(&mut buf, NodeId(2), &msg).unwrap();
            let back: Frame<Vec<u32>> = read_frame(&mut &buf[..]).unwrap().unwrap();
            assert_eq!(back.msg, msg, "{why}");
        }
    }
}
