//! The transfer checker: decode's verdict on a transfer completion. It owns no state:
//! what it needs (the room's true prompt length and prefill node, whether the
//! transfer was reported failed) is in the room registry.
//!
//! It judges a completion accepted from a node that is not the room's prefill (S7),
//! an accepted transfer whose lengths disagree (S4, violated), and a refused one (S4,
//! detected by verification: the request failed instead).

use super::rooms::{RoomFlag, Rooms};
use super::{draft, Drafts};
use kvsim_engine::ids::{NodeId, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TransferClaim;

/// Why `claim` breaks length agreement for a request of `true_len` tokens (if known),
/// or `None` when prefill and decode agree ([`length_disagreement`]).
pub fn disagreement(claim: &TransferClaim, true_len: Option<u64>) -> Option<String> {
    length_disagreement(
        true_len,
        claim.prompt_len,
        claim.reserved_pages,
        claim.sent_tokens,
        claim.sent_pages,
        claim.fully_written,
    )
}

/// Decode `node` accepted the transfer of `room` on a completion from `claim.from`: S7
/// when that is not the room's prefill node, S4 when the lengths disagree (unless the
/// transfer was already reported failed).
pub fn accepted(
    rooms: &Rooms,
    (node, room): (NodeId, RoomKey),
    claim: &TransferClaim,
    out: &mut Drafts,
) {
    let from = claim.from;
    if let Some(f) = rooms.get(room) {
        if f.prefill != from {
            out.push(draft(Invariant::S7, Some(room), format!(
                "decode {node} accepted the transfer of {} on a completion from {from}, which is not its prefill node {}",
                rooms.describe(room),
                f.prefill
            )));
        }
    }
    if rooms.has(room, RoomFlag::TransferFailed) {
        return;
    }
    if let Some(p) = disagreement(claim, rooms.get(room).map(|f| f.prompt_len)) {
        out.push(draft(
            Invariant::S4,
            Some(room),
            format!(
                "decode {node} accepted the transfer of {}: {p}",
                rooms.describe(room)
            ),
        ));
    }
}

/// Decode `node`'s verification refused the transfer of `room` for `why`: S4 detected.
pub fn refused(rooms: &Rooms, (node, room): (NodeId, RoomKey), why: &str, out: &mut Drafts) {
    out.push(draft(Invariant::S4, Some(room), format!(
            "decode {node}'s verification refused the transfer of {} that prefill reported complete: {why}; the request failed instead",
            rooms.describe(room)
        )).detected(Some("verify_on_completion")));
}

/// S4: why an accepted transfer breaks length agreement, given the request's true
/// prompt length (if known), or `None` when prefill and decode agree.
pub fn length_disagreement(
    true_len: Option<u64>,
    prompt_len: u64,
    reserved_pages: u32,
    sent_tokens: u64,
    sent_pages: u32,
    fully_written: bool,
) -> Option<String> {
    if true_len.is_some_and(|t| t != prompt_len) || sent_tokens != prompt_len {
        Some(format!(
            "decode expects {prompt_len} tokens, prefill sent {sent_tokens} (true prompt {})",
            true_len.map_or("?".into(), |l| l.to_string())
        ))
    } else if sent_pages != reserved_pages {
        Some(format!(
            "decode reserved {reserved_pages} pages, prefill sent {sent_pages}"
        ))
    } else if !fully_written {
        Some("some reserved page was never written".to_string())
    } else {
        None
    }
}
