//! The answers checker: the requests submitted and not yet answered, and the answered
//! request ids (as ranges, so it stays bounded).
//!
//! It judges what a request may get: nothing past its limit (S5, or L5 when it fits
//! the context and was admitted beyond the pool), one honest answer (S6: no second
//! terminal response, no 200 after the abort or the failed transfer, no 200 for a
//! request that must be rejected, a half's repeat with its first status), a reply that
//! is exactly what echo attention over its own prompt yields (S10), and no other
//! request's prompt in it (the canary, S3). Invariant: the pending requests are sorted
//! by id, one per id; the answered ranges are sorted, disjoint and do not touch.

use super::pages::Pages;
use super::rooms::{RoomFacts, RoomFlag, Rooms};
use super::{draft, Drafts};
use crate::schema::RunHeader;
use crate::shared::Shared;
use kvsim_engine::gpu::query_position;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, TenantId, Token};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Status;
use kvsim_engine::trace::Side;

/// A request submitted and not yet answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Pending {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prompt_len: u64,
}

/// The requests in flight and the answered ids; each list is shared and hashed as one
/// part.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Answers {
    /// Submitted and unanswered, sorted.
    pub pending: Shared<Vec<Pending>>,
    /// Answered request ids, as sorted disjoint closed ranges.
    pub answered: Shared<Vec<(u64, u64)>>,
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            pending: Shared::new(Vec::new()),
            answered: Shared::new(Vec::new()),
        }
    }
}

impl Answers {
    /// The same lists, shared (see [`crate::OracleState::same_parts`]).
    pub(crate) fn same_parts(&self, other: &Answers) -> bool {
        self.pending.same(&other.pending) && self.answered.same(&other.answered)
    }

    /// The client submitted `p`.
    pub fn submitted(&mut self, p: Pending) {
        if let Err(i) = self.pending.get().binary_search_by_key(&p.req, |p| p.req) {
            self.pending.edit().insert(i, p);
        }
        self.check();
    }

    /// Submitted and unanswered, sorted.
    pub fn pending(&self) -> &[Pending] {
        self.pending.get()
    }

    pub fn is_answered(&self, req: RequestId) -> bool {
        let answered = self.answered.get();
        let i = answered.partition_point(|(_, hi)| *hi < req.0);
        answered.get(i).is_some_and(|(lo, _)| *lo <= req.0)
    }

    /// Record `req` as answered (merging ranges that come to touch).
    pub fn answer(&mut self, req: RequestId) {
        let r = req.0;
        {
            let mut answered = self.answered.edit();
            let i = answered.partition_point(|(_, hi)| hi.saturating_add(1) < r);
            match answered.get_mut(i) {
                Some((lo, hi)) if *lo <= r.saturating_add(1) => {
                    *lo = (*lo).min(r);
                    *hi = (*hi).max(r);
                    // Merge with the next range if they now touch.
                    if let Some(&(nlo, nhi)) = answered.get(i + 1) {
                        if nlo <= answered[i].1.saturating_add(1) {
                            answered[i].1 = answered[i].1.max(nhi);
                            answered.remove(i + 1);
                        }
                    }
                }
                _ => answered.insert(i, (r, r)),
            }
        }
        debug_assert!(self.is_answered(req), "{req} is answered once recorded");
        self.check();
    }

    /// What must hold after every change.
    fn check(&self) {
        debug_assert!(
            self.pending().windows(2).all(|w| w[0].req < w[1].req),
            "the pending requests are sorted by id, one per id"
        );
        debug_assert!(
            self.answered.get().iter().all(|(lo, hi)| lo <= hi)
                && self
                    .answered
                    .get()
                    .windows(2)
                    .all(|w| w[0].1.saturating_add(1) < w[1].0),
            "the answered ranges are sorted, disjoint and do not touch"
        );
    }
}

