//! Fuzz what `kvsim merge` reads: any bytes give an error or a sweep summary that
//! merges (with itself: refused as a duplicate shard, or accepted), renders and
//! reports its coverage with no panic (overflow included) and no allocation over the
//! bound of `bounded_alloc`.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOC: bounded_alloc::Bounded = bounded_alloc::Bounded;

use kvsim_sim::sweep::SweepSummary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = serde_json::from_slice::<SweepSummary>(data) else {
        return;
    };
    let _ = s.render();
    let _ = s.coverage();
    let _ = s.complete();
    if let Ok(m) = SweepSummary::merge(std::slice::from_ref(&s)) {
        let _ = m.render();
        let _ = m.coverage();
        // A merge never claims more seeds than its range holds.
        assert!(m.seeds_run <= m.seeds.len());
    }
    let _ = SweepSummary::merge(&[s.clone(), s]);
});
