//! [`SweepOptions`]: how a sweep runs (seeds, shard, jobs, stop rules, time budget,
//! audits). Plain configuration; the runner reads it, nothing here runs seeds.

use crate::sweep::seeds::{SeedRange, Shard};
use kvsim_engine::bugs::BugSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// How to run a sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    pub seeds: SeedRange,
    pub shard: Shard,
    /// Worker threads; `None`: one per core.
    pub jobs: Option<usize>,
    pub bugs: Option<BugSet>,
    /// Show a progress bar (on stderr).
    pub progress: bool,
    /// Run each seed twice and compare trace hashes.
    pub check_determinism: bool,
    /// Keep at most this many failures (the earliest seeds) in the summary.
    pub keep_failures: usize,
    /// Stop after the first failing seed (in seed order among those run).
    pub stop_at_first: bool,
    /// With `stop_at_first`, a seed with a detection and no violation stops the sweep
    /// too (the bug matrix: a switch counts as caught when a defense had to stop its
    /// hazard). It changes only where the sweep stops, never which seed fails.
    pub stop_on_detection: bool,
    /// Also audit each seed's trace alone (`kvsim audit`'s oracle, fed only the
    /// trace's header and entries, handed over in memory: [`crate::run_and_audit_in_memory`]);
    /// a seed whose audit verdict differs from the in-process one is reported.
    pub audit: bool,
    /// Stop starting seeds once this much wall time has passed.
    pub time_budget: Option<Duration>,
    /// Raised (by a Ctrl-C handler): stop starting seeds, summarise what ran.
    pub interrupt: Option<Arc<AtomicBool>>,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            seeds: SeedRange { start: 0, end: 100 },
            shard: Shard::WHOLE,
            jobs: None,
            bugs: None,
            progress: false,
            check_determinism: false,
            keep_failures: 20,
            stop_at_first: false,
            stop_on_detection: false,
            audit: false,
            time_budget: None,
            interrupt: None,
        }
    }
}
