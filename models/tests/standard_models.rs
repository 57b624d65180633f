//! The standard models at reduced bounds, fast enough for the default `cargo test`
//! in debug builds. Each test pins an exact unique-state count: a change to the
//! engine's semantics (or to the model's environment) moves it, and the change must
//! then be explained and the pin updated in the same commit.
//!
//! The full standard models run behind `#[ignore]`:
//! `cargo test --release -p kvsim-models -- --ignored` (see docs/PERFORMANCE-LOG.md, "Model checker performance").

use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::Defenses;
use kvsim_engine::decode::DecodePhase;
use kvsim_engine::ids::RoomKey;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::{Carried, KvWrite};
use kvsim_engine::world::DataFault;
use kvsim_engine::Timer;
use kvsim_models::check::{invariant_of, Verdict};
use kvsim_models::model_state::{altered, DECODE};
use kvsim_models::replay::replay;
use kvsim_models::schedule::{MessageStep, Step};
use kvsim_models::State;
use kvsim_models::{
    check, names, Action, CheckOptions, CheckReport, ClientSpec, FaultBounds, HandoffModel,
    MemoMode, ModelSpec, Schedule,
};
use stateright::{Checker, Model, Property};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

/// A pinned unique-state count. A different count is a change detector, not a bug
/// report: the message says so, and what to do.
#[track_caller]
fn pinned(r: &CheckReport, want: usize) {
    let (model, got) = (&r.spec.name, r.unique);
    assert!(
        got == want,
        "state count changed: re-check, then re-pin. {model}: {got} unique states, pinned {want}. \
         A change to the engine or the model's environment moved it: if every property still \
         holds and the change is meant, explain it in docs/COUNTS.md \
         and update the pin in the same commit; an invariant, not this count, reports a bug \
         (symmetry reduction: {})",
        r.options.symmetry
    );
}

fn run(spec: ModelSpec) -> CheckReport {
    check(spec, &CheckOptions::default()).expect("standard specs are valid")
}

/// The model exhausts its space, every `always` holds, every expected path is reached.
fn assert_clean(r: &CheckReport) {
    assert!(r.complete, "not exhaustive");
    assert!(!r.violated(), "{}", r.render());
    for p in &r.properties {
        assert_ne!(p.verdict, Verdict::NotReached, "{} not reached", p.name);
    }
}

/// A moved count reads as a change to re-check, not as a bug report.
#[test]
#[should_panic(
    expected = "state count changed: re-check, then re-pin. crash-race-small: 2277 unique states, pinned 2278"
)]
fn a_moved_count_says_re_check_then_re_pin() {
    pinned(&run(ModelSpec::crash_race_small()), 2_278);
}

#[test]
fn handoff_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::handoff_small());
    assert_clean(&r);
    pinned(&r, 25_026);
    // The shortest over-length rejection: the router learns prefill's 400 at once.
    assert_eq!(
        r.status(names::REJECTED),
        Some(Verdict::Reached { steps: 3 })
    );
    assert_eq!(
        r.status(names::LATE_ACK),
        Some(Verdict::Reached { steps: 10 })
    );
}

#[test]
fn abort_race_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::abort_race_small());
    assert_clean(&r);
    pinned(&r, 22_400);
    assert_eq!(
        r.status(names::ABORT_RACE),
        Some(Verdict::Reached { steps: 8 })
    );
}

#[test]
fn crash_race_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::crash_race_small());
    assert_clean(&r);
    pinned(&r, 2_277);
    // The shortest busy crash: submit, the router's start reaches prefill, crash.
    assert_eq!(r.status(names::CRASH), Some(Verdict::Reached { steps: 3 }));
}

/// Decode crashes while a KV write is on its way to it. The model and the
/// simulator's replay must agree on what is in flight afterwards (the write fails back
/// to prefill; nothing else addressed to decode survives), the run must drain with the
/// client answered and every pool full, and neither side may find a violation.
#[test]
fn decode_crash_mid_transfer_drains_and_replays_through_the_simulator() {
    let spec = ModelSpec::crash_race_small();
    let model = HandoffModel::new(spec.clone()).unwrap();
    let mut s = model.initial();
    let mut path = Vec::new();
    let mut crashed = false;
    for _ in 0..200 {
        let mut enabled = Vec::new();
        model.actions(&s, &mut enabled);
        let write_in_flight = s
            .net
            .iter()
            .any(|e| matches!(e.get().msg, Carried::Write(_)));
        let action = if !crashed && write_in_flight {
            crashed = true;
            assert!(enabled.contains(&Action::Crash(DECODE)));
            Action::Crash(DECODE)
        } else {
            match enabled.into_iter().find(|a| !matches!(a, Action::Crash(_))) {
                Some(a) => a,
                None => break,
            }
        };
        let next = model.step(&s, &action, None);
        path.push((s, action));
        s = next;
    }
    assert!(crashed, "no KV write was ever in flight");
    assert!(model.is_quiescent(&s), "the run did not drain");
    assert_eq!(model.quiescence_problem(&s), None);
    assert!(s.clients()[0].reply.is_some());
    assert_eq!(s.book.get().violations, 0);
    let schedule = Schedule::from_path(&model, &path);
    assert!(schedule.0.contains(&Step::Crash { node: DECODE }));
    let out = replay(&spec, &schedule).expect("every step replays");
    assert!(out.broken.is_empty(), "{:?}", out.findings);
    assert!(out.quiescent, "the replay did not drain");
}

