//! Identifier newtypes shared by every node and driver.
//!
//! Ids are plain counters handed out deterministically (never random draws), so the
//! same inputs always name the same things. They are not capabilities: holding a
//! `PageId` proves nothing about owning the page; a [`PageTag`] (page plus generation)
//! is what ownership checks compare.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A client request, as numbered by whoever submits it (the workload).
    RequestId(u64), "req"
);
id_type!(
    /// A bootstrap room: the router's handle that pairs one prefill half with one decode
    /// half. Room numbers are reused (the router keeps a bounded room table), so a room
    /// is only meaningful together with its [`Generation`]; see [`RoomKey`].
    RoomId(u32), "room"
);
id_type!(
    /// A node (router, prefill, decode) or a client endpoint in the topology.
    NodeId(u16), "n"
);
id_type!(
    /// A physical KV page inside one node's pool. Page 0 is reserved padding.
    PageId(u32), "p"
);
id_type!(
    /// A generation counter: a page's changes on every allocation, a room's on every reuse.
    Generation(u64), "g"
);
id_type!(
    /// The tenant (customer account) a request belongs to.
    TenantId(u32), "t"
);

impl Generation {
    /// A page generation carries the incarnation (epoch) of the node that handed it out
    /// in its high 32 bits and the allocation count within that incarnation in its low
    /// 32 bits, so a node restarted with a higher epoch never hands out a generation it
    /// used before the crash: a late write or read tagged before the crash can never
    /// match an allocation made after it. Room generations do not use the split.
    pub const EPOCH_SHIFT: u32 = 32;

    /// The first generation of epoch `epoch` (no allocation made yet).
    pub const fn first_of_epoch(epoch: u32) -> Generation {
        Generation((epoch as u64) << Self::EPOCH_SHIFT)
    }

    /// The node incarnation a page generation was handed out by.
    pub const fn epoch(self) -> u32 {
        (self.0 >> Self::EPOCH_SHIFT) as u32
    }
}

/// A token id. The toy model never interprets tokens; it only echoes them.
pub type Token = u32;

/// One use of a room: the room number plus the generation it had when the router
/// handed it out. Every message of the handoff carries one, so a late message for an
/// earlier use of a reused room number can be told apart from the current one.
#[derive(
    Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct RoomKey {
    pub room: RoomId,
    pub gen: Generation,
}

impl RoomKey {
    pub const fn new(room: u32, gen: u64) -> Self {
        RoomKey {
            room: RoomId(room),
            gen: Generation(gen),
        }
    }
}

impl fmt::Display for RoomKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.room, self.gen)
    }
}

/// One KV write (one chunk of one room use's transfer), as every event about it names
/// it: the writer node and its incarnation, the room use and the chunk number. Chunk
/// numbers count up per room use within one writer incarnation, so the id is unique in
/// a run; the delivery, the failure and the completion of the write all carry it.
#[derive(
    Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct WriteId {
    pub writer: NodeId,
    pub epoch: u32,
    pub room: RoomKey,
    pub chunk: u32,
}

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "w{}.e{}/{}#{}",
            self.writer.0, self.epoch, self.room, self.chunk
        )
    }
}

/// A page as one owner knows it: the physical page and the generation it had when it
/// was handed to that owner. A tag whose generation differs from the page's current
/// one is stale: the page has been freed and handed out again since.
#[derive(
    Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct PageTag {
    pub page: PageId,
    pub gen: Generation,
}

impl fmt::Display for PageTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.page, self.gen)
    }
}

/// Pages needed to hold `tokens` tokens (`ceil(tokens / page_size)`, as SGLang's
/// `kv_to_page_num`).
pub fn pages_for(tokens: u64, page_size: u32) -> u64 {
    assert!(
        page_size > 0,
        "page_size is validated non-zero by EngineConfig"
    );
    tokens.div_ceil(u64::from(page_size))
}

/// A tag list for humans: all of it when it has at most `max` tags, else the first
/// two, the last and the count.
pub fn fmt_tags(t: &[PageTag], max: usize) -> String {
    if t.len() <= max.max(3) {
        t.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    } else {
        format!(
            "{},{},..,{} ({} pages)",
            t[0],
            t[1],
            t[t.len() - 1],
            t.len()
        )
    }
}
