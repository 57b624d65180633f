//! The model's properties: one `always` per invariant (a bit the oracle set in the
//! state's book), the quiescence and "an error answer has a cause" checks, and the
//! `sometimes` paths a spec asks a model to reach; each reports its discovery once.
//!
//! Their names are [`crate::model::names`]; the findings themselves come from the
//! oracle during each transition ([`crate::model::tx`]), not from here.

use crate::model::handoff::HandoffModel;
use crate::model::names;
use crate::model_state::{note, State};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status};
use kvsim_oracle::schema::EndOutcome;
use stateright::Property;
use std::sync::atomic::Ordering as AtomicOrdering;

/// Report a property's discovery once. stateright 0.31's checkers record a discovery
/// every time a state satisfies a `sometimes` or breaks an `always` (bfs.rs inserts
/// without checking), so the path it keeps is the last, deepest one. A property
/// function that answers "discovered" only for the first such state makes the
/// single-threaded BFS report a shortest path (and a multi-threaded one a near-shortest).
fn latch_first(m: &HandoffModel, bit: u32) -> bool {
    m.latched.fetch_or(1 << bit, AtomicOrdering::Relaxed) & (1 << bit) == 0
}

/// Has this property's discovery been reported already? (Then its condition need not
/// be evaluated again: the answer is "no new discovery".)
fn latched(m: &HandoffModel, bit: u32) -> bool {
    m.latched.load(AtomicOrdering::Relaxed) & (1 << bit) != 0
}

impl HandoffModel {
    /// At quiescence, what the oracle's end-of-run check (L1-L4) finds, if anything: a
    /// request without an answer, a room still open, a request still held, a page not
    /// returned. A decode node that stopped loudly (a drain ack never came) may keep
    /// its quarantine: the oracle knows the stop from its fault event.
    pub fn quiescence_problem(&self, s: &State) -> Option<String> {
        let mut drafts = Vec::new();
        s.oracle
            .get()
            .at_end(EndOutcome::Drained, "drained", &mut drafts);
        drafts
            .first()
            .map(|d| format!("{}: {}", d.invariant, d.detail))
    }
}

macro_rules! safety {
    ($($fn_name:ident => $inv:ident),* $(,)?) => {
        $(fn $fn_name(m: &HandoffModel, s: &State) -> bool {
            !(s.violated(Invariant::$inv) && latch_first(m, Invariant::$inv as u32))
        })*
    };
}

safety!(
    holds_s1 => S1, holds_s2 => S2, holds_s3 => S3, holds_s4 => S4, holds_s5 => S5,
    holds_s6 => S6, holds_s7 => S7, holds_s8 => S8, holds_s9 => S9, holds_s10 => S10,
    holds_l5 => L5,
);

/// Latch bits of the properties that are not one invariant each.
const BIT_QUIESCENCE: u32 = 20;
const BIT_COMPLETES: u32 = 21;
const BIT_REJECTED: u32 = 22;
const BIT_ABORT_RACE: u32 = 23;
const BIT_LATE_ACK: u32 = 24;
const BIT_CRASH: u32 = 25;
const BIT_STOPPED: u32 = 26;
const BIT_ALTERED: u32 = 27;
const BIT_REFIRED: u32 = 28;
const BIT_UNCAUSED: u32 = 29;
const BIT_RETRIED_LIVE: u32 = 30;
const BIT_FROZEN_TIMEOUT: u32 = 31;
const BIT_SPREAD: u32 = 32;

fn quiescence_holds(m: &HandoffModel, s: &State) -> bool {
    latched(m, BIT_QUIESCENCE)
        || !(m.is_quiescent(s)
            && m.quiescence_problem(s).is_some()
            && latch_first(m, BIT_QUIESCENCE))
}

/// "An error answer has a cause": a client that got a non-OK answer either
/// cancelled, or sent a request that must be refused (malformed, or over-length /
/// larger than a pool: [`HandoffModel::must_refuse`]), or the run has used at least
/// one fault (any count in the fault book). A request the environment did nothing to
/// is answered 200. Safety invariants cannot say this (an abort is always safe);
/// liveness only asks for *an* answer.
///
/// A model property, not an oracle finding: its premise is the fault book, the
/// environment's own record of what it did. A trace records crashes, partitions and
/// data faults, but not a lost, duplicated or overtaking message, nor a timer that
/// fired early, so the oracle cannot tell an unexplained error from one a lost
/// message explains.
fn error_has_cause(m: &HandoffModel, s: &State) -> bool {
    latched(m, BIT_UNCAUSED) || !(s.book.get().uncaused && latch_first(m, BIT_UNCAUSED))
}

fn request_completes(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_COMPLETES)
        && s.clients().iter().any(|c| c.reply == Some(Status::OK))
        && latch_first(m, BIT_COMPLETES)
}