/// The incident bug pair: S5, S4 and S3 are broken, the S3 counterexample is the
/// kept schedule (at most 25 steps), and every counterexample replays through the
/// simulator's nodes and oracle to the same invariant.
#[test]
fn incident_bugs_break_s5_s4_s3_and_every_counterexample_replays() {
    let spec = ModelSpec::handoff_small().with_bugs(BugSet::INCIDENT);
    let r = run(spec.clone());
    assert!(r.violated());
    assert_eq!(r.status(names::S5), Some(Verdict::Violated { steps: 2 }));
    assert_eq!(r.status(names::S4), Some(Verdict::Violated { steps: 9 }));
    assert_eq!(r.status(names::S3), Some(Verdict::Violated { steps: 10 }));
    for c in &r.counterexamples {
        assert!(
            c.steps.len() <= 25,
            "{} takes {} steps",
            c.property,
            c.steps.len()
        );
        let inv = invariant_of(c.property).expect("safety properties name an invariant");
        let replayed = c.replay.as_ref().expect("the schedule replays");
        assert!(
            replayed.broken.contains(&inv),
            "{}: the simulator's oracle found {:?}",
            c.property,
            replayed.broken
        );
    }
    let kept = include_str!("data/incident-handoff-small.schedule");
    let kept = Schedule::parse(kept).unwrap();
    assert_eq!(r.counterexample(names::S3).unwrap().schedule, kept);
}

/// The kept incident counterexample, replayed through the simulator's nodes and
/// oracle on its own: the regression test the issue asks for.
#[test]
fn kept_incident_counterexample_replays_through_the_simulator() {
    let spec = ModelSpec::handoff_small().with_bugs(BugSet::INCIDENT);
    let schedule = Schedule::parse(include_str!("data/incident-handoff-small.schedule")).unwrap();
    let out = replay(&spec, &schedule).unwrap();
    assert_eq!(
        out.broken,
        vec![Invariant::S5, Invariant::S4, Invariant::S3]
    );
    // On the defended engine the same first steps are refused: prefill rejects the
    // prompt outright, so the schedule cannot even go on (no page list is used).
    let defended = replay(&ModelSpec::handoff_small(), &schedule);
    assert!(defended.is_err() || defended.unwrap().broken.is_empty());
}

/// The transition cache changes nothing: with every reused transition recomputed and
/// compared (`Verify` panics on a difference), and with no cache at all, the reduced
/// models reach the same states and the same verdicts, on the default engine and
/// under the incident's bug pair.
#[test]
fn transition_cache_changes_no_state_and_no_verdict() {
    for spec in [
        ModelSpec::handoff_small(),
        ModelSpec::abort_race_small(),
        ModelSpec::crash_race_small(),
        ModelSpec::handoff_small().with_bugs(BugSet::INCIDENT),
        // The new environment steps, on small variants: altered writes (and a
        // defense's stop, with and without verification), a spent timer delivered
        // again around a crash and two duplicates.
        small_data_fault(),
        {
            let mut spec = small_data_fault();
            spec.engine.defenses.verify_on_completion = false;
            spec
        },
        // A kept copy landing again as a stale duplicate, where it lands (tags off).
        {
            let mut spec = small_data_fault();
            spec.faults.data_fault_kind = Some(DataFault::StaleDuplicate);
            spec.engine.defenses.page_tags = false;
            spec
        },
        ModelSpec {
            faults: FaultBounds {
                crashes: 1,
                duplicates: 2,
                timer_refires: 1,
                ..FaultBounds::default()
            },
            ..ModelSpec::crash_race_small()
        },
    ] {
        let with = |memo| {
            check(
                spec.clone(),
                &CheckOptions {
                    memo,
                    ..CheckOptions::default()
                },
            )
            .expect("standard specs are valid")
        };
        let (on, off, verified) = (
            with(MemoMode::On),
            with(MemoMode::Off),
            with(MemoMode::Verify),
        );
        for other in [&off, &verified] {
            assert_eq!(other.unique, on.unique, "{}", spec.name);
            assert_eq!(other.generated, on.generated, "{}", spec.name);
            let verdicts = |r: &CheckReport| {
                r.properties
                    .iter()
                    .map(|p| (p.name, p.verdict))
                    .collect::<Vec<_>>()
            };
            assert_eq!(verdicts(other), verdicts(&on), "{}", spec.name);
        }
    }
}

/// Every defense off (the incident's configuration without its bug switches).
fn undefended(mut spec: ModelSpec) -> ModelSpec {
    spec.engine.defenses = Defenses::none();
    spec
}

/// Each counterexample of an `always` property replays through the simulator's
/// nodes and oracle to the same invariant; returns the invariants broken.
#[track_caller]
fn counterexamples_replay(r: &CheckReport) -> Vec<Invariant> {
    let mut broken = Vec::new();
    for c in &r.counterexamples {
        let replayed = c.replay.as_ref().expect("every counterexample replays");
        let found = match invariant_of(c.property) {
            Some(i) => {
                broken.push(i);
                replayed.broken.contains(&i)
            }
            // The simulator's oracle has no fault book: the replay must run, and
            // answer a client with an error.
            None if c.property == names::CAUSED => replayed_an_error(replayed),
            None => replayed.broken.iter().any(|i| {
                matches!(
                    i,
                    Invariant::L1 | Invariant::L2 | Invariant::L3 | Invariant::L4
                )
            }),
        };
        assert!(
            found,
            "{}: {} replays to {:?}",
            r.spec.name, c.property, replayed.broken
        );
    }
    broken
}

