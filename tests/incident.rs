//! The GLM-5.3 incident scenario, both ways, at its real numbers. Snapshots hold the
//! whole printed run (event trace, replies, verdict), so any change in what the
//! engine does or what the oracles report shows up in review.

use kvsim::render;
use kvsim::suite::GLM53_INCIDENT;
use kvsim_engine::bugs::BugSet;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Status;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_scenario, Backend, RunOptions, RunOutcome};

const PATH: &str = "scenarios/glm53-incident.toml";

fn run(bugs: BugSet) -> RunOutcome {
    let sc = Scenario::parse(GLM53_INCIDENT, PATH).unwrap();
    run_scenario(
        &sc,
        &RunOptions {
            bugs: Some(bugs),
            trace: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn status(out: &RunOutcome, tenant: u32) -> Status {
    let r = out.requests.iter().find(|r| r.tenant.0 == tenant).unwrap();
    out.replies[&r.req][0].status
}

#[test]
fn incident_with_historical_bugs_leaks_and_is_caught() {
    let out = run(BugSet::INCIDENT);
    // Tenant 2's rejected prompt gets a 200 ...
    assert_eq!(status(&out, 2), Status::OK);
    // ... whose reply echoes tenant 1's canary tokens.
    let t2 = out.requests.iter().find(|r| r.tenant.0 == 2).unwrap().req;
    let from_t1 = out.leaks.iter().filter(|l| l.victim_of == t2).count();
    assert!(from_t1 >= 10, "only {from_t1} leaked tokens");
    // The oracles name the chain in order: rejected-but-live, length mismatch, isolation.
    let broken = out.broken();
    assert_eq!(
        &broken[..3],
        &[Invariant::S5, Invariant::S4, Invariant::S3],
        "{broken:?}"
    );
    insta::assert_snapshot!("incident_with_bugs", render::outcome(&out, PATH, true));
}

#[test]
fn incident_on_the_defended_engine_is_rejected_with_400() {
    let out = run(BugSet::NONE);
    assert_eq!(status(&out, 2), Status::BAD_REQUEST);
    assert_eq!(status(&out, 1), Status::OK);
    assert!(out.clean(), "{:?}", out.findings);
    assert!(out.leaks.is_empty());
    insta::assert_snapshot!("incident_defended", render::outcome(&out, PATH, true));
}

#[test]
fn each_incident_bug_alone_is_still_caught_or_harmless() {
    // The gate bug alone: the stub walks through, decode's length check refuses it.
    let out = run(BugSet::NONE.with(kvsim_engine::Bug::GateChecksFinishedOnly));
    assert!(out.broken().contains(&Invariant::S5));
    assert!(
        out.leaks.is_empty(),
        "verification on completion must stop the leak"
    );
    assert_ne!(status(&out, 2), Status::OK);
    // The length bug alone: nothing reaches it, because admission rejects first.
    let out = run(BugSet::NONE.with(kvsim_engine::Bug::NoLengthAgreement));
    assert!(out.clean(), "{:?}", out.findings);
}

#[test]
fn page_tags_turn_the_leak_into_a_failed_request_that_is_still_reported() {
    let mut sc = Scenario::parse(GLM53_INCIDENT, PATH).unwrap();
    sc.engine.defenses.page_tags = true;
    let out = run_scenario(
        &sc,
        &RunOptions {
            bugs: Some(BugSet::INCIDENT),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(status(&out, 2), Status::INTERNAL);
    assert!(out.leaks.is_empty());
    // The read was attempted and refused: a detection, not a leak, and told apart.
    assert!(
        out.detected().contains(&Invariant::S3),
        "the tag check caught S3; the oracle must say so: {:?}",
        out.findings
    );
    assert!(
        !out.broken().contains(&Invariant::S3),
        "nothing was read, so S3 is not violated: {:?}",
        out.findings
    );
}

#[test]
fn preflight_refuses_the_incident_config_naming_both_numbers() {
    let mut sc = Scenario::parse(GLM53_INCIDENT, PATH).unwrap();
    sc.engine.allow_unsafe_pool = false;
    let err = run_scenario(&sc, &RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("681280") && err.contains("1048576"), "{err}");
}

#[test]
fn host_backend_reproduces_the_leak_in_real_arithmetic() {
    // A scaled-down copy of the incident (same shape, pages of 16 tokens) so the f32
    // backend stays cheap; its replies must equal the symbolic backend's token for token.
    let mut sc = Scenario::parse(GLM53_INCIDENT, PATH).unwrap();
    sc.engine.page_size = 16;
    sc.engine.context_len = 4096;
    sc.engine.chunk_pages = 8;
    sc.topology.prefill_pool_pages = vec![160]; // 2,560 tokens < 4,096
    sc.topology.decode_pool_pages = vec![512];
    sc.requests[0].prompt_len = 1200;
    sc.requests[1].prompt_len = 3000;
    for bugs in [BugSet::INCIDENT, BugSet::NONE] {
        let sym = run_scenario(
            &sc,
            &RunOptions {
                bugs: Some(bugs),
                ..Default::default()
            },
        )
        .unwrap();
        let host = run_scenario(
            &sc,
            &RunOptions {
                bugs: Some(bugs),
                backend: Backend::Host,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            sym.replies, host.replies,
            "backends disagree with bugs {bugs}"
        );
        assert_eq!(sym.leaks, host.leaks);
        assert_eq!(bugs == BugSet::INCIDENT, !host.leaks.is_empty());
    }
}
