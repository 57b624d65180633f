//! Model-based test: the concurrent record `kv::shared::SharedPool` and the
//! single-threaded `kv::PagePool` agree on every random sequence of operations.
//!
//! Each step applies one operation to both (the same owners, tags, and stale or
//! out-of-range tags), then requires the same result (both records refuse with the
//! one `PoolError` type, in the same words) and the same whole record: `SharedPool::snapshot()` must equal
//! the pool, field by field, free list order included, and both must pass the pool's
//! invariants. The shared record's read and write guards are driven as the pool's
//! `hold`/`unhold`. This is not a concurrency test (tests/loom_shared.rs is); it is what
//! keeps the two records from drifting apart.
#![cfg(not(loom))]

use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey};
use kvsim_engine::kv::shared::{ReadGuard, SharedError, SharedPool, WriteGuard};
use kvsim_engine::kv::PagePool;
use proptest::prelude::*;

/// A tag to operate on: one issued earlier in the run (possibly stale by now), or an
/// arbitrary one (possibly out of range, possibly a generation never issued).
#[derive(Clone, Debug)]
enum Pick {
    Issued(usize),
    Raw(u32, u64),
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize, u32),
    ExpectWrite(u32, Vec<Pick>),
    MarkReady(u32, Vec<Pick>),
    Quarantine(u32, Vec<Pick>),
    Release(u32, Vec<Pick>),
    ReleaseQuarantined(u32, Vec<Pick>),
    Hold(Pick),
    Unhold(Pick),
    BeginRead(Pick),
    BeginWrite(Pick),
    /// Drop the n-th live guard (modulo the number alive).
    EndGuard(usize),
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        4 => any::<usize>().prop_map(Pick::Issued),
        1 => (0u32..8, 0u64..4).prop_map(|(p, g)| Pick::Raw(p, g)),
    ]
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(pick(), 0..4)
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 0u32..3;
    prop_oneof![
        3 => (0usize..4, owner.clone()).prop_map(|(n, o)| Op::Alloc(n, o)),
        1 => (owner.clone(), picks()).prop_map(|(o, t)| Op::ExpectWrite(o, t)),
        1 => (owner.clone(), picks()).prop_map(|(o, t)| Op::MarkReady(o, t)),
        1 => (owner.clone(), picks()).prop_map(|(o, t)| Op::Quarantine(o, t)),
        2 => (owner.clone(), picks()).prop_map(|(o, t)| Op::Release(o, t)),
        1 => (owner, picks()).prop_map(|(o, t)| Op::ReleaseQuarantined(o, t)),
        1 => pick().prop_map(Op::Hold),
        1 => pick().prop_map(Op::Unhold),
        2 => pick().prop_map(Op::BeginRead),
        2 => pick().prop_map(Op::BeginWrite),
        2 => any::<usize>().prop_map(Op::EndGuard),
    ]
}

fn owner(o: u32) -> RoomKey {
    RoomKey::new(o, 1)
}

enum Guard<'a> {
    Read(ReadGuard<'a>),
    Write(WriteGuard<'a>),
}

impl Guard<'_> {
    fn tag(&self) -> PageTag {
        match self {
            Guard::Read(g) => g.tag(),
            Guard::Write(g) => g.tag(),
        }
    }

    fn finish(self) -> bool {
        match self {
            Guard::Read(g) => g.finish(),
            Guard::Write(g) => g.finish(),
        }
    }
}

fn resolve(issued: &[PageTag], p: &Pick) -> PageTag {
    match *p {
        Pick::Issued(i) if !issued.is_empty() => issued[i % issued.len()],
        Pick::Issued(i) => PageTag {
            page: PageId(1),
            gen: Generation(i as u64 % 3),
        },
        Pick::Raw(page, gen) => PageTag {
            page: PageId(page),
            gen: Generation(gen),
        },
    }
}

/// What `begin_write` must answer, derived from the pool alone: the shared record's
/// write gate is the pool's hold rule (owned or quarantined pages; the one rule for
/// writes into quarantined pages, docs/DECISIONS.md).
fn expected_write(pool: &PagePool, tag: PageTag) -> Result<(), SharedError> {
    let last = pool.capacity() as u32;
    let Some(rec) = pool.record(tag.page).filter(|_| tag.page.0 <= last) else {
        return Err(SharedError::OutOfRange {
            page: tag.page,
            last,
        });
    };
    if rec.gen != tag.gen {
        return Err(SharedError::StaleTag {
            tag,
            current: rec.gen,
        });
    }
    if !(rec.state.is_owned() || rec.state == kvsim_engine::kv::PageState::Quarantined) {
        return Err(SharedError::NotWritable {
            tag,
            state: rec.state,
        });
    }
    Ok(())
}