/// The replay answered some client with an error (its log has the router's answer).
fn replayed_an_error(replayed: &kvsim_models::replay::ReplayOutcome) -> bool {
    replayed
        .log
        .iter()
        .any(|l| l.contains("client gets ") && !l.contains("client gets 200"))
}

/// `abort-after-success` (the router aborts the other half after a half succeeded):
/// no safety invariant notices (an abort is always safe) and a request still
/// completes on some path, but "an error answer has a cause" fails on a fault-free
/// path with no cancel, and the counterexample replays through the simulator to an
/// error answer. Without the switch the same model holds the property.
#[test]
fn abort_after_success_fails_an_error_answer_has_a_cause_and_replays() {
    let spec = ModelSpec::handoff_small().with_bugs(BugSet::parse("abort-after-success").unwrap());
    let r = run(spec);
    for p in &r.properties {
        if p.name != names::CAUSED && invariant_of(p.name).is_some() {
            assert_eq!(p.verdict, Verdict::Holds, "{}: {}", p.name, r.render());
        }
    }
    assert!(
        matches!(r.status(names::CAUSED), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
    let c = r.counterexample(names::CAUSED).unwrap();
    assert!(
        c.schedule.0.iter().all(|s| matches!(
            s,
            Step::Submit { .. }
                | Step::Fire { .. }
                | Step::Message {
                    how: MessageStep::Deliver,
                    ..
                }
        )),
        "a fault or a cancel in the counterexample:\n{}",
        c.schedule
    );
    let replayed = c.replay.as_ref().expect("the counterexample replays");
    assert!(replayed_an_error(replayed), "{}", replayed.log.join("\n"));
    assert!(
        replayed.broken.is_empty(),
        "safe: the simulator's oracle finds nothing, {:?}",
        replayed.broken
    );
    assert!(
        r.render().contains("nothing explains the "),
        "{}",
        r.render()
    );
    let defended = run(ModelSpec::handoff_small());
    assert_eq!(defended.status(names::CAUSED), Some(Verdict::Holds));
}

/// The data-fault model on the defended engine: every altered write is stopped by
/// a defense (the model reaches such a stop) and nothing is violated.
#[test]
fn data_fault_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::data_fault_small());
    assert_clean(&r);
    pinned(&r, DATA_FAULT_SMALL);
}

const DATA_FAULT_SMALL: usize = 1_229_696;

/// Every kind of data fault the world defines is a step of the model: on the first
/// KV write in flight, each kind is enabled (the stale duplicate as keeping a copy,
/// see `a_kept_copy_lands_later_as_a_stale_duplicate_and_is_refused_on_a_ready_page`),
/// and taking an alteration records the fault (the oracle's trace record) and lands
/// an altered write.
#[test]
fn every_data_fault_kind_is_a_model_step() {
    let spec = ModelSpec::data_fault_small();
    let model = HandoffModel::new(spec.clone()).unwrap();
    let mut s = model.initial();
    let mut path = Vec::new();
    for _ in 0..100 {
        let mut enabled = Vec::new();
        model.actions(&s, &mut enabled);
        let kinds: Vec<DataFault> = enabled
            .iter()
            .filter_map(|a| match a {
                Action::Alter(_, f) => Some(*f),
                _ => None,
            })
            .collect();
        if !kinds.is_empty() {
            // Every kind the world can apply to this write is a branch (corrupt,
            // misdirect and torn apply to any write of a page into a pool of 2 or more).
            let write = s
                .net
                .iter()
                .find(|e| matches!(e.get().msg, Carried::Write(_)))
                .unwrap();
            let applicable: Vec<DataFault> = DataFault::ALL
                .into_iter()
                .filter(|f| altered(&spec, write.get().to, &write.get().msg, *f).is_some())
                .collect();
            assert_eq!(kinds, applicable, "every applicable kind is enabled");
            assert!(kinds.len() >= 3, "{kinds:?}");
            // The stale duplicate, a second landing rather than a change to the write,
            // is its own step on the same write: deliver it and keep a copy.
            assert!(
                enabled.contains(&Action::KeepStale(write.clone())),
                "{enabled:?}"
            );
            for a in enabled.iter().filter(|a| matches!(a, Action::Alter(..))) {
                let (next, log) = model.explain(&s, a);
                assert_eq!(next.faults().data_faults, 1);
                assert!(
                    log.events.iter().any(|e| e.contains("lands")),
                    "{:?}",
                    log.events
                );
                let mut p = path.clone();
                p.push((s.clone(), a.clone()));
                let schedule = Schedule::from_path(&model, &p);
                let text = schedule.to_string();
                assert!(text.contains("deliver-"), "{text}");
                assert_eq!(Schedule::parse(&text).unwrap(), schedule);
                replay(&spec, &schedule).expect("the altered delivery replays");
            }
            return;
        }
        let a = enabled
            .into_iter()
            .find(|a| !matches!(a, Action::Alter(..)))
            .expect("the run goes on until a write is in flight");
        let next = model.step(&s, &a, None);
        path.push((s, a));
        s = next;
    }
    panic!("no KV write was ever in flight");
}

