use kvsim_models::*;
use stateright::{Checker, Model};
use std::time::Instant;
fn report<C: Checker<HandoffModel>>(c: C, t: Instant) {
    let dt = t.elapsed().as_secs_f64();
    println!(
        "generated {} unique {} depth {} {:.2}s {:.0}/s",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        dt,
        c.unique_state_count() as f64 / dt
    );
    if let Ok(name) = std::env::var("SHOW") {
        for (n, p) in c.discoveries() {
            if n.starts_with(name.as_str()) {
                let m = c.model();
                for (st, a) in p.into_vec() {
                    if let Some(a) = a {
                        let (_, log) = m.explain(&st, &a);
                        println!("{a}");
                        for e in log.events {
                            println!("    {e}");
                        }
                    }
                }
            }
        }
    }
    let mut d: Vec<_> = c
        .discoveries()
        .into_iter()
        .map(|(n, p)| (n, p.into_actions().len()))
        .collect();
    d.sort();
    for (name, n) in d {
        println!("  {name}: {n} steps");
    }
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut spec = ModelSpec::standard(&args[1]).unwrap();
    let threads: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1);
    let sym = args.get(3).is_some_and(|s| s == "sym");
    if let Some(b) = args.get(4) {
        spec = spec.with_bugs(kvsim_engine::BugSet::parse(b).unwrap());
    }
    if let Ok(f) = std::env::var("FAULTS") {
        let v: Vec<u8> = f.split(',').map(|x| x.parse().unwrap()).collect();
        spec.faults = FaultBounds {
            losses: v[0],
            duplicates: v[1],
            write_failures: v[2],
            early_timeouts: v[3],
            overtakes: v[4],
        };
    }
    if let Ok(c) = std::env::var("CLIENTS") {
        spec.clients = c
            .split(',')
            .map(|x| {
                let cancel = x.ends_with('c');
                let n: u64 = x.trim_end_matches('c').parse().unwrap();
                let mut cs = ClientSpec::normal(if n > 6 { 2 } else { 1 }, n);
                cs.may_cancel = cancel;
                cs
            })
            .collect();
    }
    if let Ok(c) = std::env::var("CHUNK") {
        spec.engine.chunk_pages = c.parse().unwrap();
    }
    let m = HandoffModel::new(spec).unwrap();
    let t = Instant::now();
    let secs: u64 = std::env::var("SECS")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or(3600);
    let mut b = m
        .checker()
        .threads(threads)
        .timeout(std::time::Duration::from_secs(secs));
    if let Ok(d) = std::env::var("DEPTH") {
        b = b.target_max_depth(d.parse().unwrap());
    }
    if let Ok(d) = std::env::var("TARGET") {
        b = b.target_state_count(d.parse().unwrap());
    }
    if sym {
        report(b.symmetry_fn(representative).spawn_dfs().join(), t)
    } else {
        report(b.spawn_bfs().join(), t)
    }
}
