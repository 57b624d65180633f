//! Loom models of `kv::shared::SharedPool`: the races between the paths that hold one
//! node's pages at once on real hardware, explored over every interleaving loom reaches.
//!
//! Each model runs 2 or 3 threads (transfer receiver, offload, owner, abort path) over
//! a one- or two-page pool, and stands in for the KV memory with loom `UnsafeCell`s, so a write
//! or read that is not ordered after the page's previous use is reported by loom as a
//! causality violation even when no assertion looks at it. The mutation tests run the
//! same models on a record with a race planted in it and require loom to find it, so
//! these models are known to be able to fail. This file is not a benchmark or a
//! stress test, and it only builds under `RUSTFLAGS="--cfg loom"`.
//!
//! The two `node_*_while_the_transfer_thread_lands` models are the hardware runtime's
//! real pair of threads on a decode node: the node's loop quarantining or releasing a
//! room while the transfer thread lands a write for it with the engine's `kv::land`.
//!
//! Bounds: six models are explored without a preemption bound (they finish in seconds);
//! the two with three busy threads run within `HEAVY_PREEMPTIONS`, which keeps
//! the whole run near a minute on 2 cores. `KVSIM_LOOM_PREEMPTIONS=N` bounds every model
//! at N, `KVSIM_LOOM_PREEMPTIONS=none` explores every model unbounded (hours). Each model
//! pins the number of interleavings it explores at the default bounds, so a change to the
//! record's synchronisation shows up as a changed count to review. See
//! docs/PERFORMANCE-LOG.md (section "kv::shared") for the commands and their running times.
#![cfg(loom)]

use kvsim_engine::gpu::{DeviceError, Gpu, KvPayload, WriteError, WriteTag};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};
use kvsim_engine::kv::shared::{PlantedRace, SharedError, SharedPool, WriteGuard};
use kvsim_engine::kv::{land, Refusal};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// The preemption bound of the models with three busy threads, whose unbounded state
/// space takes hours; the planted races are caught at a bound of 2.
const HEAVY_PREEMPTIONS: usize = 6;

const A: RoomKey = RoomKey::new(1, 1);
const B: RoomKey = RoomKey::new(2, 1);
const C: RoomKey = RoomKey::new(3, 1);

/// What each owner writes into its page, so a read can tell whose KV it saw.
const EMPTY: u64 = 0;
const A_KV: u64 = 0xA;
const B_KV: u64 = 0xB;
const C_KV: u64 = 0xC;

/// A loom builder with the model's default bound, unless the environment names one:
/// `KVSIM_LOOM_PREEMPTIONS` (a number, or `none`), then loom's own
/// `LOOM_MAX_PREEMPTIONS`. The second value says whether the default was kept.
fn builder(default: Option<usize>) -> (loom::model::Builder, bool) {
    let mut b = loom::model::Builder::new();
    match std::env::var("KVSIM_LOOM_PREEMPTIONS").as_deref() {
        Ok("none") => b.preemption_bound = None,
        Ok(n) => {
            let n = n.parse().expect("KVSIM_LOOM_PREEMPTIONS: a number or none");
            b.preemption_bound = Some(n);
        }
        Err(_) if b.preemption_bound.is_some() => {}
        Err(_) => {
            b.preemption_bound = default;
            return (b, true);
        }
    }
    (b, false)
}

/// Run `model` over every interleaving within its bound, print how many loom explored
/// (the figure docs/PERFORMANCE-LOG.md (section "kv::shared") records), and at the
/// default bound require the pinned count.
fn check(
    name: &str,
    default: Option<usize>,
    pinned: usize,
    model: impl Fn() + Sync + Send + 'static,
) {
    // Counting runs happens outside the model, so it uses std's atomics; one counter
    // per call, as the tests run in parallel.
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let (b, at_default) = builder(default);
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, SeqCst);
        model()
    });
    let runs = runs.load(SeqCst);
    eprintln!(
        "{name}: {runs} interleavings, preemption bound {:?}",
        b.preemption_bound
    );
    if at_default {
        assert_eq!(
            runs, pinned,
            "{name} explored {runs} interleavings, pinned {pinned}: the record's \
             synchronisation or the model changed; review, then update the pin"
        );
    }
}