/// With verification off, a corrupted page reaches a client as a 200 with a wrong
/// token (S10) and a misdirected page leaves one never written under an accepted
/// transfer (S4); both counterexamples hold an altered delivery and replay through
/// the simulator (which alters the write the same way) to the same invariant.
#[test]
fn data_faults_without_verification_break_s10_and_s4_and_replay() {
    let mut spec = ModelSpec::data_fault_small();
    spec.engine.defenses.verify_on_completion = false;
    let r = run(spec);
    let broken = counterexamples_replay(&r);
    assert!(broken.contains(&Invariant::S10), "{}", r.render());
    assert!(broken.contains(&Invariant::S4), "{}", r.render());
    for inv in [names::S10, names::S4] {
        let c = r.counterexample(inv).unwrap();
        assert!(
            c.schedule.0.iter().any(|s| matches!(
                s,
                Step::Message {
                    how: MessageStep::Alter(_),
                    ..
                }
            )),
            "{inv}: {}",
            c.schedule
        );
    }
}

/// With the page tags off (verification on), a misdirected page lands in the other
/// request's page, which that request may already have verified and be reading: a
/// write after free (S2), a read of another request's KV (S3) and a wrong token in a
/// 200 (S10). Verification alone does not stop a misdirect, as in the simulator.
#[test]
fn data_faults_without_page_tags_break_s2_s3_s10_and_replay() {
    let mut spec = ModelSpec::data_fault_small();
    spec.engine.defenses.page_tags = false;
    let r = run(spec);
    let broken = counterexamples_replay(&r);
    for inv in [Invariant::S2, Invariant::S3, Invariant::S10] {
        assert!(broken.contains(&inv), "{inv}: {}", r.render());
    }
}

/// The timer-refire model on the defended engine: a spent timer is delivered again
/// (and one or more timeouts are premature) and nothing is violated.
#[test]
fn timer_refire_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::timer_refire_small());
    assert_clean(&r);
    pinned(&r, TIMER_REFIRE_SMALL);
}

const TIMER_REFIRE_SMALL: usize = 449_609;

/// A state of [`RefireProbe`]: the model's own state, and whether some transition so
/// far delivered a spent `DrainRetry` again and that moved decode (its quarantine's
/// retry count, or its stop).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Probed {
    s: State,
    stale_retry_counted: bool,
}

/// The handoff model with one more `always` property, one it cannot state itself (it
/// is about a transition, not a state): a spent drain-retry timer delivered again uses
/// up no retry, so decode stops loudly only after its budget of real retries. It counts
/// the transitions that deliver a spent `DrainRetry` again, so that a run where none
/// happen cannot pass for one where all were harmless.
struct RefireProbe {
    model: HandoffModel,
    refired: AtomicUsize,
}

const STALE_RETRY: &str = "a spent drain retry delivered again counts as no retry";

/// Decode's view of `room`: its phase (with the retry count) and whether it stopped.
fn drain_view(s: &State, room: RoomKey) -> (Option<DecodePhase>, bool) {
    let d = s.decodes[0].get();
    (d.room_phase(room), d.fatal().is_some())
}

impl Model for RefireProbe {
    type State = Probed;
    type Action = Action;

    fn init_states(&self) -> Vec<Probed> {
        self.model
            .init_states()
            .into_iter()
            .map(|s| Probed {
                s,
                stale_retry_counted: false,
            })
            .collect()
    }

    fn actions(&self, p: &Probed, out: &mut Vec<Action>) {
        self.model.actions(&p.s, out);
    }

