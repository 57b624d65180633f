//! `PagePool` through its public API: every legal path of a page's life, every
//! illegal request refused with a typed error, and proptest properties over random
//! operation sequences (S1 and S8 hold; a page with holders is never handed out).

use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey};
use kvsim_engine::kv::{PageOp, PagePool, PageState, PoolError};
use proptest::prelude::*;

const A: RoomKey = RoomKey::new(1, 1);
const B: RoomKey = RoomKey::new(2, 1);

fn state(pool: &PagePool, t: PageTag) -> PageState {
    pool.record(t.page).unwrap().state
}

#[test]
fn lifo_reuse_hands_out_the_last_freed_page_first() {
    let mut pool = PagePool::new(8, 4);
    let a = pool.alloc(3, A).unwrap();
    assert_eq!(
        a.iter().map(|t| t.page.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    pool.release(A, &a).unwrap();
    let b = pool.alloc(2, B).unwrap();
    // Upstream prepends the sorted freed ids: the lowest freed page goes out first.
    assert_eq!(b.iter().map(|t| t.page.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!(
        b.iter().all(|t| t.gen == Generation(2)),
        "generation changes on every allocation"
    );
    pool.invariants().unwrap();
}

/// Why the model checker has no symmetry over free pages: renaming pages is not an
/// automorphism of this allocator. Two pages with identical records (same state,
/// owner and generation) are indistinguishable in the pool, so swapping their ids
/// maps the pool onto itself; yet after releasing both, the next allocation hands out
/// page 1 rather than its image, page 2, because release orders freed pages by id
/// (as SGLang's `free` sorts them). A reduction that treated such pages as
/// interchangeable would merge states whose futures differ. (If this test fails, the
/// allocator stopped ordering by id and page symmetry may have become sound.)
#[test]
fn renaming_pages_is_not_an_automorphism_of_the_allocator() {
    let mut pool = PagePool::new(2, 4);
    let both = pool.alloc(2, A).unwrap();
    let rec = |p: u32| pool.record(PageId(p)).unwrap().clone();
    assert_eq!(rec(1), rec(2), "the swap 1<->2 maps this pool onto itself");
    // The owner's list in either order (the order is the owner's, not the pool's).
    let swapped: Vec<PageTag> = both.iter().rev().copied().collect();
    let mut image = pool.clone();
    pool.release(A, &both).unwrap();
    image.release(A, &swapped).unwrap();
    let next = pool.alloc(1, B).unwrap()[0].page;
    let next_in_image = image.alloc(1, B).unwrap()[0].page;
    assert_eq!(next, PageId(1));
    // Equivariance would need the image to hand out page 2 (the swap of page 1).
    assert_ne!(next_in_image, PageId(2));
}

#[test]
fn page_zero_is_never_handed_out() {
    let mut pool = PagePool::new(4, 1);
    let all = pool.alloc(4, A).unwrap();
    assert!(all.iter().all(|t| t.page.0 != 0));
    assert_eq!(
        pool.alloc(1, B),
        Err(PoolError::Exhausted {
            requested: 1,
            free: 0
        })
    );
    assert!(pool.record(PageId(0)).is_none());
}

#[test]
fn transfer_path_reserved_writing_ready_free() {
    let mut pool = PagePool::new(4, 2);
    let t = pool.alloc(1, A).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Reserved);
    pool.expect_write(A, &t).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Writing);
    pool.mark_ready(A, &t).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Ready);
    pool.release(A, &t).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Free);
    pool.invariants().unwrap();
}

#[test]
fn held_page_drains_and_frees_on_last_holder() {
    let mut pool = PagePool::new(4, 2);
    let t = pool.alloc(1, A).unwrap();
    pool.mark_ready(A, &t).unwrap();
    pool.hold(t[0]).unwrap();
    pool.hold(t[0]).unwrap();
    pool.release(A, &t).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Draining);
    assert_eq!(pool.free_count(), 3, "a draining page is not free");
    pool.unhold(t[0]).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Draining);
    pool.unhold(t[0]).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Free);
    assert_eq!(pool.unhold(t[0]), Err(PoolError::NotHeld { tag: t[0] }));
    pool.invariants().unwrap();
}