fn run(pages: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let shared = SharedPool::new(pages, 16);
    let mut pool = PagePool::new(pages, 16);
    let mut issued: Vec<PageTag> = Vec::new();
    let mut guards: Vec<Guard<'_>> = Vec::new();

    for (step, op) in ops.iter().enumerate() {
        let free_before = pool.free_count();
        let tags = |ps: &[Pick]| ps.iter().map(|p| resolve(&issued, p)).collect::<Vec<_>>();
        match op {
            Op::Alloc(n, o) => {
                let s = shared.alloc(*n, owner(*o));
                let p = pool.alloc(*n, owner(*o));
                prop_assert_eq!(&s, &p, "step {}: {:?}", step, op);
                if let Ok(t) = p {
                    issued.extend(t);
                }
            }
            Op::ExpectWrite(o, ps) => {
                let t = tags(ps);
                let s = shared.expect_write(owner(*o), &t);
                let p = pool.expect_write(owner(*o), &t);
                prop_assert_eq!(s, p, "step {}: {:?}", step, op);
            }
            Op::MarkReady(o, ps) => {
                let t = tags(ps);
                let s = shared.mark_ready(owner(*o), &t);
                let p = pool.mark_ready(owner(*o), &t);
                prop_assert_eq!(s, p, "step {}: {:?}", step, op);
            }
            Op::Quarantine(o, ps) => {
                let t = tags(ps);
                let s = shared.quarantine(owner(*o), &t);
                let p = pool.quarantine(owner(*o), &t);
                prop_assert_eq!(s, p, "step {}: {:?}", step, op);
            }
            Op::Release(o, ps) | Op::ReleaseQuarantined(o, ps) => {
                let t = tags(ps);
                let (s, p) = if matches!(op, Op::Release(..)) {
                    (shared.release(owner(*o), &t), pool.release(owner(*o), &t))
                } else {
                    (
                        shared.release_quarantined(owner(*o), &t),
                        pool.release_quarantined(owner(*o), &t),
                    )
                };
                prop_assert_eq!(
                    s.as_ref().map(|_| ()),
                    p.as_ref().map(|_| ()),
                    "step {}: {:?}",
                    step,
                    op
                );
                if let Ok(freed) = s {
                    prop_assert_eq!(
                        freed,
                        pool.free_count() - free_before,
                        "step {}: freed count",
                        step
                    );
                }
            }
            Op::Hold(pk) => {
                let t = resolve(&issued, pk);
                let s = shared.hold(t);
                let p = pool.hold(t);
                prop_assert_eq!(s, p, "step {}: {:?}", step, op);
            }
            Op::Unhold(pk) => {
                let t = resolve(&issued, pk);
                // A raw unhold must not take the hold a live guard owns: that is a
                // caller bug the guard then reports by panicking, not a disagreement.
                let by_guards = guards.iter().filter(|g| g.tag() == t).count();
                let holders = pool
                    .record(t.page)
                    .filter(|r| r.gen == t.gen)
                    .map_or(0, |r| usize::from(r.holders));
                if by_guards > 0 && holders <= by_guards {
                    continue;
                }
                let s = shared.unhold(t);
                let p = pool.unhold(t);
                prop_assert_eq!(
                    s.as_ref().map(|_| ()),
                    p.as_ref().map(|_| ()),
                    "step {}: {:?}",
                    step,
                    op
                );
                if let Ok(freed) = s {
                    prop_assert_eq!(
                        freed,
                        pool.free_count() > free_before,
                        "step {}: freed",
                        step
                    );
                }
            }
            Op::BeginRead(pk) => {
                let t = resolve(&issued, pk);
                let p = pool.hold(t);
                match shared.begin_read(t) {
                    Ok(g) => {
                        prop_assert_eq!(Ok(()), p, "step {}: {:?}", step, op);
                        guards.push(Guard::Read(g));
                    }
                    Err(e) => prop_assert_eq!(Err(e), p, "step {}: {:?}", step, op),
                }
            }
            Op::BeginWrite(pk) => {
                let t = resolve(&issued, pk);
                let expected = expected_write(&pool, t);
                match shared.begin_write(t) {
                    Ok(g) => {
                        prop_assert_eq!(expected, Ok(()), "step {}: {:?}", step, op);
                        pool.hold(t).expect("an owned current page accepts a hold");
                        guards.push(Guard::Write(g));
                    }
                    Err(e) => prop_assert_eq!(expected, Err(e), "step {}: {:?}", step, op),
                }
            }
            Op::EndGuard(i) => {
                if !guards.is_empty() {
                    let g = guards.swap_remove(i % guards.len());
                    let t = g.tag();
                    let freed = g.finish();
                    pool.unhold(t)
                        .expect("a guard's hold is current in the pool too");
                    prop_assert_eq!(
                        freed,
                        pool.free_count() > free_before,
                        "step {}: freed",
                        step
                    );
                }
            }
        }
        prop_assert_eq!(
            &shared.snapshot(),
            &pool,
            "step {}: records differ after {:?}",
            step,
            op
        );
        if let Err(v) = shared.invariants() {
            return Err(TestCaseError::fail(format!("step {step}: {v}")));
        }
    }
    // Letting go of every guard must leave both records agreeing, and full when every
    // owner has released.
    for g in guards.drain(..) {
        let t = g.tag();
        g.finish();
        pool.unhold(t)
            .expect("a guard's hold is current in the pool too");
    }
    prop_assert_eq!(&shared.snapshot(), &pool);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn shared_record_agrees_with_pool(pages in 1u32..6, ops in prop::collection::vec(op(), 1..80)) {
        run(pages, &ops)?;
    }
}

