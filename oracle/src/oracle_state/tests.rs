//! Unit tests of the oracle's model: provenance, answered ranges, S6 on a second
//! answer, and the sharing of parts between copies.

use super::*;
use kvsim_engine::ids::{RequestId, TenantId};
use kvsim_engine::invariant::Invariant;

#[test]
fn provenance_grows_over_contiguous_writes_and_resets_on_another_writer() {
    let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
    let mut p = Provenance::default();
    for s in 0..3 {
        p = p.after_write(a, None, s);
    }
    assert!(p.covers(a, 3) && !p.covers(a, 4) && !p.covers(b, 1));
    p = p.after_write(b, None, 1);
    assert_eq!(
        p,
        Provenance {
            writer: Some(b),
            at: None,
            lo: 1,
            hi: 2
        }
    );
    assert!(!p.covers(b, 2));
}

#[test]
fn a_write_meant_for_other_positions_starts_afresh_and_is_not_meant_for_the_read() {
    let a = RoomKey::new(1, 1);
    // Slots 0..2 written for positions 4..6 (the page read as positions 4..).
    let p = Provenance::default().after_writes(a, Some(4), 0..2);
    assert!(p.covers(a, 2) && p.meant_for(4) && !p.meant_for(2));
    // The same room's write of slot 1 meant for position 7 (page 6..) is another
    // write as far as the range goes: the page no longer holds 0..2 for 4..
    let q = p.after_write(a, Some(6), 1);
    assert!(!q.covers(a, 2) && q.meant_for(6));
    // A landing carrying KV meant for positions 6.. over the page takes it whole.
    let landed = Provenance::default().after_writes(a, Some(6), 0..2);
    let r = p.after_landing(landed);
    assert!(r.covers(a, 2) && !r.meant_for(4));
    // A trace without positions judges the owner only.
    assert!(Provenance::default()
        .after_writes(a, None, 0..2)
        .meant_for(4));
}

#[test]
fn a_run_of_slots_gives_the_provenance_slot_by_slot_does() {
    let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
    let mut starts = vec![Provenance::default()];
    for writer in [Some(a), Some(b)] {
        for lo in 0..6 {
            for hi in 0..6 {
                for at in [None, Some(0), Some(2)] {
                    starts.push(Provenance { writer, at, lo, hi });
                }
            }
        }
    }
    for p in starts {
        for lo in 0..7 {
            for hi in lo..8 {
                for at in [None, Some(0), Some(2)] {
                    let one_by_one = (lo..hi).fold(p, |q, s| q.after_write(a, at, s));
                    let run = p.after_writes(a, at, lo..hi);
                    assert_eq!(run, one_by_one, "{p:?} {at:?} {lo}..{hi}");
                }
            }
        }
    }
}

#[test]
fn answered_ranges_merge_and_answer_membership() {
    let mut s = Answers::default();
    for r in [0u64, 2, 1, 5, 3, 4, 9] {
        assert!(!s.is_answered(RequestId(r)));
        s.answer(RequestId(r));
        assert!(s.is_answered(RequestId(r)));
    }
    assert_eq!(s.answered.get(), &vec![(0, 5), (9, 9)]);
    assert!(!s.is_answered(RequestId(7)));
}

/// A run of one prefill and one decode node, 8 pages each.
fn one_pair_header() -> RunHeader {
    let topo = kvsim_engine::world::Topology {
        prefill_pools: vec![8],
        decode_pools: vec![8],
    };
    let clock = crate::schema::ClockKind::Simulated;
    RunHeader::new("test", clock, &Default::default(), &topo)
}

#[test]
fn a_half_answering_again_with_another_status_is_s6() {
    use kvsim_engine::msg::Status;
    let h = one_pair_header();
    let mut s = OracleState::new(&h);
    let room = RoomKey::new(1, 1);
    let mut out = Drafts::new();
    s.observe_event(
        &h,
        &TraceEvent::Routed {
            node: NodeId(0),
            req: RequestId(1),
            tenant: TenantId(0),
            room,
            prefill: NodeId(1),
            decode: NodeId(2),
            prompt_len: 4,
            max_new_tokens: 1,
        },
        &mut out,
    );
    let answer = |status| TraceEvent::Responded {
        node: NodeId(2),
        room,
        side: Side::Decode,
        status,
    };
    for status in [Status::INTERNAL, Status::INTERNAL] {
        s.observe_event(&h, &answer(status), &mut out);
    }
    assert!(
        out.is_empty(),
        "the same answer again is not a second one: {out:?}"
    );
    s.observe_event(&h, &answer(Status::CLIENT_CLOSED), &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].invariant, Invariant::S6);
    assert!(
        out[0].detail.contains("after answering 500"),
        "{}",
        out[0].detail
    );
}

/// A copy shares every part until an event changes one; an event that changes
/// nothing leaves it sharing (so a model state may keep its old copy).
#[test]
fn a_copy_shares_its_parts_until_an_event_changes_one() {
    let h = one_pair_header();
    let base = OracleState::new(&h);
    let mut copy = base.clone();
    assert!(copy.same_parts(&base));
    let mut out = Drafts::new();
    let read = TraceEvent::Attend {
        node: NodeId(2),
        room: RoomKey::new(1, 1),
        step: 0,
        query_pos: 0,
        seq_len: 0,
        pages: vec![],
    };
    copy.observe_event(&h, &read, &mut out);
    assert!(copy.same_parts(&base), "a read of no pages changes nothing");
    let routed = TraceEvent::Routed {
        node: NodeId(0),
        req: RequestId(1),
        tenant: TenantId(0),
        room: RoomKey::new(1, 1),
        prefill: NodeId(1),
        decode: NodeId(2),
        prompt_len: 4,
        max_new_tokens: 1,
    };
    copy.observe_event(&h, &routed, &mut out);
    assert!(!copy.same_parts(&base));
    assert_ne!(copy, base);
}

#[test]
fn length_disagreement_names_the_mismatch() {
    assert!(length_disagreement(Some(4), 4, 2, 4, 2, true).is_none());
    assert!(length_disagreement(Some(7), 7, 4, 1, 1, false).is_some());
    assert!(length_disagreement(Some(4), 4, 2, 4, 1, true).is_some_and(|s| s.contains("pages")));
}