#[test]
fn quarantine_returns_only_through_the_drain_ack() {
    let mut pool = PagePool::new(4, 2);
    let t = pool.alloc(2, A).unwrap();
    pool.expect_write(A, &t).unwrap();
    pool.quarantine(A, &t).unwrap();
    assert!(t.iter().all(|p| state(&pool, *p) == PageState::Quarantined));
    // A plain release of quarantined pages is illegal: only the ack may free them.
    assert!(matches!(
        pool.release(A, &t),
        Err(PoolError::Illegal { .. })
    ));
    assert_eq!(
        pool.alloc(3, B),
        Err(PoolError::Exhausted {
            requested: 3,
            free: 2
        })
    );
    pool.release_quarantined(A, &t).unwrap();
    assert_eq!(pool.free_count(), 4);
    pool.invariants().unwrap();
}

#[test]
fn quarantined_and_held_page_drains_after_the_ack() {
    let mut pool = PagePool::new(2, 2);
    let t = pool.alloc(1, A).unwrap();
    pool.hold(t[0]).unwrap();
    pool.quarantine(A, &t).unwrap();
    pool.release_quarantined(A, &t).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Draining);
    pool.unhold(t[0]).unwrap();
    assert_eq!(state(&pool, t[0]), PageState::Free);
}

#[test]
fn illegal_requests_are_refused_and_change_nothing() {
    let mut pool = PagePool::new(4, 2);
    let t = pool.alloc(2, A).unwrap();
    let before = pool.clone();
    // Only the owner frees (S8).
    assert!(matches!(
        pool.release(B, &t),
        Err(PoolError::NotOwner { .. })
    ));
    // A stale tag is refused.
    let stale = PageTag {
        page: t[0].page,
        gen: Generation(t[0].gen.0 + 7),
    };
    assert!(matches!(
        pool.release(A, &[stale]),
        Err(PoolError::StaleTag { .. })
    ));
    assert!(matches!(pool.hold(stale), Err(PoolError::StaleTag { .. })));
    // Not a pool page.
    let bogus = PageTag {
        page: PageId(99),
        gen: Generation(1),
    };
    assert!(matches!(
        pool.release(A, &[bogus]),
        Err(PoolError::OutOfRange { .. })
    ));
    // A multi-page request with one bad page applies to none.
    assert!(pool.release(A, &[t[0], stale]).is_err());
    assert_eq!(
        pool, before,
        "a refused operation leaves the pool untouched"
    );
    // Ready -> ExpectWrite is not in the table.
    pool.mark_ready(A, &t).unwrap();
    assert!(matches!(
        pool.expect_write(A, &t),
        Err(PoolError::Illegal { source, .. }) if source.op == PageOp::ExpectWrite && source.from == PageState::Ready
    ));
    // A second release is refused: the page is no longer the caller's.
    pool.release(A, &t).unwrap();
    assert!(pool.release(A, &t).is_err());
    pool.invariants().unwrap();
}

#[test]
fn unchecked_double_free_is_caught_by_the_invariants() {
    let mut pool = PagePool::new(4, 2);
    let t = pool.alloc(1, A).unwrap();
    pool.release(A, &t).unwrap();
    // Upstream's allocator does not check: the page lands on the free list twice.
    pool.free_unchecked(A, &t);
    let v = pool.invariants().unwrap_err();
    assert_eq!(v.invariant, kvsim_engine::invariant::Invariant::S8, "{v}");
}

