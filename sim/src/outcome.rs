//! What one run produced ([`RunOutcome`]) and the questions asked of it: clean or not,
//! which invariants were violated or detected, what a tenant was answered.

use crate::plan::Plan;
use crate::scenario::PlannedRequest;
use crate::simulator::output::{ClientReply, FaultStats};
use kvsim_engine::bugs::BugSet;
use kvsim_engine::ids::{RequestId, RoomKey, TenantId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Status;
use kvsim_oracle::schema::{Entry, RunHeader};
use kvsim_oracle::{Finding, Leak};
use std::collections::BTreeMap;

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub scenario: String,
    pub seed: u64,
    pub bugs: BugSet,
    pub plan: Plan,
    pub requests: Vec<PlannedRequest>,
    pub replies: BTreeMap<RequestId, Vec<ClientReply>>,
    pub room_requests: BTreeMap<RoomKey, RequestId>,
    /// Every finding: violations and detections (a defense that fired).
    pub findings: Vec<Finding>,
    pub leaks: Vec<Leak>,
    /// The trace's header (the facts a checker needs about the run).
    pub header: RunHeader,
    pub events: u64,
    pub sim_ns: u64,
    /// The trace hash ([`Simulator::trace_hash`](crate::simulator::Simulator::trace_hash)); `None` for a run that kept none
    /// ([`run_plan_unhashed`](crate::run_plan_unhashed)).
    pub trace_hash: Option<u64>,
    pub stats: FaultStats,
    /// The full event log (empty unless the run was traced).
    pub trace: Vec<Entry>,
}

impl RunOutcome {
    /// No invariant violated (a defense that fired is a detection, not a violation).
    pub fn clean(&self) -> bool {
        !kvsim_oracle::fails(&self.findings)
    }
    /// The invariants violated, in order of first violation.
    pub fn broken(&self) -> Vec<Invariant> {
        distinct(self.findings.iter().filter(|f| f.violated()))
    }
    /// The invariants a defense detected (and stopped), in order.
    pub fn detected(&self) -> Vec<Invariant> {
        distinct(self.findings.iter().filter(|f| !f.violated()))
    }
    /// Every invariant found, violated or detected.
    pub fn found(&self) -> Vec<Invariant> {
        distinct(self.findings.iter())
    }
    /// The first violation, if any.
    pub fn first(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.violated())
    }
    /// The first finding of either kind, if any.
    pub fn first_finding(&self) -> Option<&Finding> {
        self.findings.first()
    }
    /// The status of the first reply to the first request of `tenant` that got one.
    pub fn status_of(&self, tenant: TenantId) -> Option<Status> {
        self.requests
            .iter()
            .filter(|r| r.tenant == tenant)
            .find_map(|r| {
                self.replies
                    .get(&r.req)
                    .and_then(|v| v.first())
                    .map(|c| c.status)
            })
    }
}

/// The distinct invariants of some findings, in order of first appearance.
pub fn distinct<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Vec<Invariant> {
    let mut out = Vec::new();
    for f in findings {
        if !out.contains(&f.violation.invariant) {
            out.push(f.violation.invariant);
        }
    }
    out
}
