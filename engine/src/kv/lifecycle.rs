//! The page lifecycle: states, operations and the one legal-transition table.
//!
//! Every structure that tracks page ownership (the single-threaded [`super::PagePool`]
//! and any concurrent record built for the hardware runtime) moves pages only through
//! [`transition`], so the two cannot drift apart. A transition missing from
//! [`TRANSITIONS`] is a bug in the caller and is reported as [`IllegalTransition`].

use serde::{Deserialize, Serialize};
use std::fmt;
use strum::{EnumCount, VariantArray};

/// Where a page is in its life. Exactly one state at a time.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
)]
pub enum PageState {
    /// On the free list; no owner, no holders. Its contents are stale, never zeroed.
    Free,
    /// Allocated to one owner; nothing written yet.
    Reserved,
    /// Allocated, and a remote transfer into it is expected or in progress.
    Writing,
    /// Allocated and holding the owner's verified KV.
    Ready,
    /// Released by its owner while other paths still hold it; returns to Free when the
    /// last holder lets go.
    Draining,
    /// Released by an aborted owner while a remote write may still land in it; returns
    /// to Free only once the writer has acked that its writes have drained.
    Quarantined,
}

impl PageState {
    /// States in which the page belongs to exactly one owner.
    pub fn is_owned(self) -> bool {
        let owned = matches!(
            self,
            PageState::Reserved | PageState::Writing | PageState::Ready
        );
        // The table agrees: exactly an owned page may be released or quarantined.
        // Facts of the constant table, which the tests walk: debug only.
        debug_assert_eq!(owned, transition(self, PageOp::Release).is_ok());
        debug_assert_eq!(owned, transition(self, PageOp::Quarantine).is_ok());
        owned
    }

    /// States in which a remote KV write of the owner may land (the landing gate,
    /// `kv::land`): owned with the transfer still open, or quarantined (its writes may
    /// still come). Not `Ready`: decode accepted the transfer after the writer's last
    /// completion, and appends its own KV to the last page.
    pub fn takes_remote_writes(self) -> bool {
        let takes = matches!(
            self,
            PageState::Reserved | PageState::Writing | PageState::Quarantined
        );
        // A page that takes a write may be held for it; a page whose transfer is
        // expected (Writing) always takes it.
        // Facts of the constant table, which the tests walk: debug only.
        debug_assert!(
            !takes || check_hold(self).is_ok(),
            "{self} takes writes unheld"
        );
        debug_assert!(takes || self != PageState::Writing);
        takes
    }
}

impl fmt::Display for PageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every state is listed once in the table of all states the tests walk.
        // Facts of the constant tables: debug only.
        debug_assert_eq!(ALL_STATES.iter().filter(|s| *s == self).count(), 1);
        debug_assert!(TRANSITIONS
            .iter()
            .any(|(from, _, to)| from == self || to == self));
        fmt::Debug::fmt(self, f)
    }
}

/// What a caller asks to do to a page.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
)]
pub enum PageOp {
    /// Hand a free page to an owner (the generation changes).
    Allocate,
    /// Announce that a remote transfer will write the page.
    ExpectWrite,
    /// The page holds verified KV (local forward done, or transfer verified).
    MarkReady,
    /// The owner lets go and nobody else holds the page.
    Release,
    /// The owner lets go while another path still holds the page.
    ReleaseHeld,
    /// The owner aborted while remote writes may be in flight.
    Quarantine,
    /// The last holder of a draining page let go.
    LastHolderGone,
    /// The writer acked that its writes have drained, nobody holds the page.
    DrainAcked,
    /// The writer acked, but another path still holds the page.
    DrainAckedHeld,
}

