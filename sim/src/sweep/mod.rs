//! Sweeps: many seeds of one scenario in parallel, with a summary that merges.
//!
//! Seeds stream through a rayon pool of `jobs` threads in batches, without building
//! any trace (a failing seed is replayed with one later: determinism makes that
//! exact), so a sweep's memory does not grow with its seed range; it may stop early
//! (first failure, time budget, Ctrl-C) and then records where to resume. A sweep can be cut
//! into shards (`k/n`: every n-th seed of the range, starting with the k-th, 1-based)
//! so that any batch system (Slurm arrays, Kubernetes indexed jobs, CI matrices) runs
//! it across machines; each shard's [`SweepSummary`] is JSON, and [`SweepSummary::merge`]
//! adds them up. With `check_determinism` every seed runs twice and the two trace
//! hashes must agree.

mod options;
mod runner;
mod seeds;
mod summary;

pub use options::SweepOptions;
pub use runner::{finding_name, run_sweep, run_sweep_streaming};
pub use seeds::{SeedRange, Shard, UsageError};
pub use summary::{Failure, SweepSummary};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coverage::Coverage;

    #[test]
    fn ranges_and_shards_parse() {
        assert_eq!(
            SeedRange::parse("0..10").unwrap(),
            SeedRange { start: 0, end: 10 }
        );
        assert_eq!(SeedRange::parse("3..=4").unwrap().len(), 2);
        assert_eq!(SeedRange::parse("7").unwrap().len(), 1);
        assert!(SeedRange::parse("5..5").is_err());
        assert!(SeedRange::parse("a..b").is_err());
        let max = SeedRange::parse("18446744073709551615")
            .unwrap_err()
            .to_string();
        assert!(
            max.contains("kvsim replay --seed 18446744073709551615"),
            "{max}"
        );
        assert!(SeedRange::parse("0..=18446744073709551615").is_err());
        assert_eq!(
            SeedRange::parse("0..18446744073709551615").unwrap().len(),
            u64::MAX
        );
        let s = Shard::parse("2/3").unwrap();
        let r = SeedRange { start: 10, end: 20 };
        assert_eq!(s.seeds(r).collect::<Vec<_>>(), vec![11, 14, 17]);
        assert!(Shard::parse("0/3").is_err());
        assert!(Shard::parse("4/3").is_err());
        // The shards of a sweep cover every seed exactly once.
        let mut all: Vec<u64> = (1..=3)
            .flat_map(|k| Shard { k, n: 3 }.seeds(r).collect::<Vec<_>>())
            .collect();
        all.sort();
        assert_eq!(all, (10..20).collect::<Vec<_>>());
    }

    #[test]
    fn shard_seeds_are_computed_not_stored() {
        // A range of 10^18 seeds: counting and taking the first few costs nothing.
        let r = SeedRange {
            start: 5,
            end: 1_000_000_000_000_000_005,
        };
        let s = Shard { k: 3, n: 1000 };
        assert_eq!(s.count(r), 1_000_000_000_000_000);
        assert_eq!(s.seeds(r).take(2).collect::<Vec<_>>(), vec![7, 1007]);
        // A shard with no seed in the range.
        let small = SeedRange { start: 0, end: 4 };
        assert_eq!(Shard { k: 1000, n: 1000 }.count(small), 0);
        assert_eq!(Shard { k: 1000, n: 1000 }.seeds(small).count(), 0);
        let top = SeedRange {
            start: u64::MAX - 3,
            end: u64::MAX,
        };
        assert_eq!(
            Shard { k: 2, n: 2 }.seeds(top).collect::<Vec<_>>(),
            vec![u64::MAX - 2]
        );
    }

    fn part(k: u32, n: u32, run: u64) -> SweepSummary {
        let names = ("t".to_string(), "t.toml".to_string());
        let seeds = SeedRange { start: 0, end: 4 };
        SweepSummary {
            shards: vec![Shard { k, n }],
            seeds_planned: run,
            seeds_run: run,
            jobs: 1,
            ..SweepSummary::empty(names, "none".into(), seeds, Coverage::default())
        }
    }

    #[test]
    fn merge_counts_coverage_and_refuses_mixed_n() {
        let one = SweepSummary::merge(&[part(1, 2, 2)]).unwrap();
        assert!(!one.complete());
        assert_eq!(one.coverage(), "2 of 4 seeds covered; missing shards 2/2");
        assert!(
            one.render().contains("none in the seeds run"),
            "{}",
            one.render()
        );
        assert!(!one.render().contains("violations      none\n"));
        let both = SweepSummary::merge(&[part(1, 2, 2), part(2, 2, 2)]).unwrap();
        assert!(both.complete(), "{}", both.coverage());
        let mixed = SweepSummary::merge(&[part(1, 2, 2), part(1, 3, 2)]).unwrap_err();
        assert!(mixed.to_string().contains("not a shard of 2"), "{mixed}");
        let bad = SweepSummary::merge(&[part(0, 0, 2)]).unwrap_err();
        assert!(bad.to_string().contains("1 <= K <= N"), "{bad}");
        let mut over = part(1, 1, 9);
        over.seeds_planned = 4;
        assert!(SweepSummary::merge(&[over]).is_err());
    }
}
