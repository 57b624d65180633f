//! S10, reply correctness: the oracle knows every 200 reply exactly (echo attention
//! over the request's own canary prompt) from the trace alone, and fires on a planted
//! reply that is one token too long, one token too short, or carries a token of its
//! own prompt from the wrong position (which the canary check cannot see). The
//! defended engine's replies all pass it.

mod common;

use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use kvsim_oracle::schema::{Entry, Record};
use kvsim_oracle::Oracle;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::{run_plan, Backend, RunOutcome};

fn clean_run(seed: u64) -> RunOutcome {
    let sc = common::scenario("scenarios/mixed-faults.toml");
    let plan = Plan::build(&sc, seed, Some(BugSet::NONE), &Reduction::default()).unwrap();
    let out = run_plan(&plan, Backend::Symbolic, true);
    assert!(out.clean(), "seed {seed}: {:?}", out.broken());
    out
}

/// Judge a trace afresh after `edit` changed the first 200 `RouterResponse` it takes.
fn judge_edited(
    out: &RunOutcome,
    edit: impl Fn(&mut Vec<u32>) -> bool,
) -> Vec<(Invariant, String)> {
    let mut oracle = Oracle::new(out.header.clone());
    let mut edited = false;
    for e in &out.trace {
        let mut e: Entry = e.clone();
        if !edited {
            if let Record::Engine(TraceEvent::RouterResponse { status, tokens, .. }) = &mut e.rec {
                if status.is_ok() {
                    edited = edit(tokens);
                }
            }
        }
        oracle.observe(&e);
    }
    assert!(edited, "the run has no 200 reply to edit");
    oracle
        .findings()
        .iter()
        .map(|f| (f.violation.invariant, f.violation.detail.clone()))
        .collect()
}

#[test]
fn the_defended_engine_answers_every_200_exactly() {
    let mut ok = 0;
    for seed in 0..20 {
        let out = clean_run(seed);
        assert!(
            !out.found().contains(&Invariant::S10),
            "seed {seed}: {:?}",
            out.findings
        );
        ok += out
            .replies
            .values()
            .flatten()
            .filter(|r| r.status.is_ok())
            .count();
    }
    // The check did run: the runs have 200 replies.
    assert!(ok > 100, "{ok} replies of 200");
}

#[test]
fn a_reply_one_token_too_long_is_s10() {
    let out = clean_run(1);
    let f = judge_edited(&out, |t| {
        let last = *t.last().unwrap();
        t.push(last);
        true
    });
    assert!(
        f.iter()
            .any(|(i, d)| *i == Invariant::S10 && d.contains("tokens; it asked for")),
        "{f:?}"
    );
}

#[test]
fn a_reply_one_token_short_is_s10() {
    let out = clean_run(1);
    let f = judge_edited(&out, |t| t.pop().is_some());
    assert!(f.iter().any(|(i, _)| *i == Invariant::S10), "{f:?}");
}

/// A token of the request's own prompt from the wrong position: the canary check
/// (whose prompt does a token come from) passes it, only S10 fires.
#[test]
fn a_reply_echoing_the_wrong_position_of_its_own_prompt_is_s10_only() {
    let out = clean_run(2);
    let f = judge_edited(&out, |t| {
        t[0] ^= 1;
        true
    });
    assert!(
        f.iter()
            .any(|(i, d)| *i == Invariant::S10 && d.contains("token 0")),
        "{f:?}"
    );
    assert!(f.iter().all(|(i, _)| *i == Invariant::S10), "{f:?}");
}

/// A trace from an engine that does not declare echo replies is not held to S10.
#[test]
fn s10_needs_the_header_to_declare_echo_replies() {
    let mut out = clean_run(1);
    out.header.echo_replies = false;
    let f = judge_edited(&out, |t| {
        t[0] ^= 1;
        true
    });
    assert!(f.iter().all(|(i, _)| *i != Invariant::S10), "{f:?}");
}