/// The legal-transition table: `(from, op, to)`. Anything absent is illegal.
pub const TRANSITIONS: &[(PageState, PageOp, PageState)] = {
    use PageOp::*;
    use PageState::*;
    &[
        (Free, Allocate, Reserved),
        (Reserved, ExpectWrite, Writing),
        (Reserved, MarkReady, Ready),
        (Writing, MarkReady, Ready),
        (Reserved, Release, Free),
        (Writing, Release, Free),
        (Ready, Release, Free),
        (Reserved, ReleaseHeld, Draining),
        (Writing, ReleaseHeld, Draining),
        (Ready, ReleaseHeld, Draining),
        (Reserved, Quarantine, Quarantined),
        (Writing, Quarantine, Quarantined),
        (Ready, Quarantine, Quarantined),
        (Draining, LastHolderGone, Free),
        (Quarantined, DrainAcked, Free),
        (Quarantined, DrainAckedHeld, Draining),
    ]
};

/// A transition that the table does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal page transition: {op:?} from {from}")]
pub struct IllegalTransition {
    pub from: PageState,
    pub op: PageOp,
}

/// Look up `(from, op)` in [`TRANSITIONS`].
pub fn transition(from: PageState, op: PageOp) -> Result<PageState, IllegalTransition> {
    let to = TRANSITIONS
        .iter()
        .find(|(f, o, _)| *f == from && *o == op)
        .map(|(_, _, to)| *to)
        .ok_or(IllegalTransition { from, op })?;
    // O(table) on every lookup, a fact of the constant table: debug only.
    debug_assert_eq!(
        TRANSITIONS
            .iter()
            .filter(|(f, o, _)| *f == from && *o == op)
            .count(),
        1,
        "the table is deterministic"
    );
    // A fact of the constant table, which the tests walk: debug only.
    debug_assert_ne!(from, to, "every legal step moves the page");
    Ok(to)
}

/// Whether other paths (a send, an offload, a transfer receiver) hold a page as its
/// owner lets go of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holders {
    /// No hold: the page may go back to Free.
    Absent,
    /// At least one hold: the page waits in Draining for the last one.
    Present,
}

impl Holders {
    /// The holders a page record counts.
    pub fn counted(holders: u16) -> Self {
        if holders > 0 {
            Holders::Present
        } else {
            Holders::Absent
        }
    }
}

/// The form an owner's let-go takes when other paths may still hold the page.
///
/// `Release` and `DrainAcked` each have a `*Held` twin that parks the page in Draining
/// instead of freeing it, so a page never returns to Free under a holder. Both the
/// single-threaded pool and the concurrent record pick the operation here, from the
/// holder count they see in the same step as the transition.
pub fn let_go_op(op: PageOp, holders: Holders) -> PageOp {
    let chosen = match (op, holders) {
        (PageOp::Release, Holders::Present) => PageOp::ReleaseHeld,
        (PageOp::DrainAcked, Holders::Present) => PageOp::DrainAckedHeld,
        (op, _) => op,
    };
    // Restates the match above: debug only.
    debug_assert!(
        holders == Holders::Present || chosen == op,
        "without holders the operation is unchanged"
    );
    // A held twin never frees: every step it takes parks the page in Draining.
    // O(table), a fact of the constant table: debug only.
    debug_assert!(
        chosen == op
            || TRANSITIONS
                .iter()
                .filter(|(_, o, _)| *o == chosen)
                .all(|(_, _, to)| *to == PageState::Draining)
    );
    chosen
}

/// May a path other than the owner (a send, an offload, a transfer receiver) take a
/// hold on a page in `state`?
///
/// Only while the page has an owner or is quarantined for one: a hold on a Free or
/// Draining page would keep a page alive that nobody will release. A refusal names
/// the `ReleaseHeld` step the hold would later require, as the pool always has.
pub fn check_hold(state: PageState) -> Result<(), IllegalTransition> {
    let allowed = state.is_owned() || state == PageState::Quarantined;
    // A holdable page has a step out that waits for its holders (ReleaseHeld for an
    // owned page, DrainAckedHeld for a quarantined one); a Free or Draining page has none.
    // Facts of the constant table and of the enum: debug only.
    debug_assert_eq!(
        allowed,
        transition(state, PageOp::ReleaseHeld).is_ok()
            || transition(state, PageOp::DrainAckedHeld).is_ok()
    );
    debug_assert!(allowed || matches!(state, PageState::Free | PageState::Draining));
    if allowed {
        Ok(())
    } else {
        Err(IllegalTransition {
            from: state,
            op: PageOp::ReleaseHeld,
        })
    }
}

