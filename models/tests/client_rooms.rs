//! The `client-rooms` model (issue 37, class 2): another party's start pair for a
//! live room use (`world::colliding_starts`, the simulator's `client_room_permille`
//! sends the same). The defended engine is exhausted clean, its state count pinned
//! (docs/COUNTS.md); with `duplicate-room-joins-live` a half takes the other party's
//! request over, and the counterexample replays on the hand-stepped driver.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::invariant::Invariant;
use kvsim_models::check::Verdict;
use kvsim_models::{check, names, CheckOptions, ModelSpec};

const CLIENT_ROOMS: usize = 127;

#[test]
fn client_rooms_is_clean_with_a_pinned_state_count() {
    let r = check(ModelSpec::client_rooms(), &CheckOptions::default()).unwrap();
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    assert!(matches!(
        r.status(names::COMPLETES),
        Some(Verdict::Reached { .. })
    ));
    assert_eq!(
        r.unique, CLIENT_ROOMS,
        "state count changed: re-check, then re-pin (docs/COUNTS.md)"
    );
}

#[test]
fn duplicate_room_joins_live_is_found_and_replays() {
    let bugs = BugSet::NONE.with(Bug::DuplicateRoomJoinsLive);
    let r = check(
        ModelSpec::client_rooms().with_bugs(bugs),
        &CheckOptions::default(),
    )
    .unwrap();
    println!("{}", r.render());
    let broken = r
        .properties
        .iter()
        .find(|p| matches!(p.verdict, Verdict::Violated { .. }))
        .map(|p| p.name)
        .expect("the switch breaks a property");
    assert_eq!(broken, names::S4, "{}", r.render());
    let c = r.counterexample(names::S4).unwrap();
    assert!(c.replay.as_ref().unwrap().broken.contains(&Invariant::S4));
}
