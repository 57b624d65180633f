//! Declared reachability: the protocol paths a scenario exists to reach.
//!
//! A fault scenario whose faults never trigger the path it was written for passes
//! vacuously. Each scenario file therefore names the paths it exists to reach
//! (`reach = ["drain-after-timeout", ...]`), every run records which paths of this
//! closed vocabulary it reached (a [`ReachSet`], one bit per path, set by a
//! [`ReachTracker`] as the run's trace entries are emitted, never by reading a trace
//! back), and a sweep that ran all its seeds fails when a declared path was reached by
//! no seed: the simulator's counterpart of the model checker's `sometimes`
//! properties.
//!
//! Every path is defined here once, over the trace alone (engine events plus the
//! driver's timer-fire and crash records, `docs/TRACE.md`), so the same definition
//! judges a live run ([`crate::simulator::Simulator`] feeds the tracker as it emits)
//! and an exported trace ([`ReachTracker::entry`]). The model checker's `sometimes`
//! conditions (`models/src/model.rs`) are defined over model state (messages in the
//! network, the router's room table, the environment's fault book), not over trace
//! events; where a path here is the trace-side counterpart of one of them, its doc
//! names it.

use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, RoomKey, WriteId};
use kvsim_engine::msg::Status;
use kvsim_engine::trace::{NodeFault, Side, TraceEvent};
use kvsim_oracle::schema::{Entry, FaultEvent, Record};
use strum::{EnumCount, VariantArray};

/// One protocol path a run may reach. Declaration order is the order every list
/// prints them in.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, strum::EnumCount, strum::VariantArray,
)]
pub enum ReachPath {
    RequestCompletes,
    RejectedAtIntake,
    Truncated,
    BootstrapTimeout,
    TransferTimeout,
    RequestTimeout,
    SendFailed,
    TransferRefused,
    AbortMidTransfer,
    Quarantine,
    LandedInQuarantine,
    DrainAfterTimeout,
    DrainGaveUp,
    StaleWriteRefused,
    TagMismatch,
    PeerRefused,
    RetryNewRoom,
    RetryWhileLive,
    CrashMidRequest,
    PauseMidRequest,
    ReadNotified,
    LeaseExpired,
    FrontCancelBoth,
    StaleLanded,
}