/// The life of one page through every path, as a fixed sequence: a regression anchor
/// for the property above.
#[test]
fn one_page_through_every_path() {
    use Op::*;
    let i = Pick::Issued;
    let ops = [
        Alloc(1, 0),
        ExpectWrite(0, vec![i(0)]),
        BeginWrite(i(0)),
        BeginRead(i(0)),
        Quarantine(0, vec![i(0)]),
        BeginWrite(i(0)),
        ReleaseQuarantined(0, vec![i(0)]),
        EndGuard(0),
        Alloc(1, 1),
        EndGuard(0),
        Alloc(1, 1),
        BeginWrite(i(0)),
        BeginWrite(i(1)),
        MarkReady(1, vec![i(1)]),
        Release(1, vec![i(1), i(1)]),
        Release(1, vec![i(1)]),
        EndGuard(0),
    ];
    run(1, &ops).unwrap();
}

/// The node's view: the same owner operations through [`PageRecords`] on a journaled
/// `PagePool` and on a `SharedRecord`, at a random incarnation, interleaved with the
/// landing gate ([`WriteGate::admit`], what `kv::land` asks for every destination page)
/// on both. Results, refusal words, journals (the trace a node makes of them) and the
/// whole record must agree at every step.
mod through_the_trait {
    use super::*;
    use kvsim_engine::kv::{PageChange, PageRecords, SharedRecord, WriteGate};
    use std::sync::Arc;

    #[derive(Clone, Debug)]
    enum NodeOp {
        Alloc(usize, u32),
        ExpectWrite(u32, Vec<Pick>),
        MarkReady(u32, Vec<Pick>),
        Quarantine(u32, Vec<Pick>),
        Release(u32, Vec<Pick>),
        ReleaseQuarantined(u32, Vec<Pick>),
        /// The transfer thread's gate: may a write of this room land in this page?
        Land(u32, Pick),
    }

    fn node_op() -> impl Strategy<Value = NodeOp> {
        let owner = 0u32..3;
        prop_oneof![
            3 => (0usize..4, owner.clone()).prop_map(|(n, o)| NodeOp::Alloc(n, o)),
            1 => (owner.clone(), picks()).prop_map(|(o, t)| NodeOp::ExpectWrite(o, t)),
            1 => (owner.clone(), picks()).prop_map(|(o, t)| NodeOp::MarkReady(o, t)),
            1 => (owner.clone(), picks()).prop_map(|(o, t)| NodeOp::Quarantine(o, t)),
            2 => (owner.clone(), picks()).prop_map(|(o, t)| NodeOp::Release(o, t)),
            1 => (owner.clone(), picks()).prop_map(|(o, t)| NodeOp::ReleaseQuarantined(o, t)),
            3 => (owner, pick()).prop_map(|(o, t)| NodeOp::Land(o, t)),
        ]
    }

    fn journal<R: PageRecords>(r: &mut R) -> Vec<PageChange> {
        let mut out = Vec::new();
        r.drain_changes(|c| out.push(c));
        out
    }