fn over_length_rejected(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_REJECTED)
        && s.clients()
            .iter()
            .any(|c| c.reply == Some(Status::BAD_REQUEST) && m.over_length(m.client_spec(c)))
        && latch_first(m, BIT_REJECTED)
}

/// A KV write is in flight to a decode node while its destination no longer belongs
/// to a live request of its room (the room was aborted or failed: quarantined, or
/// freed).
fn abort_races_write(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_ABORT_RACE)
        && s.net
            .iter()
            .any(|e| match (&e.get().msg, s.decode(e.get().to)) {
                (Carried::Write(KvWrite { id, dst, .. }), Some(decode)) => dst.iter().any(|t| {
                    !decode.pool().record(t.page).is_some_and(|r| {
                        r.gen == t.gen && r.owner == Some(id.room) && r.state.is_owned()
                    })
                }),
                _ => false,
            })
        && latch_first(m, BIT_ABORT_RACE)
}

/// A drain ack is on its way to decode for a quarantine whose retry timer already
/// fired (the ack is late: it arrives after the drain timeout).
fn drain_ack_after_timeout(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_LATE_ACK)
        && s.net.iter().any(|e| match &e.get().msg {
            Carried::Msg(Msg::DrainAck { room }) => {
                s.is_decode(e.get().to) && s.noted(*room, note::DRAIN_RETRIED)
            }
            _ => false,
        })
        && latch_first(m, BIT_LATE_ACK)
}

/// A timeout fired at one node while another was frozen.
fn timeout_while_frozen(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_FROZEN_TIMEOUT)
        && s.faults().frozen_timeouts > 0
        && latch_first(m, BIT_FROZEN_TIMEOUT)
}

/// A prefill or decode node crashed while it held a request (or a quarantine).
fn busy_crash(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_CRASH) && s.faults().busy_crashes > 0 && latch_first(m, BIT_CRASH)
}

/// A defense stopped a hazard (a `DETECTED` finding, in a model where that holds).
fn defense_stops(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_STOPPED) && s.book.get().detected != 0 && latch_first(m, BIT_STOPPED)
}

/// A KV write landed altered by a data fault.
fn write_altered(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_ALTERED) && s.faults().data_faults > 0 && latch_first(m, BIT_ALTERED)
}

/// The router started another attempt of a request while an attempt it gave up still
/// has a half working (`sglang-router`).
fn retried_while_live(m: &HandoffModel, s: &State) -> bool {
    let r = s.router.get();
    !latched(m, BIT_RETRIED_LIVE)
        && r.abandoned_rooms() > 0
        && r.live_rooms() > r.abandoned_rooms()
        && latch_first(m, BIT_RETRIED_LIVE)
}

/// Every decode node holds a request at the same time (a model with more than one:
/// the router spread its attempts over the pairs).
fn spread_over_nodes(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_SPREAD)
        && s.decodes.len() > 1
        && s.decodes.iter().all(|d| d.get().requests() > 0)
        && latch_first(m, BIT_SPREAD)
}

/// A spent timer was delivered again.
fn timer_refired(m: &HandoffModel, s: &State) -> bool {
    !latched(m, BIT_REFIRED) && s.faults().timer_refires > 0 && latch_first(m, BIT_REFIRED)
}

/// A property's condition.
type Condition = fn(&HandoffModel, &State) -> bool;

/// Every property of `m`: the `always` ones, then the `sometimes` paths its spec
/// asks it to reach.
pub(super) fn all(m: &HandoffModel) -> Vec<Property<HandoffModel>> {
    let mut props = vec![
        Property::always(names::S1, holds_s1),
        Property::always(names::S2, holds_s2),
        Property::always(names::S3, holds_s3),
        Property::always(names::S4, holds_s4),
        Property::always(names::S5, holds_s5),
        Property::always(names::S6, holds_s6),
        Property::always(names::S7, holds_s7),
        Property::always(names::S8, holds_s8),
        Property::always(names::S9, holds_s9),
        Property::always(names::S10, holds_s10),
        Property::always(names::L5, holds_l5),
        Property::always(names::QUIESCENCE, quiescence_holds),
        Property::always(names::CAUSED, error_has_cause),
    ];
    let sometimes: [(&'static str, Condition); 11] = [
        (names::SPREAD, spread_over_nodes),
        (names::FROZEN_TIMEOUT, timeout_while_frozen),
        (names::RETRIED_LIVE, retried_while_live),
        (names::STOPPED, defense_stops),
        (names::ALTERED, write_altered),
        (names::REFIRED, timer_refired),
        (names::COMPLETES, request_completes),
        (names::ABORT_RACE, abort_races_write),
        (names::LATE_ACK, drain_ack_after_timeout),
        (names::REJECTED, over_length_rejected),
        (names::CRASH, busy_crash),
    ];
    for (name, f) in sometimes {
        if m.spec.reaches.contains(&name) {
            props.push(Property::sometimes(name, f));
        }
    }
    props
}