/// One random operation against the pool.
#[derive(Clone, Debug)]
enum Op {
    Alloc { owner: u8, n: u8 },
    ExpectWrite { owner: u8 },
    Ready { owner: u8 },
    Hold { pick: u8 },
    Unhold { pick: u8 },
    Release { owner: u8 },
    Quarantine { owner: u8 },
    Ack { owner: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 1u8..4).prop_map(|(owner, n)| Op::Alloc { owner, n }),
        (0u8..4).prop_map(|owner| Op::ExpectWrite { owner }),
        (0u8..4).prop_map(|owner| Op::Ready { owner }),
        any::<u8>().prop_map(|pick| Op::Hold { pick }),
        any::<u8>().prop_map(|pick| Op::Unhold { pick }),
        (0u8..4).prop_map(|owner| Op::Release { owner }),
        (0u8..4).prop_map(|owner| Op::Quarantine { owner }),
        (0u8..4).prop_map(|owner| Op::Ack { owner }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever a caller asks, in any order: the partition holds, no page is listed
    /// free twice, and a page with holders or an owner is never handed out.
    #[test]
    fn random_sequences_keep_s1_and_s8(ops in proptest::collection::vec(op(), 1..120)) {
        let mut pool = PagePool::new(8, 2);
        let owners: Vec<RoomKey> = (1..=4).map(|r| RoomKey::new(r, 1)).collect();
        // Tags each owner was given (a hold keeps its tag even after the owner goes).
        let mut given: Vec<Vec<PageTag>> = vec![Vec::new(); 4];
        let mut holds: Vec<PageTag> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { owner, n } => {
                    let o = owner as usize;
                    if given[o].is_empty() {
                        if let Ok(tags) = pool.alloc(n as usize, owners[o]) {
                            for t in &tags {
                                let rec = pool.record(t.page).unwrap();
                                prop_assert_eq!(rec.holders, 0, "handed out a held page");
                                prop_assert!(!holds.iter().any(|h| h.page == t.page && pool.record(h.page).unwrap().gen == h.gen));
                            }
                            given[o] = tags;
                        }
                    }
                }
                Op::ExpectWrite { owner } => { let _ = pool.expect_write(owners[owner as usize], &given[owner as usize]); }
                Op::Ready { owner } => { let _ = pool.mark_ready(owners[owner as usize], &given[owner as usize]); }
                Op::Hold { pick } => {
                    let all: Vec<PageTag> = given.iter().flatten().copied().collect();
                    if !all.is_empty() {
                        let t = all[pick as usize % all.len()];
                        if pool.hold(t).is_ok() { holds.push(t); }
                    }
                }
                Op::Unhold { pick } => {
                    if !holds.is_empty() {
                        let t = holds.remove(pick as usize % holds.len());
                        prop_assert!(pool.unhold(t).is_ok(), "a taken hold can be released");
                    }
                }
                Op::Release { owner } => {
                    let o = owner as usize;
                    if pool.release(owners[o], &given[o]).is_ok() { given[o].clear(); }
                }
                Op::Quarantine { owner } => { let _ = pool.quarantine(owners[owner as usize], &given[owner as usize]); }
                Op::Ack { owner } => {
                    let o = owner as usize;
                    if pool.release_quarantined(owners[o], &given[o]).is_ok() { given[o].clear(); }
                }
            }
            if let Err(v) = pool.invariants() {
                prop_assert!(false, "{}", v);
            }
        }
        // Let go of everything: the pool is whole again.
        for t in holds.drain(..) { pool.unhold(t).unwrap(); }
        for (o, tags) in given.iter().enumerate() {
            if tags.is_empty() { continue; }
            let quarantined = tags.iter().any(|t| pool.record(t.page).unwrap().state == PageState::Quarantined);
            if quarantined { pool.release_quarantined(owners[o], tags).unwrap(); } else { pool.release(owners[o], tags).unwrap(); }
        }
        prop_assert_eq!(pool.free_count(), pool.capacity());
        pool.invariants().unwrap();
    }
}
