//! The packed page word of the shared record: a page's generation, state and holder
//! count in one `u64` ([`Word`]), and the bounds that layout sets ([`GENERATION_MAX`]).
//! Plain arithmetic: no atomics, no lock.

use crate::kv::lifecycle::PageState;

/// The most generations one page can go through: the word keeps 45 bits of it. At one
/// allocation of the same page per microsecond that lasts more than a year; running
/// out is a broken limit and panics rather than wrap (a wrapped generation would make
/// a stale tag current again).
pub const GENERATION_MAX: u64 = (1 << (64 - GEN_SHIFT)) - 1;

// Layout of a page word: holders in bits 0..16, the state in bits 16..19, the
// generation in bits 19..64. Holders sit lowest so that the planted race's
// `fetch_add(1)` is a holder increment.
const HOLDERS_MASK: u64 = 0xffff;
const STATE_SHIFT: u32 = 16;
const STATE_MASK: u64 = 0b111;
const GEN_SHIFT: u32 = 19;

/// One page's word, unpacked. Only [`Word::pack`] writes page words, so every word in
/// the record unpacks to a valid state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Word {
    pub(super) gen: u64,
    pub(super) state: PageState,
    pub(super) holders: u16,
}

impl Word {
    pub(super) fn pack(self) -> u64 {
        debug_assert!(self.gen <= GENERATION_MAX);
        let code: u64 = match self.state {
            PageState::Free => 0,
            PageState::Reserved => 1,
            PageState::Writing => 2,
            PageState::Ready => 3,
            PageState::Draining => 4,
            PageState::Quarantined => 5,
        };
        let bits = (self.gen << GEN_SHIFT) | (code << STATE_SHIFT) | u64::from(self.holders);
        // The three fields do not bleed into each other.
        debug_assert_eq!(bits & HOLDERS_MASK, u64::from(self.holders));
        debug_assert_eq!((bits >> STATE_SHIFT) & STATE_MASK, code);
        bits
    }

    pub(super) fn unpack(bits: u64) -> Word {
        let state = match (bits >> STATE_SHIFT) & STATE_MASK {
            0 => PageState::Free,
            1 => PageState::Reserved,
            2 => PageState::Writing,
            3 => PageState::Ready,
            4 => PageState::Draining,
            5 => PageState::Quarantined,
            code => {
                panic!("page word {bits:#x} has state code {code}: only Word::pack writes words")
            }
        };
        let w = Word {
            gen: bits >> GEN_SHIFT,
            state,
            holders: (bits & HOLDERS_MASK) as u16,
        };
        debug_assert!(w.gen <= GENERATION_MAX, "45 bits of generation");
        debug_assert_eq!(w.pack(), bits, "a word packs back to the bits it came from");
        w
    }
}
