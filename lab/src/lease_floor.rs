//! The minimum safe lease of vLLM's pull protocol for a scenario's latencies and
//! faults (issue 36 item 4, `kvsim lease-floor`): sweep the scenario's seeds at each
//! candidate `lease_ns`, everything else as the file says, count the failing seeds,
//! and name the shortest candidate from which every longer one runs clean too.
//!
//! A lease is a timing assumption (docs/DECISIONS.md, "vLLM's protocol"): it must
//! outlast the longest stretch in which no heartbeat reaches prefill, which depends on
//! the faults the scenario draws, not only on the READ's latency. The answer is an
//! observation over the seeds swept, not a proof: the table says how many.

use crate::LabError;
use kvsim_engine::config::Protocol;
use kvsim_sim::scenario::Scenario;
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};

/// One candidate lease and what its sweep found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub lease_ns: u64,
    pub seeds_run: u64,
    pub failing_seeds: u64,
    /// The first failing seed and the invariant it broke first.
    pub first: Option<(u64, String)>,
}

/// The sweep of every candidate, shortest first, and the floor found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFloor {
    pub scenario: String,
    pub rows: Vec<LeaseRow>,
}

impl LeaseFloor {
    /// The shortest candidate lease with no failing seed from which every longer
    /// candidate has none either; `None` when the longest one still fails.
    pub fn floor_ns(&self) -> Option<u64> {
        let clean_from = self
            .rows
            .iter()
            .rposition(|r| r.failing_seeds > 0)
            .map_or(0, |i| i + 1);
        self.rows.get(clean_from).map(|r| r.lease_ns)
    }

    /// The table `kvsim lease-floor` prints.
    pub fn render(&self) -> String {
        let mut s = format!("lease floor of {}\n", self.scenario);
        s.push_str("  lease      failing seeds   first failure\n");
        for r in &self.rows {
            let first = r.first.as_ref().map_or_else(
                || "-".to_string(),
                |(seed, inv)| format!("seed {seed}: {inv}"),
            );
            s.push_str(&format!(
                "  {:>7} ms {:>5} of {:<6} {first}\n",
                r.lease_ns / 1_000_000,
                r.failing_seeds,
                r.seeds_run
            ));
        }
        match self.floor_ns() {
            Some(ns) => s.push_str(&format!(
                "minimum safe lease: {} ms (no failing seed at it or any longer candidate)\n",
                ns / 1_000_000
            )),
            None => s.push_str("minimum safe lease: none of the candidates runs clean\n"),
        }
        s
    }
}

/// Why a lease search cannot run on a scenario.
#[derive(Debug, thiserror::Error)]
pub enum LeaseFloorError {
    #[error("{0}: routers {1}: a lease is vLLM's (its routers must all be vllm-router)")]
    NotVllm(String, String),
    #[error("leases: give at least one candidate, each above 0 ms")]
    NoCandidates,
    #[error(transparent)]
    Lab(#[from] LabError),
}

/// Sweep seeds `0..seeds` of `sc` (the defended engine) at each of `leases_ns`, in
/// increasing order, with `jobs` threads (`None`: one per core).
pub fn lease_floor(
    sc: &Scenario,
    path: &str,
    leases_ns: &[u64],
    seeds: u64,
    jobs: Option<usize>,
) -> Result<LeaseFloor, LeaseFloorError> {
    if sc.routers.is_empty() || sc.routers.iter().any(|r| r.protocol() != Protocol::Vllm) {
        let names: Vec<&str> = sc.routers.iter().map(|r| r.name()).collect();
        return Err(LeaseFloorError::NotVllm(path.to_string(), names.join(", ")));
    }
    let mut leases: Vec<u64> = leases_ns.iter().copied().filter(|&l| l > 0).collect();
    if leases.is_empty() {
        return Err(LeaseFloorError::NoCandidates);
    }
    leases.sort_unstable();
    leases.dedup();
    let opts = SweepOptions {
        seeds: SeedRange {
            start: 0,
            end: seeds,
        },
        jobs,
        keep_failures: 1,
        ..SweepOptions::default()
    };
    let mut rows = Vec::with_capacity(leases.len());
    for lease_ns in leases {
        let mut at = sc.clone();
        at.engine.timeouts.lease_ns = lease_ns;
        let s = run_sweep(&at, path, &opts).map_err(LabError::from)?;
        let first = s
            .failures
            .first()
            .map(|f| (f.seed, f.invariants.first().cloned().unwrap_or_default()));
        rows.push(LeaseRow {
            lease_ns,
            seeds_run: s.seeds_run,
            failing_seeds: s.failing_seeds,
            first,
        });
    }
    Ok(LeaseFloor {
        scenario: path.to_string(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(lease_ms: u64, failing: u64) -> LeaseRow {
        LeaseRow {
            lease_ns: lease_ms * 1_000_000,
            seeds_run: 10,
            failing_seeds: failing,
            first: None,
        }
    }

    #[test]
    fn the_floor_is_clean_with_every_longer_candidate() {
        let f = |rows| LeaseFloor {
            scenario: "x".into(),
            rows,
        };
        assert_eq!(
            f(vec![
                row(50, 3),
                row(100, 0),
                row(200, 1),
                row(400, 0),
                row(800, 0)
            ])
            .floor_ns(),
            Some(400_000_000),
            "a clean candidate below a failing one is luck, not the floor"
        );
        assert_eq!(
            f(vec![row(50, 0), row(100, 0)]).floor_ns(),
            Some(50_000_000)
        );
        assert_eq!(f(vec![row(50, 2), row(100, 1)]).floor_ns(), None);
    }

    /// On `scenarios/vllm-pull.toml` a 50 ms lease fails within 10 seeds (seed 2: the
    /// READ served after the lease, S2) and the file's own 2 s lease is clean; an
    /// SGLang scenario has no lease to search.
    #[test]
    fn a_short_lease_fails_and_the_scenarios_own_lease_is_clean() {
        let path = "scenarios/vllm-pull.toml";
        let sc = crate::matrix::load(path).unwrap();
        let f = lease_floor(&sc, path, &[2_000_000_000, 50_000_000], 10, Some(1)).unwrap();
        assert_eq!(f.rows[0].lease_ns, 50_000_000, "shortest first");
        assert!(f.rows[0].failing_seeds > 0, "{}", f.render());
        assert_eq!(
            f.rows[0].first.as_ref().map(|(_, i)| i.as_str()),
            Some("S2")
        );
        assert_eq!(f.floor_ns(), Some(2_000_000_000), "{}", f.render());
        let sglang = crate::matrix::load("scenarios/partition.toml").unwrap();
        let e = lease_floor(&sglang, "partition", &[1], 1, Some(1)).unwrap_err();
        assert!(e.to_string().contains("vllm-router"), "{e}");
    }
}