    fn next_state(&self, p: &Probed, action: Action) -> Option<Probed> {
        let next = self.model.step(&p.s, &action, None);
        let counted = match action {
            Action::Refire(DECODE, Timer::DrainRetry(room, _)) => {
                self.refired.fetch_add(1, AtomicOrdering::Relaxed);
                drain_view(&p.s, room) != drain_view(&next, room)
            }
            _ => false,
        };
        Some(Probed {
            s: next,
            stale_retry_counted: p.stale_retry_counted || counted,
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(STALE_RETRY, |_, p: &Probed| {
            !p.stale_retry_counted
        })]
    }
}

/// The drain-retry finding, kept: a `DrainRetry` timer that already fired (or was
/// cancelled), delivered again while the real retry timer is pending or after the
/// quarantine ended, never moves decode's retry count or stops it. Before decode told
/// its timer's armings apart, such a delivery counted as a retry and could stop decode
/// loudly (`DrainAckMissing`) before its budget of real retries was spent.
#[test]
fn a_refired_drain_retry_never_uses_up_decodes_retry_budget() {
    let probe = RefireProbe {
        model: HandoffModel::new(refire_probe_spec()).unwrap(),
        refired: AtomicUsize::new(0),
    };
    let c = probe.checker().spawn_bfs().join();
    assert!(c.is_done());
    if let Some(path) = c.discovery(STALE_RETRY) {
        let steps: Vec<String> = path.into_actions().iter().map(|a| a.to_string()).collect();
        panic!("{STALE_RETRY}: broken by {}", steps.join("; "));
    }
    let refired = c.model().refired.load(AtomicOrdering::Relaxed);
    assert!(refired > 0, "no spent DrainRetry was delivered again");
    eprintln!(
        "{}: {} unique states, {refired} transitions deliver a spent DrainRetry again",
        c.model().model.name(),
        c.unique_state_count()
    );
}

/// The spec the probe walks: `timer-refire-small` with its first request only (8,710
/// states, a fraction of a second). Its failed KV write is what matters: on the engine
/// that counted every `DrainRetry` input, the probe breaks here at once (failed write,
/// drain, the real retry, the spent one again), and without the failed write it does
/// not.
fn refire_probe_spec() -> ModelSpec {
    let mut spec = ModelSpec::timer_refire_small();
    spec.clients.truncate(1);
    spec
}

/// `handoff-small` with every defense off and a second lost control message: the
/// first request's page list can be lost, so its decode waits for the transfer until
/// the router's abort (since prefill tells decode of a room it failed, issue 37 class
/// 6, nothing else leaves decode waiting in this model).
fn undefended_two_losses() -> ModelSpec {
    let mut spec = undefended(ModelSpec::handoff_small());
    spec.faults.losses = 2;
    spec
}

/// A refired timer is an action that matters: with every defense off,
/// [`undefended_two_losses`] finds S2 only when one spent timer may fire again (the
/// first request's page list lost, the router's request timeout, delivered a second
/// time, sends again an abort the network lost, and decode frees pages a KV write is
/// still headed for). The counterexample has a `refire` step and replays through the
/// simulator to S2.
#[test]
fn a_refired_timer_can_break_an_undefended_engine_and_replays() {
    let without = run(undefended_two_losses());
    assert!(
        !counterexamples_replay(&without).contains(&Invariant::S2),
        "{}",
        without.render()
    );
    let mut spec = undefended_two_losses();
    spec.faults.timer_refires = 1;
    let with = run(spec);
    assert!(
        counterexamples_replay(&with).contains(&Invariant::S2),
        "{}",
        with.render()
    );
    let c = with.counterexample(names::S2).unwrap();
    assert!(
        c.schedule
            .0
            .iter()
            .any(|s| matches!(s, Step::Refire { .. })),
        "{}",
        c.schedule
    );
}

/// The real router's policy (`sglang-router`) on the defended engine: a request retried
/// in a new room while the attempt the router gave up still has a half working, and a
/// client that may disconnect at any step. Every property holds.
#[test]
fn retry_race_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::retry_race_small());
    assert_clean(&r);
    pinned(&r, RETRY_RACE_SMALL);
    assert!(matches!(
        r.status(names::RETRIED_LIVE),
        Some(Verdict::Reached { .. })
    ));
}

const RETRY_RACE_SMALL: usize = 72_853;

/// `retry-race` with a duplicated control message and the prompt in two writes.
/// `cargo test --release -p kvsim-models --test standard_models retry_race_full -- --ignored`
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn retry_race_full_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::retry_race());
    assert_clean(&r);
    pinned(&r, RETRY_RACE);
}

const RETRY_RACE: usize = 595_891;

/// The stale-control model (a reused room number, two duplicated control messages)
/// on the defended engine.
#[test]
fn stale_control_small_is_clean_with_a_pinned_state_count() {
    let r = run(ModelSpec::stale_control_small());
    assert_clean(&r);
    pinned(&r, STALE_CONTROL_SMALL);
}

const STALE_CONTROL_SMALL: usize = 213_237;

/// `ack-ignores-generation` on the stale-control model: a drain ack of the room
/// number's first use, delivered again, releases the second use's quarantine (S9);
/// the counterexample replays through the simulator.
#[test]
fn stale_control_small_finds_ack_ignores_generation_and_replays() {
    let spec = ModelSpec::stale_control_small()
        .with_bugs(BugSet::parse("ack-ignores-generation").unwrap());
    let r = run(spec);
    assert!(
        counterexamples_replay(&r).contains(&Invariant::S9),
        "{}",
        r.render()
    );
}

/// `data-fault-small` with two requests that never disconnect, one at a time on a
/// decode pool of 2 pages (a few thousand states: for the cache's verification).
fn small_data_fault() -> ModelSpec {
    ModelSpec {
        clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(2, 3)],
        decode_pages: 2,
        reaches: vec![names::COMPLETES, names::ALTERED, names::STOPPED],
        ..ModelSpec::data_fault_small()
    }
}

/// Symmetry over interchangeable clients, on a model with two identical requests:
/// the depth-first search with the representative visits fewer states and finds the
/// same verdicts.
#[test]
fn symmetry_reduces_interchangeable_requests() {
    let spec = ModelSpec {
        name: "two-identical".into(),
        clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(1, 3)],
        faults: Default::default(),
        reaches: vec![names::COMPLETES],
        ..ModelSpec::handoff()
    };
    let plain = run(spec.clone());
    let reduced = check(
        spec,
        &CheckOptions {
            symmetry: true,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&plain);
    assert_clean(&reduced);
    assert_eq!((plain.unique, reduced.unique), (921, 461));
}

