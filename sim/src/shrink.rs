//! Shrinking: from a failing seed, a smaller run that breaks the same invariant.
//!
//! The search works on a [`Reduction`] of the seed's plan, never on the seed itself,
//! so every candidate is still a member of the same scenario and replays with
//! `kvsim replay SCENARIO --seed N --reduce SPEC`. Greedy passes, repeated while any
//! makes progress and the run budget lasts:
//! 1. fault kinds: all off at once, else each one off in turn;
//! 2. the safety phase: halved while the failure persists;
//! 3. requests: delta debugging (drop halves, then quarters, ... then single ones).
//!
//! A candidate "still fails" when any of its findings is the target invariant.
//! Removing a request changes the messages the network decides on, so faults move;
//! that is fine, the shrinker only needs some smaller run that fails the same way.

use crate::plan::{FaultKind, Plan, Reduction};
use crate::scenario::{Scenario, ScenarioError};
use crate::{run_plan, Backend, RunOutcome};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::ids::RequestId;
use kvsim_engine::invariant::Invariant;

/// The result of a shrink.
pub struct Shrunk {
    pub target: Invariant,
    pub reduction: Reduction,
    /// The shrunk run, traced.
    pub outcome: RunOutcome,
    pub runs: u32,
    pub requests_before: usize,
    pub faults_before: usize,
    pub safety_before_ns: Option<u64>,
}

impl Shrunk {
    /// One line saying what was removed.
    pub fn summary(&self) -> String {
        let p = &self.outcome.plan;
        let safety = |ns: Option<u64>| ns.map_or("-".to_string(), crate::plan::ms);
        format!(
            "shrunk in {} runs: {} -> {} requests, {} -> {} fault kinds on, safety phase {} -> {}; still violates {}",
            self.runs,
            self.requests_before,
            p.requests.len(),
            self.faults_before,
            p.levels.len(),
            safety(self.safety_before_ns),
            safety(p.heal_at_ns),
            self.target
        )
    }
}

struct Search<'a> {
    sc: &'a Scenario,
    seed: u64,
    bugs: Option<BugSet>,
    target: Invariant,
    runs: u32,
    budget: u32,
}

impl Search<'_> {
    fn fails(&mut self, r: &Reduction) -> Result<bool, ScenarioError> {
        if self.runs >= self.budget {
            return Ok(false);
        }
        self.runs += 1;
        let plan = Plan::build(self.sc, self.seed, self.bugs, r)?;
        let out = run_plan(&plan, Backend::Symbolic, false);
        Ok(out
            .findings
            .iter()
            .any(|f| f.violation.invariant == self.target))
    }

    /// Step 1: turn the fault kinds of `base` off, all at once if the seed still
    /// fails, else one at a time.
    fn drop_faults(&mut self, base: &Plan, best: &mut Reduction) -> Result<(), ScenarioError> {
        let on: Vec<FaultKind> = base
            .levels
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| !best.off.contains(k))
            .collect();
        if on.is_empty() {
            return Ok(());
        }
        let mut all_off = best.clone();
        all_off.off.extend(on.iter().copied());
        if self.fails(&all_off)? {
            *best = all_off;
            return Ok(());
        }
        for k in on {
            let mut c = best.clone();
            c.off.insert(k);
            if self.fails(&c)? {
                *best = c;
            }
        }
        Ok(())
    }

    /// Step 2: halve the safety phase while the seed still fails.
    fn shorten_safety(&mut self, best: &mut Reduction) -> Result<(), ScenarioError> {
        let Some(mut heal) = Plan::build(self.sc, self.seed, self.bugs, best)?.heal_at_ns else {
            return Ok(());
        };
        while heal > 1_000_000 {
            let mut c = best.clone();
            c.safety_ns = Some(heal / 2);
            if !self.fails(&c)? {
                break;
            }
            *best = c;
            heal /= 2;
        }
        Ok(())
    }

    /// Step 3: drop requests by delta debugging (remove one of `n` chunks; on no
    /// progress, finer chunks).
    fn drop_requests(&mut self, best: &mut Reduction) -> Result<(), ScenarioError> {
        let mut reqs: Vec<RequestId> = best.keep.clone().unwrap_or_default();
        let mut n = 2usize;
        while reqs.len() >= 2 && self.runs < self.budget {
            let chunk = reqs.len().div_ceil(n);
            let mut progressed = false;
            for i in 0..n {
                let lo = i * chunk;
                if lo >= reqs.len() {
                    break;
                }
                let hi = (lo + chunk).min(reqs.len());
                let rest: Vec<RequestId> = reqs[..lo].iter().chain(&reqs[hi..]).copied().collect();
                if rest.is_empty() {
                    continue;
                }
                let c = Reduction {
                    keep: Some(rest.clone()),
                    ..best.clone()
                };
                if self.fails(&c)? {
                    reqs = rest;
                    *best = c;
                    progressed = true;
                    break;
                }
            }
            if progressed {
                n = (n - 1).max(2);
                continue;
            }
            if n >= reqs.len() {
                break;
            }
            n = (n * 2).min(reqs.len());
        }
        Ok(())
    }
}

/// Shrink a failing seed. `target` defaults to the seed's first violated invariant;
/// `budget` bounds the number of runs. `None` when the seed does not fail.
pub fn shrink(
    sc: &Scenario,
    seed: u64,
    bugs: Option<BugSet>,
    target: Option<Invariant>,
    budget: u32,
) -> Result<Option<Shrunk>, ScenarioError> {
    let base = Plan::build(sc, seed, bugs, &Reduction::default())?;
    let first = run_plan(&base, Backend::Symbolic, false);
    let Some(target) = target.or_else(|| first.first().map(|f| f.violation.invariant)) else {
        return Ok(None);
    };
    if !first
        .findings
        .iter()
        .any(|f| f.violation.invariant == target)
    {
        return Ok(None);
    }
    let mut s = Search {
        sc,
        seed,
        bugs,
        target,
        runs: 1,
        budget,
    };
    let mut best = Reduction {
        keep: Some(base.requests.iter().map(|r| r.req).collect()),
        ..Reduction::default()
    };
    loop {
        let before = best.clone();
        s.drop_faults(&base, &mut best)?;
        s.shorten_safety(&mut best)?;
        s.drop_requests(&mut best)?;
        if best == before || s.runs >= s.budget {
            break;
        }
    }
    let plan = Plan::build(sc, seed, bugs, &best)?;
    let outcome = run_plan(&plan, Backend::Symbolic, true);
    Ok(Some(Shrunk {
        target,
        reduction: best,
        outcome,
        runs: s.runs,
        requests_before: base.requests.len(),
        faults_before: base.levels.len(),
        safety_before_ns: base.heal_at_ns,
    }))
}
