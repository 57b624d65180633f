//! The defense-isolation matrix in the default test run: each defense alone stops the
//! hazards it exists to stop (and each of those hazards leaks without it), and a
//! configuration that only adds defenses never violates an invariant the weaker one
//! did not. The full table with more seeds:
//! `cargo test --release --test isolation -- --ignored --nocapture`.

use kvsim_engine::config::Defenses;
use kvsim_engine::config::Protocol;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::world::KvTransport;
use kvsim_engine::RouterPolicy;
use kvsim_lab::isolation::{self, Hazard};

/// Every transport with every router policy of SGLang's family (the matrix's nodes).
fn transports_and_routers() -> Vec<(KvTransport, RouterPolicy)> {
    isolation::TRANSPORTS
        .into_iter()
        .flat_map(|t| {
            RouterPolicy::of(Protocol::Sglang)
                .into_iter()
                .map(move |r| (t, r))
        })
        .collect()
}

/// Every expected stop holds on 10 seeds on each transport under each router policy, and is
/// load-bearing: with no defense the same hazard leaks on some of those seeds.
#[test]
fn each_defense_alone_stops_the_hazards_it_exists_to_stop() {
    let none = Defenses::none();
    for (cfg, h) in isolation::expected() {
        let d = isolation::configuration(cfg).unwrap();
        for (t, router) in transports_and_routers() {
            let alone = isolation::cell_in(t, router, cfg, d, h, 10).unwrap();
            assert_eq!(
                alone.leaked,
                0,
                "{cfg} on {} let {} leak on {} of 10 seeds under the {} router: {:?}",
                t.name(),
                h.name(),
                alone.leaked,
                router.name(),
                alone.invariants
            );
        }
        let without = isolation::cell("no defense", none, h, 10).unwrap();
        assert!(
            without.leaked > 0,
            "{}: leaks on no seed without defenses, so {cfg} proves nothing",
            h.name()
        );
    }
}

/// The matrix on 5 seeds per cell (what the default suite runs): no monotonicity breach, and the defended engine
/// leaks only where a bug switch itself breaks the reply (the legacy rejection).
#[test]
fn a_configuration_that_only_adds_defenses_never_looks_worse() {
    let m = isolation::run(5, |_| {}).unwrap();
    let breaches = m.monotonicity_breaches();
    assert!(breaches.is_empty(), "{}", m.render());
    assert_eq!(m.routers(), RouterPolicy::of(Protocol::Sglang));
    for h in isolation::hazards() {
        for (t, r) in transports_and_routers() {
            let all = m.get_in(t, r, "all defenses", h).unwrap();
            if matches!(h, Hazard::Data(_) | Hazard::SlowWriter) {
                assert!(
                    all.invariants.is_empty(),
                    "{} on {} under the {} router: {:?}",
                    h.name(),
                    t.name(),
                    r.name(),
                    all.invariants
                );
            }
        }
    }
    // The comparison can fail: a made-up stronger cell with a new invariant is a breach.
    let mut m2 = m.clone();
    let h = Hazard::Data("corrupt");
    let i = m2
        .cells
        .iter()
        .position(|c| c.config == "all defenses" && c.hazard == h)
        .unwrap();
    m2.cells[i].invariants.push(Invariant::S3);
    m2.cells[i].leaked = 1;
    assert!(!m2.monotonicity_breaches().is_empty());
    // And zero-on-free is held to every invariant: S1 appearing with it is a breach.
    let mut m3 = m.clone();
    let i = m3
        .cells
        .iter()
        .position(|c| c.config == "all + zero on free" && c.hazard == h)
        .unwrap();
    m3.cells[i].invariants.push(Invariant::S1);
    assert!(!m3.monotonicity_breaches().is_empty());
}

#[test]
#[ignore]
fn print_isolation() {
    let seeds = std::env::var("ISOLATION_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let m = isolation::run(seeds, |c| eprintln!("{c}")).unwrap();
    println!("{}", m.render());
}