#[test]
fn a_bug_switch_is_found_by_its_first_invariant() {
    // decode-release-immediate: an aborted request's pages are freed while its write
    // is in flight; the write lands in pages that left the room.
    // On one-sided (the default) nothing checks the write as it lands; the root, a
    // page released under a write still in flight, is S9. On two-sided the landing gate
    // refuses the write (S2 detected), and S9 is still the root.
    let spec =
        ModelSpec::abort_race_small().with_bugs(BugSet::parse("decode-release-immediate").unwrap());
    let r = run(spec);
    assert!(
        matches!(r.status(names::S9), Some(Verdict::Violated { .. })),
        "{}",
        r.render()
    );
    let c = r.counterexample(names::S9).unwrap();
    assert!(c.replay.as_ref().unwrap().broken.contains(&Invariant::S9));
}

/// The full `handoff` model (about 10 s in release on 2 cores; 1.28 million states).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn handoff_full_is_clean_with_a_pinned_state_count() {
    let options = CheckOptions {
        threads: 2,
        ..CheckOptions::default()
    };
    let r = check(ModelSpec::handoff(), &options).unwrap();
    assert_clean(&r);
    pinned(&r, 2_409_128);
    let reduced = check(
        ModelSpec::handoff(),
        &CheckOptions {
            symmetry: true,
            ..options
        },
    )
    .unwrap();
    assert_clean(&reduced);
    pinned(&reduced, 1_204_667);
    let buggy = check(ModelSpec::handoff().with_bugs(BugSet::INCIDENT), &options).unwrap();
    let s3 = buggy
        .counterexample(names::S3)
        .expect("the incident is found");
    assert!(s3.steps.len() <= 25);
}

/// The full `abort-race` model (about 15 s in release on 2 cores; 1,252,151 states).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn abort_race_full_is_clean_with_a_pinned_state_count() {
    let r = check(
        ModelSpec::abort_race(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&r);
    pinned(&r, 882_055);
}

/// The full `timeout-race` model (a few seconds in release; 397,593 states, half of
/// them with symmetry: its two requests are interchangeable).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn timeout_race_full_is_clean_with_a_pinned_state_count() {
    let options = CheckOptions {
        threads: 2,
        ..CheckOptions::default()
    };
    let r = check(ModelSpec::timeout_race(), &options).unwrap();
    assert_clean(&r);
    pinned(&r, 315_107);
    let reduced = check(
        ModelSpec::timeout_race(),
        &CheckOptions {
            symmetry: true,
            ..options
        },
    )
    .unwrap();
    assert_clean(&reduced);
    pinned(&reduced, 157_554);
}

#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn crash_race_full_is_clean_with_a_pinned_state_count() {
    let r = check(
        ModelSpec::crash_race(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&r);
    pinned(&r, 3_535_082);
}

/// The full `data-fault` model (two data faults; 5,521,665 states).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn data_fault_full_is_clean_with_a_pinned_state_count() {
    let r = check(
        ModelSpec::data_fault(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&r);
    pinned(&r, 8_228_049);
}

/// The full `timer-refire` model (two premature timeouts, a failed write and one
/// refire; 9,723,629 states).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn timer_refire_full_is_clean_with_a_pinned_state_count() {
    let r = check(
        ModelSpec::timer_refire(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&r);
    pinned(&r, 9_974_103);
}