/// Each path's (path, name, meaning, witness), in declaration order: the one place
/// each path is described ([`ReachPath::about`] reads it; a test checks the order).
const ABOUT: [(ReachPath, &str, &str, &str); ReachPath::COUNT] = [
    // The model checker's `a request completes`.
    (
        ReachPath::RequestCompletes,
        "request-completes",
        "a client got its answer with status 200",
        "`RouterResponse` with status 200",
    ),
    // The model checker's `an over-length request is rejected` is the
    // over-length case of this one.
    (
        ReachPath::RejectedAtIntake,
        "rejected-at-intake",
        "a half refused a request at intake, before it took any resource",
        "`Rejected`",
    ),
    (
        ReachPath::Truncated,
        "truncated",
        "prefill cut an over-length prompt to its limit (`allow_auto_truncate`)",
        "`Truncated`",
    ),
    (
        ReachPath::BootstrapTimeout,
        "bootstrap-timeout",
        "prefill gave up a room whose page list never came (its bootstrap timer)",
        "`Responded` by a node while it handles its `Bootstrap` timer",
    ),
    (
        ReachPath::TransferTimeout,
        "transfer-timeout",
        "decode's waiting timer failed a transfer that never completed",
        "`TransferFailed` while the node handles its `WaitingForKv` timer",
    ),
    (
        ReachPath::RequestTimeout,
        "request-timeout",
        "the router's request timer gave up an attempt (answered it, or retried it)",
        "`RouterResponse` or `RouterRetried` while the router handles its `Request` timer",
    ),
    (
        ReachPath::SendFailed,
        "send-failed",
        "prefill reported a failed KV send and decode heard it",
        "`TransferReported` with `success: false`",
    ),
    (
        ReachPath::TransferRefused,
        "transfer-refused",
        "decode's verification (defense 2) refused a transfer prefill reported complete",
        "`TransferRefused`",
    ),
    // The model checker's `an abort races an in-flight KV write` (there: any
    // loss of the destination's ownership, here: the abort itself).
    (
        ReachPath::AbortMidTransfer,
        "abort-mid-transfer",
        "decode noted an abort of a room while one of the room's KV writes was on its way to it",
        "`AbortNoted` (decode) of a room after a `KvSent` of it and before that write's `KvLanded`, `KvRefused`, `write_failed` or `WriteCompleted`",
    ),
    (
        ReachPath::Quarantine,
        "quarantine",
        "decode kept a failed room's pages out of circulation until the drain ack",
        "`Quarantined`",
    ),
    (
        ReachPath::LandedInQuarantine,
        "landed-in-quarantine",
        "a KV write landed in pages decode held in quarantine (what deferred release is for)",
        "`KvLanded` of a room on a node between the room's `Quarantined` and `QuarantineReleased` there",
    ),
    // The model checker's `a drain ack arrives after a timeout`.
    (
        ReachPath::DrainAfterTimeout,
        "drain-after-timeout",
        "a quarantine ended on a drain ack that came after decode's drain-retry timer fired",
        "`QuarantineReleased` of a room after a `DrainRetry` timer of it fired on that node while it was quarantined",
    ),
    (
        ReachPath::DrainGaveUp,
        "drain-gave-up",
        "decode spent its drain-retry budget: the pages stay quarantined and the node stops taking requests",
        "`Fault` `DrainAckMissing`",
    ),
    (
        ReachPath::StaleWriteRefused,
        "stale-write-refused",
        "the landing-time tag check refused a KV write aimed at a page's other generation",
        "`KvRefused` with a `tag`",
    ),
    (
        ReachPath::TagMismatch,
        "tag-mismatch",
        "the read-time tag check (defense 4) refused a decode step",
        "`TagMismatch`",
    ),
    (
        ReachPath::PeerRefused,
        "peer-refused",
        "a node refused a message about a room from a node that is not the room's peer",
        "`PeerRefused`",
    ),
    (
        ReachPath::RetryNewRoom,
        "retry-new-room",
        "the router (`sglang-router`) gave up an attempt and retried the request in a new room",
        "`RouterRetried`",
    ),
    // The model checker's `a request is retried while a given-up attempt's
    // half is live`.
    (
        ReachPath::RetryWhileLive,
        "retry-while-live",
        "a half of a given-up attempt was still at work after the router retried it",
        "an event of a room from a node other than the router after the room's `RouterRetried`",
    ),
    // The model checker's `a node crashes while it holds a request`.
    (
        ReachPath::CrashMidRequest,
        "crash-mid-request",
        "a prefill or decode node crashed while it held an admitted, unanswered request",
        "the `crash` fault of a node after an `Admitted` there and before that half's `Responded`",
    ),
    // The model checker's `a node freezes while it holds a request`.
    (
        ReachPath::PauseMidRequest,
        "pause-mid-request",
        "a prefill or decode node froze (a stall) while it held an admitted, unanswered request",
        "the `pause` fault of a node after an `Admitted` there and before that half's `Responded`",
    ),
    (
        ReachPath::ReadNotified,
        "read-notified",
        "a vLLM prefill freed a room's leased pages on its reader's notification (pull)",
        "`LeaseEnded` with `expired: false`",
    ),
    (
        ReachPath::LeaseExpired,
        "lease-expired",
        "a vLLM prefill's lease on a room's pages expired with no notification (pull)",
        "`LeaseEnded` with `expired: true`",
    ),
    (
        ReachPath::FrontCancelBoth,
        "front-cancel-both",
        "a decode worker front heard prefill's failure (`PrefillDone`) and ended decode's half (worker mode)",
        "`FrontCancelled`",
    ),
    // NIXL's stale metadata (`StaleWrite::Lands`): on RDMA the registration is gone.
    (
        ReachPath::StaleLanded,
        "stale-landed",
        "a KV write addressed to an earlier incarnation of its receiver landed in the restarted one's memory (NIXL)",
        "`KvLanded` at a node with a destination tag of an epoch before the node's last crash",
    ),
];

