//! The `prefix-hit` model (sglang #30545): prefill's radix cache holds the first page
//! of a 4-page prompt on a chunk grid of two pages, so the first KV write carries the
//! cached page with the first computed chunk and the second starts off the grid. The
//! defended engine writes every chunk at its own position; `chunk-index-by-position`
//! lands the second at the grid slot of its index. Small enough for the default
//! `cargo test`.

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::invariant::Invariant;
use kvsim_models::check::{invariant_of, Verdict};
use kvsim_models::{check, names, CheckOptions, CheckReport, ModelSpec};

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

/// The invariants whose counterexamples replay through the simulator's nodes and
/// oracle to the same invariant.
#[track_caller]
fn replayed(r: &CheckReport) -> Vec<Invariant> {
    let mut broken = Vec::new();
    for c in &r.counterexamples {
        let Some(inv) = invariant_of(c.property) else {
            continue;
        };
        let out = c.replay.as_ref().expect("every counterexample replays");
        assert!(
            out.broken.contains(&inv),
            "{inv} replays to {:?}",
            out.broken
        );
        broken.push(inv);
    }
    broken
}

const PREFIX_HIT: usize = 203;

#[test]
fn prefix_hit_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::prefix_hit());
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
    assert_eq!(
        r.unique, PREFIX_HIT,
        "re-check, then re-pin (docs/COUNTS.md)"
    );
}

/// With every defense on, decode's verification refuses the transfer whose last page
/// the skewed chunk never wrote: S4 (detected, which breaks the property in a model
/// whose detections do not hold), and the counterexample replays to it.
#[test]
fn chunk_index_by_position_breaks_s4_and_replays() {
    let spec = ModelSpec::prefix_hit().with_bugs(BugSet::NONE.with(Bug::ChunkIndexByPosition));
    let r = run(spec);
    assert!(r.violated(), "{}", r.render());
    assert!(replayed(&r).contains(&Invariant::S4), "{}", r.render());
    assert!(matches!(
        r.status(names::S4),
        Some(Verdict::Violated { .. })
    ));
}

/// With verification and the read-time tag check off (the incident's deployment ran
/// without tags), decode accepts and reads: the page the skewed chunk landed in holds
/// the room's own KV, at its generation, meant for the positions of the page after
/// it. S3 judges the position a slot was written for, so that read is S3 violated
/// (an owner check passes it: the room wrote it), and it replays to S3. The reply
/// (one token, echoing position 0) cannot see it.
#[test]
fn without_verification_or_tags_the_skewed_chunk_is_read_and_breaks_s3_by_position() {
    let mut spec = ModelSpec::prefix_hit().with_bugs(BugSet::NONE.with(Bug::ChunkIndexByPosition));
    spec.engine.defenses.verify_on_completion = false;
    spec.engine.defenses.page_tags = false;
    let r = run(spec);
    assert!(replayed(&r).contains(&Invariant::S3), "{}", r.render());
    assert_eq!(r.status(names::S10), Some(Verdict::Holds), "{}", r.render());
    let c = r.counterexample(names::S3).unwrap();
    let out = c.replay.as_ref().unwrap();
    let s3 = out
        .findings
        .iter()
        .find(|f| f.violation.invariant == Invariant::S3)
        .unwrap();
    assert_eq!(s3.detected_by, None, "violated, not detected");
    assert!(
        s3.violation.detail.contains("written for positions 6..7"),
        "{}",
        s3.violation.detail
    );
}

/// With verification off and the read-time tag check on, the tag check refuses the
/// read at the page the skewed chunk never wrote (its tag is not the room's), while
/// the first page the oracle finds wrong is the misplaced one before it: the
/// detection names both, the page it judges and the page whose check failed.
#[test]
fn the_tag_checks_refusal_names_the_page_whose_tag_failed() {
    let mut spec = ModelSpec::prefix_hit().with_bugs(BugSet::NONE.with(Bug::ChunkIndexByPosition));
    spec.engine.defenses.verify_on_completion = false;
    let r = run(spec);
    let c = r.counterexample(names::S3).expect("S3 (detected) is found");
    let out = c.replay.as_ref().expect("every counterexample replays");
    let s3 = out
        .findings
        .iter()
        .find(|f| f.violation.invariant == Invariant::S3)
        .expect("the replay finds S3");
    assert_eq!(s3.detected_by, Some("page_tags"), "{}", s3.violation.detail);
    assert!(
        s3.violation.detail.contains("written for positions 6..7")
            && s3
                .violation
                .detail
                .contains("(the check failed at page p4@g1)"),
        "{}",
        s3.violation.detail
    );
}