/// The full `stale-control` model (a reused room number, two duplicates, one failed
/// write; 562,508 states).
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn stale_control_full_is_clean_with_a_pinned_state_count() {
    let r = check(
        ModelSpec::stale_control(),
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    assert_clean(&r);
    pinned(&r, 508_433);
}

/// Each bug switch that the standard models can reach is found by the invariant it
/// breaks first, and every counterexample replays through the simulator's oracle to
/// the same invariant. (`no-length-agreement` needs a length mismatch, which only
/// its incident partner creates; `router-cancels-one-half` is healed by decode's own
/// waiting timeout within these bounds; `skip-preflight` is a configuration check;
/// `abort-after-success` breaks no invariant, see
/// `abort_after_success_fails_an_error_answer_has_a_cause_and_replays`.)
#[test]
#[ignore = "full bounds: cargo test --release -p kvsim-models -- --ignored"]
fn every_reachable_bug_switch_is_found_and_replays() {
    let expect: [(&str, &str, Invariant); 12] = [
        ("gate-checks-finished-only", "handoff-small", Invariant::S5),
        ("gate-checks-finished-only", "timeout-race", Invariant::S9),
        ("success-overwrites-abort", "timeout-race", Invariant::S6),
        // A page released under a write still in flight: S9 at its root. On one-sided
        // the late write lands unchecked and is judged by its effect (S2 when read):
        // within these bounds nothing reads it.
        ("decode-release-immediate", "timeout-race", Invariant::S9),
        (
            "prefill-release-before-drain",
            "timeout-race",
            Invariant::S2,
        ),
        ("failed-send-reports-drained", "timeout-race", Invariant::S9),
        ("double-free-on-finish", "timeout-race", Invariant::S8),
        // Nothing flags the over-length request: admitted beyond the pool.
        ("admit-beyond-pool", "handoff-small", Invariant::L5),
        // A duplicated drain request lets an old generation's ack free the new one.
        ("ack-ignores-generation", "abort-race", Invariant::S9),
        ("fail-open-on-recv-error", "timeout-race", Invariant::S3),
        // A prefill crash, decode's waiting timeout, then the same late ack (the
        // counterexample has a `crash n1` step, so it also checks crash replay).
        ("ack-ignores-generation", "crash-race", Invariant::S9),
        // Only a prefix hit off the chunk grid skews a chunk (models/tests/prefix_hit.rs).
        ("chunk-index-by-position", "prefix-hit", Invariant::S4),
    ];
    for (bug, model, inv) in expect {
        let spec = ModelSpec::standard(model)
            .unwrap()
            .with_bugs(BugSet::parse(bug).unwrap());
        let r = check(
            spec,
            &CheckOptions {
                threads: 2,
                ..CheckOptions::default()
            },
        )
        .unwrap();
        let broken: Vec<_> = r
            .counterexamples
            .iter()
            .filter_map(|c| invariant_of(c.property))
            .collect();
        assert!(broken.contains(&inv), "{bug} on {model}: {broken:?}");
        for c in &r.counterexamples {
            let replayed = c.replay.as_ref().expect("every counterexample replays");
            let found = match invariant_of(c.property) {
                Some(i) => replayed.broken.contains(&i),
                // A bug switch may also answer a request with an unexplained error.
                None if c.property == names::CAUSED => replayed_an_error(replayed),
                // The quiescence property stands for L1 to L4.
                None => replayed.broken.iter().any(|i| {
                    matches!(
                        i,
                        Invariant::L1 | Invariant::L2 | Invariant::L3 | Invariant::L4
                    )
                }),
            };
            assert!(
                found,
                "{bug} on {model}: {} replays to {:?}",
                c.property, replayed.broken
            );
        }
    }
}

/// `data-fault-small` with stale duplicates only: a KV write lands and a copy of it
/// stays in the network, to land again at any later point.
fn stale_duplicate_small() -> ModelSpec {
    let mut spec = ModelSpec::data_fault_small();
    spec.faults.data_fault_kind = Some(DataFault::StaleDuplicate);
    spec
}

/// Stale duplicates alone, on the defended engine and on the defended engine without
/// verification: clean, and a defense stops one. On one-sided (the default) the copy
/// lands unchecked and carries its room use's tag, so the read-time tag check refuses
/// any read of it once that use is over (a copy of the use's own write rewrites its own
/// prompt slots with the same bytes); the page tags do it alone, as in the simulator.
/// With verification on, a copy landing before decode's checksum is refused there
/// instead, which is why the two counts differ (on two-sided the landing gate refused
/// every such copy first, and they were equal).
#[test]
fn stale_duplicates_are_stopped_by_the_tags_with_a_pinned_state_count() {
    let r = run(stale_duplicate_small());
    assert_clean(&r);
    pinned(&r, STALE_DUPLICATE_SMALL);
    let mut spec = stale_duplicate_small();
    spec.engine.defenses.verify_on_completion = false;
    let r = run(spec);
    assert_clean(&r);
    pinned(&r, STALE_DUPLICATE_SMALL_NO_VERIFY);
}

const STALE_DUPLICATE_SMALL_NO_VERIFY: usize = 381_549;

const STALE_DUPLICATE_SMALL: usize = 391_173;

/// With the page tags off, a stale duplicate lands in a page its room use no longer
/// owns (S2), another request reads it (S3) and answers 200 with a wrong token (S10):
/// what the simulator finds without the tags. Each counterexample keeps a copy and
/// lands it, and replays through the simulator's nodes and oracle to its invariant.
#[test]
fn stale_duplicates_without_page_tags_break_s2_s3_s10_and_replay() {
    let mut spec = stale_duplicate_small();
    spec.engine.defenses.page_tags = false;
    let r = run(spec);
    let broken = counterexamples_replay(&r);
    for inv in [Invariant::S2, Invariant::S3, Invariant::S10] {
        assert!(broken.contains(&inv), "{inv}: {}", r.render());
    }
    for c in &r.counterexamples {
        let has = |how: MessageStep| {
            c.schedule
                .0
                .iter()
                .any(|s| matches!(s, Step::Message { how: h, .. } if *h == how))
        };
        assert!(
            has(MessageStep::KeepCopy) && has(MessageStep::Alter(DataFault::StaleDuplicate)),
            "{}: {}",
            c.property,
            c.schedule
        );
    }
}

/// The stale duplicate as a model step: a KV write delivered with a copy kept (the
/// copy counts against the data-fault budget), then, once decode accepted the
/// transfer and the page is `Ready`, the copy lands again. The landing is announced
/// with the simulator's `data_fault` record; on two-sided the landing gate refuses it (a
/// `Ready` page takes no remote write), on one-sided (the default) it lands, unchecked,
/// and changes nothing anyone reads (prefill sent the prompt's partial last page as
/// the slots it holds, so the copy rewrites those slots with the same bytes). Decode's
/// completion of it is dropped (nothing goes back to prefill), and the schedule
/// round-trips and replays to the same outcome with no violation.
#[test]
fn a_kept_copy_lands_later_as_a_stale_duplicate_on_a_ready_page_harmlessly() {
    use kvsim_engine::world::KvTransport;
    for transport in [KvTransport::OneSided, KvTransport::TwoSided] {
        let mut spec = stale_duplicate_small();
        spec.engine.transport = transport;
        kept_copy_lands_on_a_ready_page(spec, transport == KvTransport::TwoSided);
    }
}

fn kept_copy_lands_on_a_ready_page(spec: ModelSpec, gated: bool) {
    use kvsim_engine::kv::PageState;
    let outcome = if gated { "refuses" } else { "lands w1" };
    let model = HandoffModel::new(spec.clone()).unwrap();
    let mut s = model.initial();
    let mut path = Vec::new();
    let mut kept = false;
    for _ in 0..200 {
        let mut enabled = Vec::new();
        model.actions(&s, &mut enabled);
        let action = if !kept {
            match enabled.iter().find(|a| matches!(a, Action::KeepStale(_))) {
                Some(a) => {
                    kept = true;
                    a.clone()
                }
                None => enabled
                    .iter()
                    .find(|a| {
                        matches!(a, Action::Submit(_) | Action::Deliver(_) | Action::Fire(..))
                    })
                    .cloned()
                    .expect("the run goes on until a write is in flight"),
            }
        } else {
            let copy = s.stale.first().expect("the copy is kept until it lands");
            let Carried::Write(KvWrite { id, dst, .. }) = &copy.get().env.msg else {
                unreachable!()
            };
            let ready = s.decodes[0]
                .get()
                .pool()
                .record(dst[0].page)
                .is_some_and(|r| {
                    r.state == PageState::Ready && r.owner == Some(id.room) && r.gen == dst[0].gen
                });
            if ready {
                let land = Action::LandStale(copy.clone());
                assert!(enabled.contains(&land));
                let (next, log) = model.explain(&s, &land);
                let text = log.events.join("\n");
                assert!(text.contains("a stale duplicate of the KV write"), "{text}");
                assert!(text.contains(outcome), "{text}");
                assert!(
                    text.contains("completion of the stale duplicate is dropped"),
                    "{text}"
                );
                assert!(next.stale.is_empty());
                assert_eq!(next.net.len(), s.net.len(), "no completion goes back");
                assert_eq!(next.faults().data_faults, 1);
                let mut p = path.clone();
                p.push((s.clone(), land));
                let schedule = Schedule::from_path(&model, &p);
                let text = schedule.to_string();
                assert!(text.contains("deliver-keep-copy "), "{text}");
                assert!(text.contains("deliver-stale-duplicate "), "{text}");
                assert_eq!(Schedule::parse(&text).unwrap(), schedule);
                let replayed = replay(&spec, &schedule).expect("the stale landing replays");
                assert!(
                    replayed.log.iter().any(|l| l.contains(outcome)),
                    "{:?}",
                    replayed.log
                );
                assert!(
                    replayed.findings.iter().all(|f| !f.violated()),
                    "{:?}",
                    replayed.findings
                );
                return;
            }
            assert_eq!(s.faults().data_faults, 1);
            enabled
                .iter()
                .find(|a| matches!(a, Action::Deliver(_) | Action::Fire(..)))
                .cloned()
                .expect("the transfer completes")
        };
        let next = model.step(&s, &action, None);
        path.push((s, action));
        s = next;
    }
    panic!("decode never accepted the transfer with a copy kept");
}

/// With the page tags as the only defense, stale duplicates add no invariant to what
/// the same model finds with no data fault at all (S2 and S9: prefill's and decode's
/// early release, which deferred release exists to stop): the tags alone stop the
/// stale duplicate, as in the simulator. (With no defense at all, the stale duplicate
/// adds S3 and S10; measured, see docs/DETECTION.md.)
#[test]
fn the_tags_alone_stop_stale_duplicates() {
    let tags_alone = |data_faults| {
        let mut s = undefended(stale_duplicate_small());
        s.engine.defenses.page_tags = true;
        s.faults.data_faults = data_faults;
        s
    };
    let sorted = |r: &CheckReport| {
        let mut b = counterexamples_replay(r);
        b.sort();
        b
    };
    let without = run(tags_alone(0));
    let with = run(tags_alone(1));
    assert!(
        with.unique > without.unique,
        "the stale duplicate was explored"
    );
    assert_eq!(sorted(&with), sorted(&without), "{}", with.render());
    assert_eq!(sorted(&without), vec![Invariant::S2, Invariant::S9]);
}

/// `until_first` (`kvsim check --until-first`) stops at the first counterexample: it
/// visits fewer states than the exhaustive search of the same model, finds a
/// violation, and its report says it is not exhaustive.
#[test]
fn until_first_stops_at_the_first_counterexample() {
    let spec = || ModelSpec::handoff_small().with_bugs(BugSet::INCIDENT);
    let all = run(spec());
    let opts = CheckOptions {
        until_first: true,
        ..CheckOptions::default()
    };
    let first = check(spec(), &opts).unwrap();
    assert!(all.complete && all.violated());
    assert!(!first.complete && first.violated(), "{}", first.render());
    assert!(
        first.unique < all.unique,
        "{} vs {}",
        first.unique,
        all.unique
    );
    assert!(first
        .render()
        .contains("NOT exhaustive: stopped at the first counterexample"));
    // A clean model is searched to the end: nothing stops it early.
    let clean = check(ModelSpec::handoff_small(), &opts).unwrap();
    assert!(clean.complete && !clean.violated());
}