impl ReachPath {
    /// Every path, in declaration order.
    pub const ALL: [ReachPath; ReachPath::COUNT] = kvsim_engine::every(ReachPath::VARIANTS);

    /// The name a scenario's `reach` list and every report use.
    pub fn name(self) -> &'static str {
        self.about().0
    }

    /// What reaching the path means, in a line.
    pub fn meaning(self) -> &'static str {
        self.about().1
    }

    /// The trace entries that witness it.
    pub fn witness(self) -> &'static str {
        self.about().2
    }

    /// (name, meaning, witness), from [`ABOUT`].
    fn about(self) -> (&'static str, &'static str, &'static str) {
        let (path, name, meaning, witness) = ABOUT[self as usize];
        assert_eq!(path, self, "ABOUT is in declaration order");
        (name, meaning, witness)
    }

    /// The path named `name`.
    pub fn parse(name: &str) -> Option<ReachPath> {
        ReachPath::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Every name, comma-separated (for errors that list the known names).
    pub fn names() -> String {
        let names: Vec<&str> = ReachPath::ALL.iter().map(|p| p.name()).collect();
        names.join(", ")
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The paths as a Markdown table (docs/SCENARIOS.md holds exactly this text).
    pub fn markdown_table() -> String {
        let mut s = String::from("| path | meaning | witness in the trace |\n|---|---|---|\n");
        for p in ReachPath::ALL {
            s.push_str(&format!(
                "| `{}` | {} | {} |\n",
                p.name(),
                p.meaning(),
                p.witness()
            ));
        }
        s
    }
}

impl std::fmt::Display for ReachPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The paths one run reached: a bit per [`ReachPath`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ReachSet(u32);

impl ReachSet {
    pub fn insert(&mut self, p: ReachPath) {
        self.0 |= p.bit();
    }
    pub fn contains(self, p: ReachPath) -> bool {
        self.0 & p.bit() != 0
    }
    /// The paths in the set, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = ReachPath> {
        ReachPath::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What a run remembers to recognise the paths that span several entries. Its lists
/// hold only what is live at the moment (writes in flight, quarantines, unanswered
/// halves, given-up rooms), so they stay as small as the run's concurrency.
#[derive(Clone, Debug, Default)]
pub struct ReachTracker {
    reached: ReachSet,
    /// The timer whose handling emits the current engine events.
    timer: Option<(NodeId, Timer)>,
    /// For a trace read back: the step (`seq`) of that timer's firing.
    timer_seq: Option<u64>,
    /// KV writes sent and not yet landed, refused or failed (on their way).
    in_flight: Vec<WriteId>,
    /// Quarantined room uses by node, and how many drain retries decode counted for
    /// each (a retry timer counts when its arming is the count so far, as decode's).
    quarantined: Vec<(NodeId, RoomKey, u32)>,
    /// Halves admitted and not yet answered, by node.
    live: Vec<(NodeId, RoomKey)>,
    /// Room uses the router gave up and retried (with the router's id).
    given_up: Vec<(NodeId, RoomKey)>,
    /// How often each node crashed: its current incarnation's epoch.
    epochs: Vec<(NodeId, u32)>,
}

impl ReachTracker {
    /// The paths reached so far.
    pub fn reached(&self) -> ReachSet {
        self.reached
    }

    fn hit(&mut self, p: ReachPath) {
        self.reached.insert(p);
    }

    /// A node starts handling `timer` (`None`: it handles something else). The engine
    /// events emitted until the next input are its handling.
    pub fn handling_timer(&mut self, timer: Option<(NodeId, Timer)>) {
        self.timer = timer;
        if let Some((node, Timer::DrainRetry(room, arming))) = timer {
            for q in &mut self.quarantined {
                if q.0 == node && q.1 == room && q.2 == arming {
                    q.2 = q.2.saturating_add(1);
                }
            }
        }
    }

    /// Node `node` crashed: its incarnation's requests, quarantines and posted writes
    /// are gone.
    pub fn crashed(&mut self, node: NodeId) {
        match self.epochs.iter_mut().find(|(n, _)| *n == node) {
            Some((_, e)) => *e += 1,
            None => self.epochs.push((node, 1)),
        }
        if self.live.iter().any(|(n, _)| *n == node) {
            self.hit(ReachPath::CrashMidRequest);
        }
        self.live.retain(|(n, _)| *n != node);
        self.quarantined.retain(|(n, _, _)| *n != node);
        self.in_flight.retain(|w| w.writer != node);
    }

    /// Node `node` froze: its requests stay its own (a pause kills nothing).
    pub fn paused(&mut self, node: NodeId) {
        if self.live.iter().any(|(n, _)| *n == node) {
            self.hit(ReachPath::PauseMidRequest);
        }
    }

    /// KV write `write` is no longer on its way: it failed on the wire (the driver's
    /// `write_failed` record), or it landed, was refused or completed.
    pub fn write_done(&mut self, write: WriteId) {
        if let Some(i) = self.in_flight.iter().position(|w| *w == write) {
            self.in_flight.swap_remove(i);
        }
    }

    /// An engine event, as it is emitted.
    pub fn event(&mut self, ev: &TraceEvent) {
        if !self.given_up.is_empty() {
            self.given_up_still_live(ev);
        }
        self.request_event(ev);
        self.write_event(ev);
        self.page_event(ev);
    }

    /// Is the step being handled `node`'s firing of a timer `want` picks?
    fn handling(&self, want: fn(Timer) -> bool, node: &NodeId) -> bool {
        self.timer.is_some_and(|(n, t)| n == *node && want(t))
    }

    /// The events of a request and its halves: answers, retries, refusals at intake,
    /// the timers that end them.
    fn request_event(&mut self, ev: &TraceEvent) {
        use TraceEvent as E;
        match ev {
            E::RouterResponse { node, status, .. } => {
                if *status == Status::OK {
                    self.hit(ReachPath::RequestCompletes);
                }
                if self.handling(|t| matches!(t, Timer::Request(_)), node) {
                    self.hit(ReachPath::RequestTimeout);
                }
            }
            E::FrontCancelled { .. } => self.hit(ReachPath::FrontCancelBoth),
            E::RouterRetried { node, room, .. } => {
                self.hit(ReachPath::RetryNewRoom);
                if self.handling(|t| matches!(t, Timer::Request(_)), node) {
                    self.hit(ReachPath::RequestTimeout);
                }
                if !self.reached.contains(ReachPath::RetryWhileLive) {
                    self.given_up.push((*node, *room));
                }
            }
            E::Rejected { .. } => self.hit(ReachPath::RejectedAtIntake),
            E::Truncated { .. } => self.hit(ReachPath::Truncated),
            E::Admitted { node, room, .. } => self.live.push((*node, *room)),
            E::Responded { node, room, .. } => {
                if self.handling(|t| matches!(t, Timer::Bootstrap(_)), node) {
                    self.hit(ReachPath::BootstrapTimeout);
                }
                if let Some(i) = self.live.iter().position(|x| *x == (*node, *room)) {
                    self.live.swap_remove(i);
                }
            }
            E::TransferFailed { node, .. }
                if self.handling(|t| matches!(t, Timer::WaitingForKv(_)), node) =>
            {
                self.hit(ReachPath::TransferTimeout)
            }
            E::TransferReported { success: false, .. } => self.hit(ReachPath::SendFailed),
            E::TransferRefused { .. } => self.hit(ReachPath::TransferRefused),
            _ => {}
        }
    }

    /// The events of KV writes and the checks on them: sent, landed, refused,
    /// completed, an abort while one is in flight, a tag or peer refused.
    fn write_event(&mut self, ev: &TraceEvent) {
        use TraceEvent as E;
        match ev {
            E::KvSent { write, .. } => self.in_flight.push(*write),
            E::KvRefused { write, tag, .. } => {
                if tag.is_some() {
                    self.hit(ReachPath::StaleWriteRefused);
                }
                self.write_done(*write);
            }
            E::WriteCompleted { write, .. } => self.write_done(*write),
            E::AbortNoted {
                room,
                side: Side::Decode,
                ..
            } if self.in_flight.iter().any(|w| w.room == *room) => {
                self.hit(ReachPath::AbortMidTransfer)
            }
            E::KvLanded { node, write, dst } => {
                self.write_done(*write);
                let epoch = self
                    .epochs
                    .iter()
                    .find(|(n, _)| n == node)
                    .map_or(0, |(_, e)| *e);
                if dst.iter().any(|t| t.gen.epoch() < epoch) {
                    self.hit(ReachPath::StaleLanded);
                }
                if self
                    .quarantined
                    .iter()
                    .any(|(n, r, _)| n == node && *r == write.room)
                {
                    self.hit(ReachPath::LandedInQuarantine);
                }
            }
            E::TagMismatch { .. } => self.hit(ReachPath::TagMismatch),
            E::PeerRefused { .. } => self.hit(ReachPath::PeerRefused),
            _ => {}
        }
    }

    /// The events of quarantined pages: quarantine, its release, a drain given up.
    fn page_event(&mut self, ev: &TraceEvent) {
        use TraceEvent as E;
        match ev {
            E::Quarantined { node, room, .. } => {
                self.hit(ReachPath::Quarantine);
                self.quarantined.push((*node, *room, 0));
            }
            E::QuarantineReleased { node, room, .. } => {
                if let Some(i) = self
                    .quarantined
                    .iter()
                    .position(|(n, r, _)| n == node && r == room)
                {
                    if self.quarantined.swap_remove(i).2 > 0 {
                        self.hit(ReachPath::DrainAfterTimeout);
                    }
                }
            }
            E::Fault {
                fault: NodeFault::DrainAckMissing { .. },
                ..
            } => self.hit(ReachPath::DrainGaveUp),
            E::LeaseEnded { expired, .. } => self.hit(match expired {
                true => ReachPath::LeaseExpired,
                false => ReachPath::ReadNotified,
            }),
            _ => {}
        }
    }

    /// `ev` is a node other than the router at work on a room the router gave up.
    fn given_up_still_live(&mut self, ev: &TraceEvent) {
        let Some(room) = ev.room() else { return };
        let node = ev.node();
        if self.given_up.iter().any(|(r, k)| *k == room && *r != node) {
            self.hit(ReachPath::RetryWhileLive);
            self.given_up.clear();
        }
    }

    /// A trace entry, for a trace read back (an exported or audited run): the same
    /// paths the live run recorded. A timer's handling is the engine events of its
    /// step (the entries that share the firing's `seq`).
    pub fn entry(&mut self, e: &Entry) {
        if self.timer_seq != Some(e.seq) {
            self.timer_seq = None;
            self.timer = None;
        }
        match &e.rec {
            Record::TimerFire { node, timer } => {
                self.handling_timer(Some((*node, *timer)));
                self.timer_seq = Some(e.seq);
            }
            Record::Engine(ev) => self.event(ev),
            Record::WriteFailed { write, .. } => self.write_done(*write),
            Record::Fault(FaultEvent::Crash { node, .. }) => self.crashed(*node),
            Record::Fault(FaultEvent::Pause { node, .. }) => self.paused(*node),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        for p in ReachPath::ALL {
            assert_eq!(ReachPath::parse(p.name()), Some(p));
            assert!(!p.meaning().is_empty() && !p.witness().is_empty());
            assert_eq!(
                ReachPath::ALL
                    .iter()
                    .filter(|q| q.name() == p.name())
                    .count(),
                1
            );
        }
        assert_eq!(ReachPath::parse("no-such-path"), None);
        // One bit each, all distinct, all in a u32.
        let all = ReachPath::ALL.iter().fold(0u32, |acc, p| acc | p.bit());
        assert_eq!(all.count_ones() as usize, ReachPath::ALL.len());
    }

    #[test]
    fn docs_hold_the_paths_table() {
        let doc = include_str!("../../docs/SCENARIOS.md");
        let table = ReachPath::markdown_table();
        assert!(
            doc.contains(&table),
            "docs/SCENARIOS.md must hold the reachable paths' table as generated:\n{table}"
        );
    }
}
