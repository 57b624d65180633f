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
    let body = codec().serialize(&FrameRef { from, msg })?;
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLong(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(WireError::TooLong(len));
    }
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&body)?;
    Ok(())
}

/// Read one frame; `Ok(None)` at a clean end of the stream.
pub fn read_frame<K: DeserializeOwned, R: Read>(r: &mut R) -> Result<Option<Frame<K>>, WireError> {
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
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(Some(codec().deserialize(&body)?))
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
}