    fn run_node(pages: u32, epoch: u32, ops: &[NodeOp]) -> Result<(), TestCaseError> {
        let mut pool = PagePool::with_epoch(pages, 16, epoch).journal();
        let mut shared = SharedRecord::new(Arc::new(SharedPool::with_epoch(pages, 16, epoch)));
        let mut issued: Vec<PageTag> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let tags = |ps: &[Pick]| ps.iter().map(|p| resolve(&issued, p)).collect::<Vec<_>>();
            let (p, s): (Result<(), String>, Result<(), String>) = match op {
                NodeOp::Alloc(n, o) => {
                    let p = PageRecords::alloc(&mut pool, *n, owner(*o));
                    let s = shared.alloc(*n, owner(*o));
                    prop_assert_eq!(p.as_ref().ok(), s.as_ref().ok(), "step {}", step);
                    if let Ok(t) = p.clone() {
                        issued.extend(t);
                    }
                    (
                        p.map(|_| ()).map_err(|e| e.to_string()),
                        s.map(|_| ()).map_err(|e| e.to_string()),
                    )
                }
                NodeOp::ExpectWrite(o, ps) => {
                    let t = tags(ps);
                    (
                        PageRecords::expect_write(&mut pool, owner(*o), &t)
                            .map_err(|e| e.to_string()),
                        shared
                            .expect_write(owner(*o), &t)
                            .map_err(|e| e.to_string()),
                    )
                }
                NodeOp::MarkReady(o, ps) => {
                    let t = tags(ps);
                    (
                        PageRecords::mark_ready(&mut pool, owner(*o), &t)
                            .map_err(|e| e.to_string()),
                        shared.mark_ready(owner(*o), &t).map_err(|e| e.to_string()),
                    )
                }
                NodeOp::Quarantine(o, ps) => {
                    let t = tags(ps);
                    (
                        PageRecords::quarantine(&mut pool, owner(*o), &t)
                            .map_err(|e| e.to_string()),
                        shared.quarantine(owner(*o), &t).map_err(|e| e.to_string()),
                    )
                }
                NodeOp::Release(o, ps) => {
                    let t = tags(ps);
                    (
                        PageRecords::release(&mut pool, owner(*o), &t).map_err(|e| e.to_string()),
                        shared.release(owner(*o), &t).map_err(|e| e.to_string()),
                    )
                }
                NodeOp::ReleaseQuarantined(o, ps) => {
                    let t = tags(ps);
                    (
                        PageRecords::release_quarantined(&mut pool, owner(*o), &t)
                            .map_err(|e| e.to_string()),
                        shared
                            .release_quarantined(owner(*o), &t)
                            .map_err(|e| e.to_string()),
                    )
                }
                NodeOp::Land(o, pk) => {
                    let t = resolve(&issued, pk);
                    (
                        pool.admit(owner(*o), t),
                        shared.admit(owner(*o), t).map(drop),
                    )
                }
            };
            prop_assert_eq!(&p, &s, "step {}: {:?}", step, op);
            prop_assert_eq!(
                journal(&mut pool),
                journal(&mut shared),
                "step {}: journals",
                step
            );
            let snap = shared.with_pool(|s| s.clone());
            prop_assert_eq!(&snap, &pool, "step {}: records differ after {:?}", step, op);
            prop_assert_eq!(PageRecords::epoch(&pool), shared.epoch());
            if let Err(v) = PageRecords::invariants(&shared) {
                return Err(TestCaseError::fail(format!("step {step}: {v}")));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn node_records_and_gates_agree(
            pages in 1u32..6,
            epoch in 0u32..3,
            ops in prop::collection::vec(node_op(), 1..60),
        ) {
            run_node(pages, epoch, &ops)?;
        }
    }

    /// The gate's one rule, by name: a quarantined page takes its own room's write and
    /// refuses another's, in both records; after the drain ack nothing lands.
    #[test]
    fn quarantine_admits_its_own_rooms_writes_in_both_records() {
        let ops = vec![
            NodeOp::Alloc(1, 0),
            NodeOp::ExpectWrite(0, vec![Pick::Issued(0)]),
            NodeOp::Quarantine(0, vec![Pick::Issued(0)]),
            NodeOp::Land(0, Pick::Issued(0)),
            NodeOp::Land(1, Pick::Issued(0)),
            NodeOp::ReleaseQuarantined(0, vec![Pick::Issued(0)]),
            NodeOp::Land(0, Pick::Issued(0)),
        ];
        run_node(2, 1, &ops).unwrap();
        let mut pool = PagePool::with_epoch(2, 16, 1).journal();
        let a = PageRecords::alloc(&mut pool, 1, owner(0)).unwrap()[0];
        PageRecords::quarantine(&mut pool, owner(0), &[a]).unwrap();
        assert_eq!(pool.admit(owner(0), a), Ok(()));
        assert_eq!(
            pool.admit(owner(1), a),
            Err(format!("owned by {:?}", Some(owner(0))))
        );
        PageRecords::release_quarantined(&mut pool, owner(0), &[a]).unwrap();
        assert_eq!(pool.admit(owner(0), a), Err("owned by None".to_string()));
    }
}
