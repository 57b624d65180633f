//! The node book: what the oracle knows of one node (its role and incarnation, every
//! page's lifecycle state, generation, owner, holders and provenance, the halves it
//! has open, its quarantines, whether it stopped itself). The data of the pages
//! checker ([`super::pages`]), which changes it and judges the page rules against it.
//! Invariant: page 0 is padding and is never handed out; the open halves and the
//! quarantines are sorted sets.

use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey};
use kvsim_engine::kv::PageState;
use kvsim_engine::node::Role;

/// Who wrote a page's slots last: the room use, the contiguous slot range `lo..hi` it
/// covered, and the sequence position that write meant for the page's slot 0 (`at`:
/// slot `s` holds the KV of position `at + s`; `None` where the trace does not say,
/// a `KvWritten` without `pos`). Slots outside the range hold an earlier writer's KV
/// (stale); a write meant for other positions is another writer's as far as the
/// range goes.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Provenance {
    pub writer: Option<RoomKey>,
    pub at: Option<u64>,
    pub lo: u32,
    pub hi: u32,
}

impl Provenance {
    /// The provenance after `writer` writes slot `slot`, meant for position `at + slot`.
    pub fn after_write(self, writer: RoomKey, at: Option<u64>, slot: u32) -> Provenance {
        let same = self.writer == Some(writer) && self.at == at;
        if same && slot >= self.lo && slot <= self.hi {
            Provenance {
                hi: self.hi.max(slot + 1),
                ..self
            }
        } else if same && slot + 1 == self.lo {
            Provenance { lo: slot, ..self }
        } else {
            Provenance {
                writer: Some(writer),
                at,
                lo: slot,
                hi: slot + 1,
            }
        }
    }

    /// The provenance after `writer` writes `slots`, one after another (meant for the
    /// positions `at + slot`): what [`Provenance::after_write`] gives slot by slot.
    /// Once a slot extends the writer's range (it lies in `lo..=hi`), every later slot
    /// of the run does too, so the rest of the run only raises `hi` to its end.
    pub fn after_writes(
        self,
        writer: RoomKey,
        at: Option<u64>,
        slots: std::ops::Range<u32>,
    ) -> Provenance {
        let mut p = self;
        for s in slots.clone() {
            if p.writer == Some(writer) && p.at == at && p.lo <= s && s <= p.hi {
                return Provenance {
                    hi: p.hi.max(slots.end),
                    ..p
                };
            }
            p = p.after_write(writer, at, s);
        }
        p
    }

    /// The provenance after a KV write of provenance `landed` lands over this page: a
    /// write places only the slots it carries, so a landing of the same writer, meant
    /// for the same positions, over slots that writer already holds (a late copy of
    /// its own write) keeps the rest of its range; any other landing takes the page's
    /// provenance.
    pub fn after_landing(self, landed: Provenance) -> Provenance {
        let overlaps = landed.lo <= self.hi && self.lo <= landed.hi;
        let same = landed.writer == self.writer && landed.at == self.at;
        if landed.writer.is_some() && same && overlaps {
            Provenance {
                writer: self.writer,
                at: self.at,
                lo: self.lo.min(landed.lo),
                hi: self.hi.max(landed.hi),
            }
        } else {
            landed
        }
    }

    /// Did `writer` write slots `0..need`?
    pub fn covers(&self, writer: RoomKey, need: u32) -> bool {
        self.writer == Some(writer) && self.lo == 0 && self.hi >= need
    }

    /// Were the slots written for the positions from `start` (the page read as the one
    /// holding positions `start..`)? A write whose trace states no position is taken
    /// as meant for where it is read.
    pub fn meant_for(&self, start: u64) -> bool {
        self.at.is_none_or(|at| at == start)
    }
}

