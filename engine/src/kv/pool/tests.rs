//! Unit tests of the pool's self-check and of its epochs.

use super::*;

/// The self-check names a free list that holds something that is not a pool page
/// (page 0, or past the last page), as S1, and keeps looking: a page listed twice
/// is still S8. No operation of the pool can produce either; the check exists for
/// a record corrupted some other way, so the test corrupts it by hand.
#[test]
fn the_self_check_names_a_free_list_entry_that_is_not_a_pool_page() {
    let mut pool = PagePool::new(4, 2);
    assert!(pool.violations().is_empty());
    pool.free.push(PageId(0));
    pool.free.push(PageId(5));
    let first = pool.free[0];
    pool.free.push(first);
    let v = pool.violations();
    let s1: Vec<_> = v.iter().filter(|v| v.invariant == Invariant::S1).collect();
    assert_eq!(s1.len(), 2, "{v:?}");
    assert!(
        s1[0].detail.contains("free list holds p0, not a pool page"),
        "{v:?}"
    );
    assert!(
        s1[1].detail.contains("free list holds p5, not a pool page"),
        "{v:?}"
    );
    assert!(v.iter().any(|v| v.invariant == Invariant::S8), "{v:?}");
}

/// A restarted node's pool never hands out a generation of an earlier incarnation,
/// so a tag from before the crash is stale for every allocation after it.
#[test]
fn generations_continue_above_an_earlier_epoch() {
    let room = RoomKey::new(1, 1);
    let mut old = PagePool::new(2, 4);
    let mut before = Vec::new();
    for _ in 0..5 {
        let tags = old.alloc(2, room).unwrap();
        old.release(room, &tags).unwrap();
        before.extend(tags);
    }
    let mut new = PagePool::with_epoch(2, 4, 1);
    assert_eq!(new.epoch(), 1);
    let after = new.alloc(2, room).unwrap();
    for t in &after {
        assert_eq!(t.gen.epoch(), 1);
        assert!(before.iter().all(|b| b.gen < t.gen));
    }
    for b in &before {
        assert_eq!(b.gen.epoch(), 0);
        assert!(!new.owns(room, *b), "{b} from before the restart matches");
    }
    assert!(new.invariants().is_ok());
}
