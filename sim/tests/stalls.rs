//! Stalls and skewed clocks (`[faults] pause`, `clock_skew_permille`; `sim/src/stall.rs`):
//! a frozen node runs nothing until it wakes (its timers and the inputs that need
//! its process wait, one-sided KV writes still land), a skewed clock stretches the
//! node's own timeouts and nothing else, and the defended engine stays clean.

mod common;

use kvsim_engine::env::Timer;
use kvsim_engine::ids::NodeId;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::KvTransport;
use kvsim_oracle::schema::{Entry, FaultEvent, MsgView, Record};
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_plan, Backend, RunOutcome};

const STALLS: &str = include_str!("../../scenarios/stalls.toml");

fn stalls(transport: KvTransport) -> Scenario {
    let mut sc = Scenario::parse(STALLS, "scenarios/stalls.toml").unwrap();
    sc.engine.transport = transport;
    sc
}

fn run(sc: &Scenario, seed: u64) -> RunOutcome {
    let plan = Plan::build(sc, seed, None, &Reduction::default()).unwrap();
    run_plan(&plan, Backend::Symbolic, true)
}

/// The pause windows of a run: (node, from, until).
fn windows(trace: &[Entry]) -> Vec<(NodeId, u64, u64)> {
    trace
        .iter()
        .filter_map(|e| match &e.rec {
            Record::Fault(FaultEvent::Pause { node, until_ns }) => {
                Some((*node, e.at_ns, *until_ns))
            }
            _ => None,
        })
        .collect()
}

/// What a frozen node was handed: (timer fires, deliveries needing its process, KV
/// writes landed) strictly inside one of its pause windows.
fn inputs_while_frozen(trace: &[Entry]) -> (usize, usize, usize) {
    let w = windows(trace);
    let frozen = |n: &NodeId, at: u64| w.iter().any(|(m, a, u)| m == n && *a < at && at < *u);
    let (mut fires, mut delivered, mut landed) = (0, 0, 0);
    for e in trace {
        match &e.rec {
            Record::TimerFire { node, .. } if frozen(node, e.at_ns) => fires += 1,
            Record::Deliver { to, msg, .. } if frozen(to, e.at_ns) => match msg {
                MsgView::KvWrite { .. } => landed += 1,
                _ => delivered += 1,
            },
            _ => {}
        }
    }
    (fires, delivered, landed)
}

/// A frozen node handles no timer and no message while it is frozen; on one-sided
/// RDMA KV writes still land in its memory, on a two-sided transport they wait too.
/// Fails if the simulator dispatched a held input early, or held a one-sided write.
#[test]
fn a_frozen_node_runs_nothing_until_it_wakes() {
    let mut totals = Vec::new();
    for transport in [KvTransport::OneSided, KvTransport::TwoSided] {
        let sc = stalls(transport);
        let (mut pauses, mut landed) = (0, 0);
        for seed in 0..60 {
            let out = run(&sc, seed);
            assert!(out.clean(), "{transport:?} seed {seed}: {:?}", out.broken());
            let (fires, delivered, l) = inputs_while_frozen(&out.trace);
            assert_eq!((fires, delivered), (0, 0), "{transport:?} seed {seed}");
            pauses += windows(&out.trace).len();
            landed += l;
        }
        totals.push((pauses, landed));
    }
    let [(p1, l1), (p2, l2)] = totals[..] else {
        unreachable!()
    };
    assert!(p1 > 20 && p2 > 20, "pauses struck: {p1}, {p2}");
    assert!(
        l1 > 0,
        "no one-sided write landed in a frozen node ({p1} pauses)"
    );
    assert_eq!(l2, 0, "a two-sided write landed in a frozen node");
}

