//! Unit tests of the shared record on one thread (the loom models are in
//! `tests/loom_shared.rs`).

use crate::ids::{Generation, PageId, PageTag, RoomKey};
use crate::kv::lifecycle::PageState;
use crate::kv::shared::table::{PlantedRace, SharedError, SharedPool};
use crate::kv::shared::word::{Word, GENERATION_MAX};

const A: RoomKey = RoomKey::new(1, 1);
const B: RoomKey = RoomKey::new(2, 1);

fn ok(pool: &SharedPool) {
    if let Err(v) = pool.invariants() {
        panic!("{v}");
    }
}

#[test]
fn word_round_trips() {
    for state in super::super::lifecycle::ALL_STATES {
        for (gen, holders) in [(0, 0), (1, 1), (GENERATION_MAX, u16::MAX), (12345, 7)] {
            let w = Word {
                gen,
                state,
                holders,
            };
            assert_eq!(Word::unpack(w.pack()), w);
        }
    }
}

/// LIFO reuse, generations and the free list as the single-threaded pool has them.
#[test]
fn alloc_release_reuse() {
    let pool = SharedPool::new(3, 16);
    let a = pool.alloc(2, A).unwrap();
    assert_eq!(
        a.iter().map(|t| (t.page.0, t.gen.0)).collect::<Vec<_>>(),
        [(1, 1), (2, 1)]
    );
    ok(&pool);
    assert_eq!(pool.release(A, &a), Ok(2));
    ok(&pool);
    let b = pool.alloc(1, B).unwrap();
    assert_eq!((b[0].page.0, b[0].gen.0), (1, 2), "lowest freed page first");
    assert!(pool.owns(B, b[0]) && !pool.owns(A, a[0]));
    assert_eq!(
        pool.alloc(3, B),
        Err(SharedError::Exhausted {
            requested: 3,
            free: 2
        })
    );
    ok(&pool);
}

/// A write with a tag from before a reallocation is refused and changes nothing.
#[test]
fn stale_write_is_refused() {
    let pool = SharedPool::new(1, 16);
    let old = pool.alloc(1, A).unwrap()[0];
    pool.release(A, &[old]).unwrap();
    assert_eq!(
        pool.begin_write(old).unwrap_err(),
        SharedError::NotWritable {
            tag: old,
            state: PageState::Free
        }
    );
    let new = pool.alloc(1, B).unwrap()[0];
    let before = pool.snapshot();
    assert_eq!(
        pool.begin_write(old).unwrap_err(),
        SharedError::StaleTag {
            tag: old,
            current: new.gen
        }
    );
    assert_eq!(pool.snapshot(), before);
    let guard = pool.begin_write(new).unwrap();
    assert_eq!(guard.tag(), new);
    assert!(!guard.finish());
    ok(&pool);
}

/// A held page released by its owner drains, and the guard's drop frees it once.
#[test]
fn last_guard_frees_a_released_page() {
    let pool = SharedPool::new(2, 16);
    let t = pool.alloc(1, A).unwrap()[0];
    let r1 = pool.begin_read(t).unwrap();
    let r2 = pool.begin_read(t).unwrap();
    assert_eq!(pool.release(A, &[t]), Ok(0));
    assert_eq!(pool.record(t.page).unwrap().state, PageState::Draining);
    assert!(
        pool.begin_read(t).is_err(),
        "no new hold on a draining page"
    );
    ok(&pool);
    assert!(!r1.finish());
    drop(r2);
    assert_eq!(pool.record(t.page).unwrap().state, PageState::Free);
    assert_eq!(pool.free_list().last(), Some(&t.page));
    ok(&pool);
    assert_eq!(pool.unhold(t), Err(SharedError::NotHeld { tag: t }));
}

/// Quarantine still accepts the room's own writes (they may land until the drain
/// ack), refuses another room's, and keeps the page until the drain ack and its
/// last holder; after the ack no write is accepted.
#[test]
fn quarantine_holds_the_page_until_acked_and_unheld() {
    let pool = SharedPool::new(1, 16);
    let t = pool.alloc(1, A).unwrap()[0];
    pool.expect_write(A, &[t]).unwrap();
    let w = pool.begin_write(t).unwrap();
    pool.quarantine(A, &[t]).unwrap();
    let late = pool
        .begin_write_for(A, t)
        .expect("a quarantined page takes its room's write");
    assert!(matches!(
        pool.begin_write_for(B, t),
        Err(SharedError::NotOwner { owner: Some(A), .. })
    ));
    drop(late);
    assert_eq!(
        pool.release(A, &[t]).unwrap_err().to_string(),
        "page p1: illegal page transition: ReleaseHeld from Quarantined"
    );
    assert_eq!(pool.release_quarantined(A, &[t]), Ok(0));
    assert!(matches!(
        pool.begin_write(t),
        Err(SharedError::NotWritable {
            state: PageState::Draining,
            ..
        })
    ));
    assert_eq!(
        pool.alloc(1, B).unwrap_err(),
        SharedError::Exhausted {
            requested: 1,
            free: 0
        }
    );
    assert!(w.finish());
    assert_eq!(pool.alloc(1, B).unwrap()[0].gen, Generation(2));
    ok(&pool);
}

/// Both planted races still behave on one thread: only an interleaving exposes them,
/// which is why the loom models are the test that catches them.
#[test]
fn planted_races_are_invisible_on_one_thread() {
    for race in [PlantedRace::SplitHoldCheck, PlantedRace::SplitReleaseCheck] {
        let pool = SharedPool::with_planted_race(2, 16, race);
        let t = pool.alloc(1, A).unwrap()[0];
        let g = pool.begin_write(t).unwrap();
        assert_eq!(pool.release(A, &[t]), Ok(0));
        assert!(g.finish());
        assert!(pool.begin_write(t).is_err());
        ok(&pool);
    }
}

#[test]
fn out_of_range_and_padding_page() {
    let pool = SharedPool::new(2, 16);
    let p0 = PageTag {
        page: PageId(0),
        gen: Generation(0),
    };
    assert_eq!(
        pool.hold(p0),
        Err(SharedError::OutOfRange {
            page: PageId(0),
            last: 2
        })
    );
    assert_eq!(pool.tag(PageId(3)), None);
    assert_eq!(pool.record(PageId(0)), None);
}