/// One page as the oracle knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageFact {
    pub state: PageState,
    pub gen: Generation,
    pub owner: Option<RoomKey>,
    pub holders: u16,
    pub prov: Provenance,
    /// The page holds bytes of a KV write that landed unchecked (no landing gate: a
    /// one-sided transport, or the gate off) when the page was not its room use's (a
    /// stray landing). S2 is then judged by its effect: violated when a read accepts
    /// those bytes, detected when the read-time tag check or verification refuses
    /// them; cleared without a finding when they are overwritten or zeroed unread.
    pub stray: bool,
    /// A KV write of the page's owner landed in it, at its generation, while it was
    /// that room use's transfer destination (`Writing`): the trace's own record of
    /// "this reserved page was written", for S4. Decode cannot note it on a one-sided
    /// transport (nothing runs at the receiver), so the oracle keeps it from the
    /// `KvLanded` records. Cleared when the page leaves `Writing` for anything but
    /// `Ready`, and once the accepted transfer is judged.
    pub landed: bool,
}

/// Written by hand: the model checker hashes these on every transition, so each page
/// is packed into five words. It hashes exactly the fields `Eq` compares.
impl std::hash::Hash for PageFact {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let room =
            |k: Option<RoomKey>| k.map_or((0u64, 0u64), |k| (u64::from(k.room.0) + 1, k.gen.0));
        let (owner_room, owner_gen) = room(self.owner);
        let (writer_room, writer_gen) = room(self.prov.writer);
        h.write_u64(self.state as u64 | u64::from(self.holders) << 8 | owner_room << 24);
        h.write_u64(self.gen.0 ^ owner_gen.rotate_left(32));
        let flags = u64::from(self.stray) | u64::from(self.landed) << 1;
        h.write_u64(writer_room | flags << 32 | u64::from(self.prov.lo) << 40);
        h.write_u64(writer_gen ^ u64::from(self.prov.hi).rotate_left(48));
        h.write_u64(self.prov.at.map_or(0, |at| at.wrapping_add(1)));
    }
}

/// One node as the oracle knows it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct NodeBook {
    pub role: Role,
    pub epoch: u32,
    /// Index = page id; page 0 is padding and never used.
    pub pages: Vec<PageFact>,
    /// Halves admitted here and not yet answered.
    pub open: Vec<RoomKey>,
    /// Room uses quarantined here and not yet released.
    pub quarantined: Vec<RoomKey>,
    /// The node stopped itself loudly (a drain ack never came).
    pub stopped: bool,
}

impl NodeBook {
    pub(super) fn new(role: Role, pool_pages: u32, epoch: u32) -> Self {
        let fact = PageFact {
            state: PageState::Free,
            gen: Generation::first_of_epoch(epoch),
            owner: None,
            holders: 0,
            prov: Provenance::default(),
            stray: false,
            landed: false,
        };
        NodeBook {
            role,
            epoch,
            pages: vec![fact; pool_pages as usize + 1],
            open: Vec::new(),
            quarantined: Vec::new(),
            stopped: false,
        }
    }

    pub fn page(&self, p: PageId) -> Option<&PageFact> {
        (p.0 != 0).then(|| self.pages.get(p.0 as usize)).flatten()
    }

    pub(super) fn page_mut(&mut self, p: PageId) -> Option<&mut PageFact> {
        if p.0 == 0 {
            return None;
        }
        self.pages.get_mut(p.0 as usize)
    }

    /// The pages of the pool (page 0, the padding, left out).
    pub fn pool_pages(&self) -> usize {
        self.pages.len().saturating_sub(1)
    }

    /// Is `t` a page of `room` at its generation, in a state that lets the room write
    /// or send it?
    pub(super) fn owns(&self, room: RoomKey, t: &PageTag) -> bool {
        self.page(t.page)
            .is_some_and(|p| p.gen == t.gen && p.owner == Some(room) && p.state.is_owned())
    }

    /// What must hold of a book after every change.
    pub(super) fn check(&self) {
        debug_assert!(!self.pages.is_empty(), "page 0 (padding) is always there");
        debug_assert!(
            self.pages[0].state == PageState::Free && self.pages[0].owner.is_none(),
            "page 0 is padding and is never handed out"
        );
        debug_assert!(
            self.open.windows(2).all(|w| w[0] < w[1])
                && self.quarantined.windows(2).all(|w| w[0] < w[1]),
            "the open halves and the quarantines are sorted sets"
        );
    }
}