/// A paused node's peer times out while it is frozen mid-transfer, and the frozen
/// node then wakes and carries on: the race the fault exists for is reached.
#[test]
fn a_peer_times_out_while_a_node_is_frozen_mid_transfer() {
    let sc = stalls(KvTransport::OneSided);
    let mut raced = 0;
    for seed in 0..100 {
        let out = run(&sc, seed);
        let w = windows(&out.trace);
        let mut timer: Option<NodeId> = None;
        for e in &out.trace {
            match &e.rec {
                Record::TimerFire {
                    node,
                    timer: Timer::WaitingForKv(_),
                } => timer = Some(*node),
                Record::TimerFire { .. } => timer = None,
                Record::Engine(TraceEvent::TransferFailed { node, .. })
                    if timer == Some(*node)
                        && w.iter()
                            .any(|(n, a, u)| n != node && *a < e.at_ns && e.at_ns < *u) =>
                {
                    raced += 1;
                }
                _ => {}
            }
        }
    }
    assert!(
        raced > 0,
        "no decode timed out while another node was frozen"
    );
    eprintln!("decode transfer timeouts while a peer was frozen: {raced} in 100 seeds");
}

/// A skewed clock stretches the timeouts its node sets, by its own rate, and leaves
/// the compute timer (the device's work) alone.
#[test]
fn a_skewed_clock_stretches_its_nodes_timeouts_only() {
    let mut sc = stalls(KvTransport::OneSided);
    sc.swarm = None;
    sc.topology.prefill_pool_pages = vec![128];
    sc.topology.decode_pool_pages = vec![128];
    sc.overlay_faults("pause = { count = 0, max_ms = 0 }")
        .unwrap();
    sc.overlay_faults("short_timeouts_min_ms = 0").unwrap();
    let waiting = sc.engine.timeouts.waiting_ns;
    let mut checked = 0;
    for seed in 0..5 {
        let out = run(&sc, seed);
        assert!(out.clean(), "seed {seed}: {:?}", out.broken());
        let rates = &out.plan.clocks;
        assert!(!rates.0.is_empty(), "every kind is on without a swarm");
        for e in &out.trace {
            let Record::TimerSet {
                node,
                timer,
                fire_at_ns,
            } = &e.rec
            else {
                continue;
            };
            let after = fire_at_ns - e.at_ns;
            match timer {
                Timer::WaitingForKv(_) => {
                    let want = u128::from(waiting) * 1000 / u128::from(rates.rate(*node));
                    assert_eq!(u128::from(after), want, "seed {seed} {node}");
                    checked += 1;
                }
                Timer::Compute => {
                    assert_eq!(after, rates.true_ns(*node, *timer, after));
                }
                _ => {}
            }
        }
    }
    assert!(checked > 0);
}

/// `--faults` overlays: a key replaces the file's value, an unknown key or a bad
/// value is refused by name, and a failing seed's replay command repeats them.
#[test]
fn a_fault_overlay_is_checked_and_repeated_in_the_replay_command() {
    let mut sc = common::scenario("scenarios/partition.toml");
    let err = sc.overlay_faults("pauze = 3").unwrap_err().to_string();
    assert!(err.contains("pauze"), "{err}");
    let err = sc
        .overlay_faults("clock_skew_permille = 950")
        .unwrap_err()
        .to_string();
    assert!(err.contains("faults.clock_skew_permille"), "{err}");
    let err = sc.overlay_faults("pause = 3").unwrap_err().to_string();
    assert!(err.contains("pause"), "{err}");
    let mut sc = common::scenario("scenarios/partition.toml");
    sc.overlay_faults("pause = { count = 0, max_ms = 0 }")
        .unwrap();
    sc.overlay_faults("clock_skew_permille = 300").unwrap();
    assert_eq!(sc.faults.pause.count, 0);
    assert_eq!(sc.faults.partition.count, 6, "the file's other keys stay");
    let bugs = kvsim_engine::bugs::BugSet::parse("ack-ignores-generation").unwrap();
    let plan = Plan::build(&sc, 112, Some(bugs), &Reduction::default()).unwrap();
    assert!(plan.pauses.is_empty() && !plan.clocks.0.is_empty());
    let out = run_plan(&plan, Backend::Symbolic, false);
    let cmd = kvsim_sim::report::replay_command("scenarios/partition.toml", &out);
    assert!(
        cmd.ends_with(
            "--faults 'pause = { count = 0, max_ms = 0 }' --faults 'clock_skew_permille = 300'"
        ),
        "{cmd}"
    );
}