/// Intake limits: S5 and L5.
impl Answers {
    /// S5 (or L5) when a request that exceeds `node`'s limit gets something there.
    pub fn check_retired(
        &self,
        (h, rooms, pages): (&RunHeader, &Rooms, &Pages),
        (node, room): (NodeId, RoomKey),
        what: &dyn std::fmt::Display,
        out: &mut Drafts,
    ) {
        let (Some(f), Some(side)) = (rooms.get(room), pages.side_of(node)) else {
            return;
        };
        if !must_reject_room(h, f, side) {
            return;
        }
        let (need, flag) = match side {
            Side::Prefill => (f.prompt_len, RoomFlag::FlaggedPrefill),
            Side::Decode => (
                f.prompt_len.saturating_add(u64::from(f.max_new_tokens)),
                RoomFlag::FlaggedDecode,
            ),
        };
        let limit = h.limit(node);
        let d = rooms.describe(room);
        // A request within the context that the node never flagged was admitted beyond
        // its pool (L5, SGLang #29249); one it flagged as rejected, or one beyond the
        // context, and then served is rejected-but-live (S5, the GLM-5.3 incident).
        if need <= h.context_len && !f.flags.contains(flag) {
            out.push(draft(Invariant::L5, Some(room), format!(
                "{d} needs more than {node}'s pool of {limit} tokens, yet it {what}: admitted beyond the pool"
            )));
        } else {
            out.push(draft(Invariant::S5, Some(room), format!(
                "{d} exceeds {node}'s limit of {limit} tokens and must be rejected at intake, but it {what}"
            )));
        }
    }

    /// L5: `room` reserved `n` pages on `node`, whose pool has `cap`.
    pub fn reserved_beyond_pool(
        &self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        n: usize,
        cap: usize,
        out: &mut Drafts,
    ) {
        if n > cap {
            out.push(draft(
                Invariant::L5,
                Some(room),
                format!(
                    "{} reserved {n} pages on {node}, whose pool has {cap}",
                    rooms.describe(room),
                ),
            ));
        }
    }
}

/// Answers of the halves and of the router: S6, S10, the canary.
impl Answers {
    /// S6 for a half's answers: the first answer of each half is recorded, and a repeat
    /// (the node answering an abort again, after a lost answer) must carry the first
    /// status; a repeat is judged only for this and changes nothing else. Returns
    /// whether `status` repeats an earlier answer of `side`.
    pub fn repeated_answer(
        &self,
        rooms: &mut Rooms,
        (node, room): (NodeId, RoomKey),
        side: Side,
        status: Status,
        out: &mut Drafts,
    ) -> bool {
        let half = usize::from(side == Side::Decode);
        match rooms.first_answer(room, half) {
            None => false,
            Some(None) => {
                rooms.set_first_answer(room, half, status);
                false
            }
            Some(Some(first)) => {
                if first != status {
                    let what = rooms.describe(room);
                    out.push(draft(
                        Invariant::S6,
                        Some(room),
                        format!("{node} answered {status} for {what} after answering {first}"),
                    ));
                }
                true
            }
        }
    }

    /// S6 on a half's first answer: no 200 from prefill after its abort became
    /// visible, none from decode after its KV transfer failed.
    pub fn responded(
        &self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        side: Side,
        status: Status,
        out: &mut Drafts,
    ) {
        if status.is_ok() && side == Side::Prefill && rooms.has(room, RoomFlag::PrefillAborted) {
            out.push(draft(
                Invariant::S6,
                Some(room),
                format!(
                    "prefill {node} answered 200 for {} after its abort became visible",
                    rooms.describe(room)
                ),
            ));
        }
        if status.is_ok() && side == Side::Decode && rooms.has(room, RoomFlag::TransferFailed) {
            out.push(draft(
                Invariant::S6,
                Some(room),
                format!(
                    "decode {node} answered 200 for {} after its KV transfer failed",
                    rooms.describe(room)
                ),
            ));
        }
    }

