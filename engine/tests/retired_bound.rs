//! Each node's retired table is bounded: behind SGLang's router (worker mode) every
//! request has a room number of its own, and a node that retired more distinct room
//! numbers than its bound still holds at most the bound
//! (`kvsim_engine::retired::RetiredRooms`: two generations of
//! `max(max_rooms, RETIRED_MIN_HALF)` numbers each), while a use it retired recently is
//! still recognised as stale. Memory bounded by a count, not a timing.

mod common;
use common::*;
use kvsim_engine::ids::RoomKey;
use kvsim_engine::msg::Msg;
use kvsim_engine::retired::RETIRED_MIN_HALF;

/// More distinct room numbers than the bound, each refused at intake (too long), so
/// each leaves a retired record; the room key is worker mode's (`room`, `gen`).
const ROOMS: u32 = 3 * RETIRED_MIN_HALF as u32;

fn key(n: u32) -> RoomKey {
    RoomKey::new(n, u64::from(n) << 8)
}

#[test]
fn decodes_retired_table_stays_within_its_bound_under_distinct_rooms() {
    let mut h = harness();
    for n in 1..=ROOMS {
        let msg = Msg::DecodeStart {
            room: key(n),
            req: kvsim_engine::ids::RequestId(u64::from(n)),
            prompt: prompt(40),
            max_new_tokens: NEW,
            prefill: P,
        };
        handled(h.inject(R, D, msg).unwrap());
        let d = h.decode(D).unwrap();
        assert!(
            d.retired().len() <= d.retired().bound(),
            "{} records after {n} rooms (bound {})",
            d.retired().len(),
            d.retired().bound()
        );
    }
    let d = h.decode(D).unwrap();
    assert!(d.retired().len() > RETIRED_MIN_HALF, "it did fill up");
    assert!(
        d.retired().is_stale(key(ROOMS)),
        "the newest use is retired"
    );
    assert!(!d.retired().is_stale(key(1)), "the oldest was let go");
    h.invariants().unwrap();
}

#[test]
fn prefills_retired_table_stays_within_its_bound_under_distinct_rooms() {
    let mut h = harness();
    for n in 1..=ROOMS {
        let msg = Msg::PrefillStart {
            room: key(n),
            req: kvsim_engine::ids::RequestId(u64::from(n)),
            prompt: prompt(40),
            decode: D,
        };
        handled(h.inject(R, P, msg).unwrap());
        let p = h.prefill(P).unwrap();
        assert!(p.retired().len() <= p.retired().bound(), "after {n} rooms");
    }
    let p = h.prefill(P).unwrap();
    assert!(p.retired().len() > RETIRED_MIN_HALF);
    assert!(p.retired().is_stale(key(ROOMS)));
    h.invariants().unwrap();
}
