//! Frames between nodes: a 4-byte big-endian length, then one [`Frame`] in bincode
//! (the engine's own serde form of the message, encoded compactly: little-endian
//! fixed-width integers, so a KV payload of `u32` words costs four bytes a word). A
//! frame over [`MAX_FRAME`] or one that does not parse ends the connection with an
//! error naming the reason. JSON was the first encoding; it held the transfer path to
//! about 6% of a plain TCP copy (docs/PERFORMANCE.md).

use bincode::Options;
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
    Parse(#[from] bincode::Error),
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
    codec().serialize_into(&mut *buf, &FrameRef { from, msg })?;
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
    Ok(Some(codec().deserialize(buf)?))
}

/// The frame codec: bincode with fixed-width integers, no trailing bytes, and a limit
/// on what a frame may make the reader allocate (a hostile length prefix inside a
/// frame cannot ask for more than the frame's own size).
fn codec() -> impl bincode::Options + Copy {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
        .with_limit(u64::from(MAX_FRAME))
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

    /// Every reason the engine gives travels in a frame (bincode reads only
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
