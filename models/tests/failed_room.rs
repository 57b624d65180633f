//! The `failed-room` model (issue 37, class 6): under `sglang-router`, prefill refuses a
//! request at intake after decode reserved pages for it, and no timer longer than the
//! run fires (decode's waiting timeout, the router's request timeout). The defended
//! engine is exhausted clean, its state count pinned (docs/COUNTS.md); with
//! `prefill-drops-failed-page-list` decode is left holding the room at quiescence.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, ModelSpec};

const FAILED_ROOM: usize = 21_267;

#[test]
fn failed_room_is_clean_with_a_pinned_state_count() {
    let r = check(ModelSpec::failed_room(), &CheckOptions::default()).unwrap();
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    assert!(matches!(
        r.status(names::COMPLETES),
        Some(Verdict::Reached { .. })
    ));
    assert_eq!(
        r.unique, FAILED_ROOM,
        "state count changed: re-check, then re-pin (docs/COUNTS.md)"
    );
}

/// The switch restores the silent drop: decode's room outlives the run, and the
/// quiescence property (L1-L4) breaks; no safety property does.
#[test]
fn prefill_drops_failed_page_list_is_found_at_quiescence() {
    let bugs = BugSet::NONE.with(Bug::PrefillDropsFailedPageList);
    let r = check(
        ModelSpec::failed_room().with_bugs(bugs),
        &CheckOptions::default(),
    )
    .unwrap();
    assert!(
        matches!(r.status(names::QUIESCENCE), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
    for safety in [
        names::S1,
        names::S2,
        names::S3,
        names::S4,
        names::S6,
        names::S9,
    ] {
        assert!(
            !matches!(r.status(safety), Some(Verdict::Violated { .. })),
            "{safety}: {}",
            r.render()
        );
    }
    println!("{}", r.render());
}