    /// The router's terminal response to `req` (served by `room`, if known): S6 for a
    /// second one or a 200 to a request that must be rejected, the canary and S10.
    pub fn router_response(
        &mut self,
        (h, rooms): (&RunHeader, &Rooms),
        (req, room): (RequestId, Option<RoomKey>),
        status: Status,
        tokens: &[Token],
        out: &mut Drafts,
    ) {
        if self.is_answered(req) {
            out.push(draft(
                Invariant::S6,
                room,
                format!("{req} got a second terminal response ({status})"),
            ));
        }
        self.answer(req);
        if let Ok(i) = self.pending().binary_search_by_key(&req, |p| p.req) {
            self.pending.edit().remove(i);
        }
        self.check();
        let facts = room.and_then(|r| rooms.get(r));
        if let Some(f) = facts {
            let rejected =
                must_reject_room(h, f, Side::Prefill) || must_reject_room(h, f, Side::Decode);
            if status.is_ok() && rejected {
                out.push(draft(
                    Invariant::S6,
                    room,
                    format!(
                        "{req} does not fit the pool and must be rejected, but the client got 200"
                    ),
                ));
            }
        }
        if h.canary_tokens {
            canary(rooms, (req, room), status, tokens, out);
        }
        if let (true, true, true, Some(f)) =
            (h.canary_tokens, h.echo_replies, status.is_ok(), facts)
        {
            if let Some(d) = reply_error(req, f.prompt_len, f.max_new_tokens, tokens) {
                out.push(draft(Invariant::S10, room, d));
            }
        }
    }
}

/// The black-box canary check of one reply: every token must come from the
/// request's own prompt (or be generated from it).
fn canary(
    rooms: &Rooms,
    (req, room): (RequestId, Option<RoomKey>),
    status: Status,
    tokens: &[Token],
    out: &mut Drafts,
) {
    let stranger = tokens.iter().find_map(|&t| {
        crate::canary::owner(t)
            .filter(|o| *o != req)
            .map(|o| (t, o))
    });
    if let Some((t, owner)) = stranger {
        out.push(draft(Invariant::S3, room, format!(
                "canary: the {status} reply to {req} echoes token {t:#010x} from the prompt of {owner}"
            )).with_related(rooms.of_request(owner)));
    }
}

/// Must `side` reject the request of this room at intake (its own limit)?
fn must_reject_room(h: &RunHeader, f: &RoomFacts, side: Side) -> bool {
    must_reject(h, side, f.prefill, f.decode, f.prompt_len, f.max_new_tokens)
}

/// Must `side` reject, at intake, a request of `prompt_len` tokens asking for
/// `max_new_tokens` more, paired with these prefill and decode nodes? Prefill holds
/// the prompt (a deployment that truncates serves an over-length prompt cut short);
/// decode holds the prompt and the reply. Each against its own `min(context, pool)`.
pub fn must_reject(
    h: &RunHeader,
    side: Side,
    prefill: NodeId,
    decode: NodeId,
    prompt_len: u64,
    max_new_tokens: u32,
) -> bool {
    match side {
        Side::Prefill => !h.allow_auto_truncate && prompt_len > h.limit(prefill),
        Side::Decode => prompt_len.saturating_add(u64::from(max_new_tokens)) > h.limit(decode),
    }
}

/// S10: what is wrong with a 200 reply to `req` (a `prompt_len`-token canary prompt,
/// `max_new_tokens` asked for), or `None` when it is exactly what echo attention over
/// the request's own prompt yields: one token per step (there is no stop rule), token
/// `s` the prompt token at [`query_position`]`(s, max_new_tokens, prompt_len)`.
pub fn reply_error(
    req: RequestId,
    prompt_len: u64,
    max_new_tokens: u32,
    tokens: &[Token],
) -> Option<String> {
    if tokens.len() as u64 != u64::from(max_new_tokens) {
        return Some(format!(
            "the 200 reply to {req} has {} tokens; it asked for {max_new_tokens}",
            tokens.len()
        ));
    }
    for (s, &got) in (0u32..).zip(tokens) {
        let q = query_position(s, max_new_tokens, prompt_len);
        let want = crate::canary::prompt_token(req, q);
        if got != want {
            return Some(format!(
                "token {s} of the 200 reply to {req} is {got:#010x}; echo attention over its own prompt (position {q}) yields {want:#010x}"
            ));
        }
    }
    None
}
