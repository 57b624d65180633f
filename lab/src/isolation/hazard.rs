//! The matrix's columns: the hazards (a bug switch, a data fault, the slow writer),
//! the scenario each runs in, and what counts as a leak. Which defenses face them is
//! [`super::configs`]'s; running a cell is [`super::cell`]'s.

use crate::matrix::{load, scenario_for, RANK_SWITCHES, VLLM_SWITCHES};
use crate::LabError;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::Defenses;
use kvsim_engine::invariant::Invariant;
use kvsim_sim::scenario::Scenario;

/// What a leak is: a read of slots the request never wrote or a reply carrying
/// another request's canary (S3), or a 200 with a wrong token (S10): what a client
/// would see.
pub const LEAKS: [Invariant; 2] = [Invariant::S3, Invariant::S10];

/// A hazard: a bug switch (in the scenario that reaches its code path) or a data
/// fault (alone, in `scenarios/data-faults.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hazard {
    Bugs(BugSet),
    Data(&'static str),
    /// A prefill node that stays alive and keeps writing after decode timed out, asked
    /// for the drain until its budget ran out, and gave up (`faults.slow_writer_ms`).
    SlowWriter,
}

impl Hazard {
    pub fn name(self) -> String {
        match self {
            Hazard::Bugs(b) if b == BugSet::INCIDENT => "incident pair".into(),
            Hazard::Bugs(b) => b.to_string(),
            Hazard::Data(f) => format!("{f} write"),
            Hazard::SlowWriter => "slow writer".into(),
        }
    }

    /// A defense whose own path the hazard needs to be reachable at all: auto-truncation
    /// is the admission check's policy, so a request is cut (and the halves can disagree
    /// for `no-length-agreement`) only when the admission check is on.
    pub fn reached_only_with(self) -> Option<fn(&Defenses) -> bool> {
        match self {
            Hazard::Bugs(b) if b == BugSet::NONE.with(Bug::NoLengthAgreement) => {
                Some(|d| d.admission_check)
            }
            _ => None,
        }
    }

    pub(super) fn bugs(self) -> BugSet {
        match self {
            Hazard::Bugs(b) => b,
            Hazard::Data(_) | Hazard::SlowWriter => BugSet::NONE,
        }
    }

    /// The scenario that exercises it.
    pub fn scenario(self) -> Result<(&'static str, Scenario), LabError> {
        match self {
            Hazard::Bugs(b) => {
                let path = scenario_for(b);
                Ok((path, load(path)?))
            }
            Hazard::Data(f) => {
                let path = "scenarios/data-faults.toml";
                let mut sc = load(path)?;
                let fs = &mut sc.faults;
                let all = [
                    ("corrupt", &mut fs.corrupt_write_permille),
                    ("misdirect", &mut fs.misdirect_write_permille),
                    ("torn", &mut fs.torn_write_permille),
                    ("stale-duplicate", &mut fs.stale_duplicate_write_permille),
                ];
                for (name, rate) in all {
                    *rate = if name == f { 200 } else { 0 };
                }
                Ok((path, sc))
            }
            Hazard::SlowWriter => {
                // The data-fault scenario's fleet with its data faults off, one prefill
                // node, and its writes landing later than decode's waiting timeout (2 s)
                // plus its whole drain budget (100 x 50 ms). sim/tests/slow_writer.rs
                // uses 12 s; here 7.5 s, so that some late writes still land while the
                // pages' next owners read them (at 12 s none leaked, with no defense,
                // on 10 seeds: the workload had finished reading).
                let path = "scenarios/data-faults.toml";
                let mut sc = load(path)?;
                let fs = &mut sc.faults;
                fs.corrupt_write_permille = 0;
                fs.misdirect_write_permille = 0;
                fs.torn_write_permille = 0;
                fs.stale_duplicate_write_permille = 0;
                fs.slow_writer_ms = 7_500;
                if let Some(sw) = sc.swarm.as_mut() {
                    sw.prefill_nodes = [1, 1];
                }
                Ok((path, sc))
            }
        }
    }
}

/// Every hazard: each runtime bug switch, the incident pair, the four data faults,
/// the slow writer. `abort-after-success` is no hazard a defense stops: its requests
/// are answered with an error safely (no page at risk), and only the model checker's
/// "an error answer has a cause" judges it. Nor is `retry-reuses-room`: the router's
/// replay is the router's fault, judged where it happens (S7 at its second `Routed`),
/// and no node defense can tell a replay from a duplicated start. Nor
/// `duplicate-room-joins-live`: the peer check refuses the colliding start, which is
/// no defense switch (`engine/tests/duplicate_room.rs`, `scenarios/client-rooms.toml`).
/// Nor the switches of rooms with several ranks ([`RANK_SWITCHES`]) or of vLLM's
/// nodes ([`VLLM_SWITCHES`]): they are vLLM's pull's (the count of READ handles, the
/// lease, the READ's error path), whose defenses are no switch of [`Defenses`]; the
/// matrix's defenses are SGLang's push path's, and its columns are not yet run on
/// vLLM's protocol.
/// Nor `prefill-drops-failed-page-list`: it puts no page at risk, only decode's
/// cleanup waits for its own timer (`scenarios/failed-room.toml`, model `failed-room`).
pub fn hazards() -> Vec<Hazard> {
    let router_only = [
        Bug::SkipPreflight,
        Bug::AbortAfterSuccess,
        Bug::DuplicateRoomJoinsLive,
        Bug::RetryReusesRoom,
        Bug::PrefillDropsFailedPageList,
    ];
    let mut v: Vec<Hazard> = Bug::ALL
        .into_iter()
        .filter(|b| !router_only.contains(b))
        .filter(|b| !RANK_SWITCHES.contains(b) && !VLLM_SWITCHES.contains(b))
        .map(|b| Hazard::Bugs(BugSet::NONE.with(b)))
        .collect();
    v.push(Hazard::Bugs(BugSet::INCIDENT));
    for f in ["corrupt", "misdirect", "torn", "stale-duplicate"] {
        v.push(Hazard::Data(f));
    }
    v.push(Hazard::SlowWriter);
    v
}