/// Every state, for exhaustive tests over the table.
pub const ALL_STATES: [PageState; PageState::COUNT] = crate::enum_table::every(PageState::VARIANTS);

/// Every operation, for exhaustive tests over the table.
pub const ALL_OPS: [PageOp; PageOp::COUNT] = crate::enum_table::every(PageOp::VARIANTS);

#[cfg(test)]
mod tests {
    use super::*;
    use PageOp::*;
    use PageState::*;

    /// The table is a function: no (from, op) pair appears twice.
    #[test]
    fn table_is_deterministic() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            for b in &TRANSITIONS[i + 1..] {
                assert!(!(a.0 == b.0 && a.1 == b.1), "duplicate entry {a:?} / {b:?}");
            }
        }
    }

    /// Every legal transition, spelled out once more, so that a change to the table
    /// has to change this list too.
    #[test]
    fn legal_transitions() {
        let legal = [
            (Free, Allocate, Reserved),
            (Reserved, ExpectWrite, Writing),
            (Reserved, MarkReady, Ready),
            (Writing, MarkReady, Ready),
            (Reserved, Release, Free),
            (Writing, Release, Free),
            (Ready, Release, Free),
            (Reserved, ReleaseHeld, Draining),
            (Writing, ReleaseHeld, Draining),
            (Ready, ReleaseHeld, Draining),
            (Reserved, Quarantine, Quarantined),
            (Writing, Quarantine, Quarantined),
            (Ready, Quarantine, Quarantined),
            (Draining, LastHolderGone, Free),
            (Quarantined, DrainAcked, Free),
            (Quarantined, DrainAckedHeld, Draining),
        ];
        for (from, op, to) in legal {
            assert_eq!(transition(from, op), Ok(to), "{from:?} --{op:?}-->");
        }
        assert_eq!(legal.len(), TRANSITIONS.len());
    }

    /// The held twins lead where the table says, and a hold is possible exactly in the
    /// states from which `ReleaseHeld` or `DrainAckedHeld` is legal.
    #[test]
    fn let_go_and_hold_rules_agree_with_the_table() {
        use Holders::{Absent, Present};
        assert_eq!(let_go_op(Release, Absent), Release);
        assert_eq!(let_go_op(Release, Present), ReleaseHeld);
        assert_eq!(let_go_op(DrainAcked, Absent), DrainAcked);
        assert_eq!(let_go_op(DrainAcked, Present), DrainAckedHeld);
        assert_eq!(let_go_op(Quarantine, Present), Quarantine);
        assert_eq!(Holders::counted(0), Absent);
        assert_eq!(Holders::counted(2), Present);
        for from in ALL_STATES {
            let held_exit =
                transition(from, ReleaseHeld).is_ok() || transition(from, DrainAckedHeld).is_ok();
            assert_eq!(check_hold(from).is_ok(), held_exit, "{from:?}");
        }
    }

    /// Every pair not in the table is refused, naming the state and the operation.
    #[test]
    fn illegal_transitions_are_refused() {
        let mut refused = 0;
        for from in ALL_STATES {
            for op in ALL_OPS {
                let listed = TRANSITIONS.iter().any(|(f, o, _)| *f == from && *o == op);
                match transition(from, op) {
                    Ok(_) => assert!(listed),
                    Err(e) => {
                        assert!(!listed);
                        assert_eq!(e, IllegalTransition { from, op });
                        refused += 1;
                    }
                }
            }
        }
        assert_eq!(
            refused,
            ALL_STATES.len() * ALL_OPS.len() - TRANSITIONS.len()
        );
        // The ones that matter most, by name.
        assert!(transition(Free, Release).is_err(), "double free");
        assert!(
            transition(Quarantined, Release).is_err(),
            "quarantine bypassed"
        );
        assert!(transition(Draining, Allocate).is_err(), "reuse while held");
        assert!(
            transition(Quarantined, Allocate).is_err(),
            "reuse while a write may land"
        );
        assert!(transition(Free, MarkReady).is_err());
    }
}