/// Run `model` with `race` planted and require loom to report a failure. Returns the
/// failure's message, so the caller can check it is the race and not something else.
fn must_catch(race: PlantedRace, model: fn(Option<PlantedRace>)) -> String {
    let (b, _) = builder(Some(2));
    let outcome = std::panic::catch_unwind(|| b.check(move || model(Some(race))));
    match outcome {
        Ok(()) => panic!("loom explored every interleaving and missed the planted {race:?}"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    }
}

fn pool(pages: u32, race: Option<PlantedRace>) -> SharedPool {
    match race {
        None => SharedPool::new(pages, 16),
        Some(race) => SharedPool::with_planted_race(pages, 16, race),
    }
}

/// The KV memory of a pool, one loom-tracked cell per page: loom reports any two
/// accesses to a page that are not ordered by the record's synchronisation.
struct Kv(Vec<UnsafeCell<u64>>);

// SAFETY: every access goes through loom's `UnsafeCell`, which checks (and panics on)
// unordered concurrent access instead of letting it happen.
unsafe impl Sync for Kv {}

impl Kv {
    fn new(pages: usize) -> Self {
        Kv((0..pages).map(|_| UnsafeCell::new(EMPTY)).collect())
    }

    fn cell(&self, page: PageId) -> &UnsafeCell<u64> {
        &self.0[page.0 as usize - 1]
    }

    /// Apply a write under its guard. The page must still be the generation the write
    /// was issued for: otherwise the write would land in another request's KV.
    fn write(&self, pool: &SharedPool, guard: &WriteGuard<'_>, value: u64) {
        let tag = guard.tag();
        assert_eq!(
            pool.tag(tag.page),
            Some(tag),
            "a write for {tag} is applied to a page reallocated since"
        );
        self.cell(tag.page).with_mut(|p| unsafe { *p = value });
    }

    fn read(&self, page: PageId) -> u64 {
        self.cell(page).with(|p| unsafe { *p })
    }
}

fn assert_invariants(pool: &SharedPool) {
    if let Err(v) = pool.invariants() {
        panic!("{v}");
    }
}

/// How the abort path gives the page back.
#[derive(Clone, Copy)]
enum Abort {
    /// Free at once (holds keep the page Draining until they let go).
    Release,
    /// Quarantine, then release on the writer's drain ack.
    QuarantineThenAck,
}

/// A transfer receiver writes incoming KV into a request's two pages while the
/// request's abort path frees them and a new request takes one. Each write lands while
/// the page is still the first request's, or is refused; never in the new request's
/// page. Two threads: the receiver, and the abort path (main).
fn transfer_write_vs_abort(race: Option<PlantedRace>, abort: Abort) {
    let pool = Arc::new(pool(2, race));
    let kv = Arc::new(Kv::new(2));
    let a = pool.alloc(2, A).unwrap();
    pool.expect_write(A, &a).unwrap();

    let receiver = {
        let (pool, kv, a) = (pool.clone(), kv.clone(), a.clone());
        thread::spawn(move || {
            for t in a {
                match pool.begin_write(t) {
                    Ok(g) => kv.write(&pool, &g, A_KV),
                    Err(SharedError::NotWritable { .. } | SharedError::StaleTag { .. }) => {}
                    Err(e) => panic!("unexpected refusal: {e}"),
                }
            }
        })
    };

    match abort {
        Abort::Release => {
            pool.release(A, &a).unwrap();
        }
        Abort::QuarantineThenAck => {
            pool.quarantine(A, &a).unwrap();
            pool.release_quarantined(A, &a).unwrap();
        }
    }
    let b = match pool.alloc(1, B) {
        Ok(tags) => {
            let b = tags[0];
            let g = pool.begin_write(b).unwrap();
            kv.write(&pool, &g, B_KV);
            drop(g);
            assert_eq!(kv.read(b.page), B_KV, "B reads its own KV");
            Some(b)
        }
        // Both pages still held by the receiver: nothing to reuse yet.
        Err(SharedError::Exhausted { .. }) => None,
        Err(e) => panic!("unexpected: {e}"),
    };

    receiver.join().unwrap();
    assert_invariants(&pool);
    if let Some(b) = b {
        assert_eq!(kv.read(b.page), B_KV, "a late write overwrote B's KV");
        let stale = a.iter().find(|t| t.page == b.page).unwrap();
        assert!(pool.begin_write(*stale).is_err(), "stale tag accepted");
    }
    assert_eq!(pool.free_count() + usize::from(b.is_some()), 2);
}

#[test]
fn loom_transfer_write_races_abort_release() {
    check(
        "loom_transfer_write_races_abort_release",
        None,
        1793,
        || transfer_write_vs_abort(None, Abort::Release),
    );
}

#[test]
fn loom_transfer_write_races_abort_quarantine() {
    check(
        "loom_transfer_write_races_abort_quarantine",
        None,
        136610,
        || transfer_write_vs_abort(None, Abort::QuarantineThenAck),
    );
}

/// Two offloads read a Ready page to host memory while the owner releases it and a
/// new request is given it. Each offload sees the old owner's KV or is refused; the page
/// goes back to the free list exactly once, by whichever of the three lets go last.
/// Three threads: two offloads, and the owner (main).
fn offload_read_vs_release_and_realloc(race: Option<PlantedRace>) {
    let pool = Arc::new(pool(1, race));
    let kv = Arc::new(Kv::new(1));
    let a = pool.alloc(1, A).unwrap()[0];
    {
        let g = pool.begin_write(a).unwrap();
        kv.write(&pool, &g, A_KV);
    }
    pool.mark_ready(A, &[a]).unwrap();

    let offload = || {
        let (pool, kv) = (pool.clone(), kv.clone());
        thread::spawn(move || match pool.begin_read(a) {
            Ok(g) => {
                assert_eq!(
                    kv.read(a.page),
                    A_KV,
                    "offload of {a} read another tenant's KV"
                );
                usize::from(g.finish())
            }
            Err(SharedError::StaleTag { .. } | SharedError::Illegal { .. }) => 0,
            Err(e) => panic!("unexpected refusal: {e}"),
        })
    };
    let (first, second) = (offload(), offload());

    let freed_by_owner = pool.release(A, &[a]).unwrap();
    let reused = match pool.alloc(1, B) {
        Ok(tags) => {
            let g = pool.begin_write(tags[0]).unwrap();
            kv.write(&pool, &g, B_KV);
            true
        }
        Err(SharedError::Exhausted { .. }) => false,
        Err(e) => panic!("unexpected: {e}"),
    };
    let freed_by_offloads = first.join().unwrap() + second.join().unwrap();

    assert_eq!(
        freed_by_owner + freed_by_offloads,
        1,
        "the page must return to the free list exactly once"
    );
    assert_eq!(pool.free_count() + usize::from(reused), 1);
    assert_invariants(&pool);
}

#[test]
fn loom_offload_read_races_release_and_reallocation() {
    check(
        "loom_offload_read_races_release_and_reallocation",
        Some(HEAVY_PREEMPTIONS),
        430350,
        || offload_read_vs_release_and_realloc(None),
    );
}

/// The finish path and the abort path both release the same request's page while a
/// send still holds it. Exactly one release is accepted, and exactly one of the three
/// paths returns the page to the free list. Three threads: finish, abort, and the
/// send (main).
fn two_releases_and_a_holder(race: Option<PlantedRace>) {
    let pool = Arc::new(pool(1, race));
    let a = pool.alloc(1, A).unwrap()[0];
    pool.mark_ready(A, &[a]).unwrap();
    pool.hold(a).unwrap();

    let release = |pool: Arc<SharedPool>| {
        thread::spawn(move || match pool.release(A, &[a]) {
            Ok(freed) => (true, freed),
            Err(SharedError::NotOwner { owner: None, .. }) => (false, 0),
            Err(e) => panic!("unexpected refusal: {e}"),
        })
    };
    let finish = release(pool.clone());
    let abort = release(pool.clone());
    let freed_by_holder = usize::from(pool.unhold(a).expect("the send's hold is current"));

    let (finish_ok, freed_by_finish) = finish.join().unwrap();
    let (abort_ok, freed_by_abort) = abort.join().unwrap();
    assert!(finish_ok ^ abort_ok, "exactly one release is accepted");
    assert_eq!(
        freed_by_finish + freed_by_abort + freed_by_holder,
        1,
        "exactly one path returns the page"
    );
    assert_eq!(pool.free_list(), vec![a.page]);
    assert_invariants(&pool);
}

#[test]
fn loom_two_releases_race_one_returns_the_page() {
    check(
        "loom_two_releases_race_one_returns_the_page",
        None,
        979,
        || two_releases_and_a_holder(None),
    );
}

/// A late write tagged with the first generation races the owner freeing the page and
/// a new request taking it: it lands while the first owner still has the page, or it
/// is refused. Once the page is reallocated, it is always refused. Two threads: the
/// late writer, and the owner then the new owner (main).
fn stale_write_vs_reallocation(race: Option<PlantedRace>) {
    let pool = Arc::new(pool(1, race));
    let kv = Arc::new(Kv::new(1));
    let a = pool.alloc(1, A).unwrap()[0];
    pool.expect_write(A, &[a]).unwrap();

    let late = {
        let (pool, kv) = (pool.clone(), kv.clone());
        thread::spawn(move || {
            if let Ok(g) = pool.begin_write(a) {
                kv.write(&pool, &g, A_KV);
            }
        })
    };

    pool.release(A, &[a]).unwrap();
    if let Ok(tags) = pool.alloc(1, B) {
        let b = tags[0];
        let g = pool.begin_write(b).unwrap();
        kv.write(&pool, &g, B_KV);
        drop(g);
        assert!(
            matches!(pool.begin_write(a), Err(SharedError::StaleTag { tag, current })
                if tag == a && current == b.gen),
            "a write tagged {a} after reallocation to {b} must be refused"
        );
    }
    late.join().unwrap();
    assert_invariants(&pool);
}

#[test]
fn loom_stale_write_races_reallocation() {
    check("loom_stale_write_races_reallocation", None, 213, || {
        stale_write_vs_reallocation(None)
    });
}

/// After the page has been reallocated, a write and a read tagged with the old
/// generation race the new owner's write and a further release and reallocation: both
/// are refused every time, and the write never changes the page. Three threads: the
/// late writer, the late reader, and the new owners (main).
fn stale_write_after_reallocation(race: Option<PlantedRace>) {
    let pool = Arc::new(pool(1, race));
    let kv = Arc::new(Kv::new(1));
    let a = pool.alloc(1, A).unwrap()[0];
    pool.release(A, &[a]).unwrap();
    let b = pool.alloc(1, B).unwrap()[0];

    let late_write = {
        let pool = pool.clone();
        thread::spawn(move || {
            assert!(
                matches!(pool.begin_write(a), Err(SharedError::StaleTag { .. })),
                "a stale write was accepted"
            );
        })
    };
    let late_read = {
        let pool = pool.clone();
        thread::spawn(move || {
            assert!(
                matches!(pool.begin_read(a), Err(SharedError::StaleTag { .. })),
                "a stale read was accepted"
            );
        })
    };

    {
        let g = pool.begin_write(b).unwrap();
        kv.write(&pool, &g, B_KV);
    }
    pool.release(B, &[b]).unwrap();
    let c = pool.alloc(1, C).unwrap()[0];
    {
        let g = pool.begin_write(c).unwrap();
        kv.write(&pool, &g, C_KV);
    }
    late_write.join().unwrap();
    late_read.join().unwrap();
    assert_eq!(kv.read(c.page), C_KV);
    assert_eq!(pool.tag(c.page), Some(c));
    assert_invariants(&pool);
}

#[test]
fn loom_stale_write_after_reallocation_always_refused() {
    check(
        "loom_stale_write_after_reallocation_always_refused",
        Some(HEAVY_PREEMPTIONS),
        273126,
        || stale_write_after_reallocation(None),
    );
}

/// The KV memory of [`Kv`] seen through the engine's `Gpu` trait, as the runtime's
/// transfer thread writes it: `kv::land` calls `write_page` only under the shared
/// record's write guards. Only what landing uses is implemented.
struct LoomGpu(Arc<Kv>);

/// One page's KV as the loom models write it: a word naming its writer. The data
/// faults' alterations are the simulator's business, never applied here.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct LoomPage(u64);

impl KvPayload for LoomPage {
    fn corrupt(&mut self, _: u64) {
        unreachable!("the loom models inject no data fault")
    }
    fn tear(&mut self) {
        unreachable!("the loom models inject no data fault")
    }
    fn keep_slots(&mut self, _: usize) {}
}

impl Gpu for LoomGpu {
    type Kv = LoomPage;
    fn page_size(&self) -> u32 {
        16
    }
    fn pages(&self) -> u32 {
        self.0 .0.len() as u32
    }
    fn write_tokens(
        &mut self,
        _: &[PageTag],
        _: u64,
        _: &[Token],
        _: RoomKey,
    ) -> Result<(), WriteError> {
        unreachable!("landing writes whole pages")
    }
    fn read_page(&self, page: PageId) -> Result<LoomPage, DeviceError> {
        Ok(LoomPage(self.0.read(page)))
    }
    fn write_page(
        &mut self,
        dst: PageTag,
        _room: RoomKey,
        kv: &LoomPage,
    ) -> Result<(), WriteError> {
        self.0.cell(dst.page).with_mut(|p| unsafe { *p = kv.0 });
        Ok(())
    }
    fn page_tag(&self, _: PageId) -> Result<Option<WriteTag>, DeviceError> {
        Ok(None)
    }
    fn attend(&self, _: &[PageId], _: u64, _: u64) -> Result<Token, DeviceError> {
        unreachable!("landing does not attend")
    }
    fn token_at(&self, _: &[PageId], _: u64) -> Result<Token, DeviceError> {
        unreachable!("landing does not read tokens")
    }
    fn zero_page(&mut self, _: PageId) -> Result<(), DeviceError> {
        unreachable!("landing does not zero")
    }
}

/// What the node's loop does to the room while its transfer thread lands a write.
#[derive(Clone, Copy)]
enum NodeSide {
    /// The room fails mid-transfer: quarantine; the drain ack (and so the release)
    /// comes only after the write's completion, as the protocol orders it.
    QuarantineThenAckAfterCompletion,
    /// The room lets go while a late write lands (the finish or failure path): the
    /// write lands under its hold before the release, or is refused after it.
    ReleaseWhileLanding,
}

/// The runtime's real pair of threads on one decode node: the transfer thread lands a
/// two-page write of room A with the engine's `kv::land` (the function the simulator's
/// delivery calls too), gated by the node's `SharedPool`; the node's loop quarantines
/// or releases room A meanwhile, then gives a page to room B and writes B's KV. A's
/// write never reaches B's page, and quarantine admits A's write (the one rule for
/// writes into quarantined pages). Two threads: the transfer thread, the loop (main).
fn node_vs_transfer_thread(side: NodeSide, race: Option<PlantedRace>) {
    let pool = Arc::new(pool(2, race));
    let kv = Arc::new(Kv::new(2));
    let a = pool.alloc(2, A).unwrap();
    pool.expect_write(A, &a).unwrap();

    let transfer = {
        let (pool, kv, a) = (pool.clone(), kv.clone(), a.clone());
        thread::spawn(move || {
            let mut gpu = LoomGpu(kv);
            land(
                &*pool,
                &mut gpu,
                true,
                A,
                &a,
                &[LoomPage(A_KV), LoomPage(A_KV)],
            )
        })
    };

    let mut transfer = Some(transfer);
    let landing = match side {
        NodeSide::QuarantineThenAckAfterCompletion => {
            pool.quarantine(A, &a).unwrap();
            // The completion reaches the writer, whose drain ack then releases.
            let landing = transfer.take().map(|t| t.join().unwrap());
            assert_eq!(
                landing,
                Some(Ok(())),
                "a quarantined page takes its room's write"
            );
            assert_eq!(pool.release_quarantined(A, &a), Ok(2));
            landing
        }
        NodeSide::ReleaseWhileLanding => {
            pool.release(A, &a).unwrap();
            None
        }
    };
    let b = match pool.alloc(1, B) {
        Ok(tags) => {
            let b = tags[0];
            let g = pool.begin_write(b).unwrap();
            kv.write(&pool, &g, B_KV);
            Some(b)
        }
        // Both pages still held by the landing write.
        Err(SharedError::Exhausted { .. }) => None,
        Err(e) => panic!("unexpected: {e}"),
    };
    let landing = match (landing, transfer) {
        (Some(l), _) => l,
        (None, Some(t)) => t.join().unwrap(),
        (None, None) => unreachable!("the transfer thread is joined once"),
    };
    match &landing {
        Ok(()) => {}
        Err(Refusal { reason, .. }) => assert!(
            reason.starts_with("owned by") || reason.starts_with("stale generation"),
            "unexpected refusal: {reason}"
        ),
    }
    if let Some(b) = b {
        assert_eq!(kv.read(b.page), B_KV, "A's write reached B's page");
    }
    assert_invariants(&pool);
    assert_eq!(pool.free_count() + usize::from(b.is_some()), 2);
}

#[test]
fn loom_node_quarantines_while_the_transfer_thread_lands() {
    check(
        "loom_node_quarantines_while_the_transfer_thread_lands",
        None,
        180,
        || node_vs_transfer_thread(NodeSide::QuarantineThenAckAfterCompletion, None),
    );
}

#[test]
fn loom_node_releases_while_the_transfer_thread_lands() {
    check(
        "loom_node_releases_while_the_transfer_thread_lands",
        None,
        894,
        || node_vs_transfer_thread(NodeSide::ReleaseWhileLanding, None),
    );
}

/// The new models can fail: with the hold's check and increment split, the landing
/// that races the release must be caught (the write reaches the page reallocated to B,
/// the free page gains a holder, or the landing's hold is lost to a reallocation).
#[test]
fn loom_catches_planted_split_hold_check_in_landing() {
    let msg = must_catch(PlantedRace::SplitHoldCheck, |race| {
        node_vs_transfer_thread(NodeSide::ReleaseWhileLanding, race)
    });
    eprintln!("loom caught the planted SplitHoldCheck in landing: {msg}");
    assert!(
        msg.contains("A's write reached B's page")
            || msg.contains("(S1)")
            || msg.contains("hold was lost"),
        "loom failed, but not on the planted race: {msg}"
    );
}

/// The mutation check, part 1: with the hold's generation check and its increment
/// split in two, the transfer-write model must fail, and on the race itself: the late
/// write reaches the reallocated page, or the free page gains a holder.
#[test]
fn loom_catches_planted_split_hold_check() {
    let msg = must_catch(PlantedRace::SplitHoldCheck, |race| {
        transfer_write_vs_abort(race, Abort::Release)
    });
    eprintln!("loom caught the planted SplitHoldCheck: {msg}");
    assert!(
        msg.contains("reallocated since") || msg.contains("(S1)"),
        "loom failed, but not on the planted race: {msg}"
    );
}

/// The mutation check, part 2: with the owner's release deciding from one load and
/// writing with a plain store, the two-releases model must fail, and on the race
/// itself: a hold is wiped out, so the page is never returned or a holder loses it.
#[test]
fn loom_catches_planted_split_release_check() {
    let msg = must_catch(PlantedRace::SplitReleaseCheck, two_releases_and_a_holder);
    eprintln!("loom caught the planted SplitReleaseCheck: {msg}");
    assert!(
        msg.contains("exactly one path returns the page") || msg.contains("hold was lost"),
        "loom failed, but not on the planted race: {msg}"
    );
}
