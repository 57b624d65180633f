//! KV over NIXL in the simulator (`scenarios/nixl.toml`; the `nixl` row of
//! `engine/src/transport.rs`, issue 41): a write through the page list of a restarted
//! decode's earlier incarnation lands there (on RDMA it fails back), a write to a
//! stopped decode waits for its progress thread, and the defended engine stays clean.
//! With the read-time tag check off, the stale landings NIXL allows are what reads
//! catch otherwise: the sweep then finds what one-sided never lets land.

mod common;

use kvsim_engine::ids::NodeId;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::KvTransport;
use kvsim_oracle::schema::{Entry, FaultEvent, Record};
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::reach::{ReachPath, ReachTracker};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_plan, Backend, RunOutcome};

const SEEDS: u64 = 40;

fn nixl(transport: KvTransport) -> Scenario {
    let mut sc = common::scenario("scenarios/nixl.toml");
    assert_eq!(sc.engine.transport, KvTransport::Nixl);
    sc.engine.transport = transport;
    sc
}

fn run(sc: &Scenario, seed: u64) -> RunOutcome {
    let plan = Plan::build(sc, seed, None, &Reduction::default()).unwrap();
    run_plan(&plan, Backend::Symbolic, true)
}

fn reached(trace: &[Entry], path: ReachPath) -> bool {
    let mut t = ReachTracker::default();
    for e in trace {
        t.entry(e);
    }
    t.reached().contains(path)
}

/// KV writes that landed at a node strictly inside one of its pause windows.
fn landed_while_frozen(trace: &[Entry]) -> usize {
    let windows: Vec<(NodeId, u64, u64)> = trace
        .iter()
        .filter_map(|e| match &e.rec {
            Record::Fault(FaultEvent::Pause { node, until_ns }) => {
                Some((*node, e.at_ns, *until_ns))
            }
            _ => None,
        })
        .collect();
    trace
        .iter()
        .filter(|e| match &e.rec {
            Record::Engine(TraceEvent::KvLanded { node, .. }) => windows
                .iter()
                .any(|(n, a, u)| n == node && *a < e.at_ns && e.at_ns < *u),
            _ => false,
        })
        .count()
}

/// The defended engine is clean on NIXL's faults; stale metadata lands there (and
/// never on one-sided RDMA, the same plans); no write lands in a stopped decode.
#[test]
fn the_defended_engine_is_clean_where_stale_metadata_lands() {
    let (on_nixl, on_rdma) = (nixl(KvTransport::Nixl), nixl(KvTransport::OneSided));
    let (mut stale, mut stale_rdma, mut frozen) = (0, 0, 0);
    for seed in 0..SEEDS {
        let out = run(&on_nixl, seed);
        assert!(out.clean(), "seed {seed}: {:?}", out.first());
        stale += usize::from(reached(&out.trace, ReachPath::StaleLanded));
        frozen += landed_while_frozen(&out.trace);
        let rdma = run(&on_rdma, seed);
        stale_rdma += usize::from(reached(&rdma.trace, ReachPath::StaleLanded));
    }
    assert!(stale > 0, "no stale write landed in {SEEDS} seeds");
    assert_eq!(stale_rdma, 0, "a stale write landed over one-sided RDMA");
    assert_eq!(frozen, 0, "a NIXL write landed in a stopped node");
    eprintln!("seeds with a stale landing: nixl {stale} of {SEEDS}, one-sided 0");
}

/// With the read-time tag check (4a) off, NIXL's stale landings reach a reader: the
/// sweep finds a violation on NIXL on seeds where one-sided stays clean.
#[test]
fn with_page_tags_off_a_stale_landing_is_read() {
    let off = |mut sc: Scenario| {
        sc.engine.defenses.page_tags = false;
        sc
    };
    let (on_nixl, on_rdma) = (
        off(nixl(KvTransport::Nixl)),
        off(nixl(KvTransport::OneSided)),
    );
    let mut exposed = Vec::new();
    for seed in 0..SEEDS {
        let out = run(&on_nixl, seed);
        if !out.broken().is_empty() && reached(&out.trace, ReachPath::StaleLanded) {
            let rdma = run(&on_rdma, seed);
            if rdma.broken().is_empty() {
                exposed.push((seed, out.broken()));
            }
        }
    }
    assert!(
        !exposed.is_empty(),
        "no seed of {SEEDS} breaks on NIXL with page tags off and stays clean on RDMA"
    );
    eprintln!("exposed by NIXL's stale landing (seed, broken): {exposed:?}");
}
