//! Bug switches: historical defects of this family, re-introduced on purpose.
//!
//! A [`BugSet`] is empty by default. Each [`Bug`] changes exactly the code path that
//! upstream got wrong and nothing else, so that the harness can prove it finds the
//! defect the way it would find it in a real engine: from the state and the replies,
//! never from a marker the switch leaves behind. The doc of each variant names the
//! upstream behaviour it re-creates and the invariant it breaks first.

use enumset::{enum_set, EnumSet, EnumSetType};
use serde::{Deserialize, Serialize};
use std::fmt;
use strum::{EnumCount, VariantArray};

/// One historical defect.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
    strum::IntoStaticStr,
    EnumSetType,
)]
#[strum(serialize_all = "kebab-case")]
#[enumset(no_super_impls)]
pub enum Bug {
    /// SGLang #30233 (fixed by #36988/#38935): an over-length prompt is rejected the
    /// legacy way (`set_finish_with_abort`: error kept in `to_finish`, prompt swapped
    /// for a 1-token placeholder) and the disaggregation queue gates and the prefill
    /// result path read `finished()` only, so the rejected request walks through the
    /// handoff. Breaks S5 first.
    GateChecksFinishedOnly,
    /// The root that turned the incident into a leak: decode accepts a transfer Success
    /// without checking that the tokens and pages written equal what it reserved (and
    /// its checksum digests only the tokens prefill says it sent). Breaks S4, then S3.
    NoLengthAgreement,
    /// SGLang #33507 (fix #33508): on transfer Success prefill sets the finish reason to
    /// LENGTH unconditionally, wiping a pending abort. Breaks S6.
    SuccessOverwritesAbort,
    /// SGLang before deferred release (#35049/#35360/#37077): decode frees an aborted
    /// or failed request's pages at once while prefill writes for them are in flight;
    /// LIFO reuse hands them to the next request. Breaks S2 (then S3).
    DecodeReleaseImmediate,
    /// SGLang #38961 ("hold prefill source pages"): prefill frees its source pages when
    /// it polls Failed while its sends are still reading them. Breaks S2.
    PrefillReleaseBeforeDrain,
    /// The #43719 class: one failed write future reports the room drained while sibling
    /// writes still run, so the drain ack goes out early. Breaks S9.
    FailedSendReportsDrained,
    /// Generation-blind ACKs: a drain ack for an earlier use of a reused room number
    /// releases the quarantine of the current one. Breaks S9.
    AckIgnoresGeneration,
    /// SGLang #9726 (fixed by #29017): on a client disconnect the router aborts the
    /// prefill half but never tells decode. Breaks L1/L4 (decode waits on its own
    /// timeout at best, forever at worst).
    RouterCancelsOneHalf,
    /// The #15734 class ("Committed KV cache already freed"): a second release path
    /// frees a finished request's pages again, through the allocator's unchecked free.
    /// Breaks S8.
    DoubleFreeOnFinish,
    /// SGLang #29249: the admission limit uses the context length only, so a request
    /// larger than the pool is admitted and waits for pages forever. Breaks L5.
    AdmitBeyondPool,
    /// vLLM #52234 (NIXL pull, `kv_load_failure_policy: fail`, v0.29.0): a KV receive
    /// failure is answered with 200 and whatever the destination pages held: SGLang's
    /// failed transfer and vLLM's failed READ alike. Breaks S3/S6.
    FailOpenOnRecvError,
    /// The GLM-5.3 configuration: a node starts with a pool smaller than its advertised
    /// context. Breaks the pre-flight rule (a config check, not a runtime invariant).
    SkipPreflight,
    /// A one-character slip in the router's abort propagation (`||` for `&&`): when a
    /// half reports, the router aborts the other half whether the report was an
    /// error or a success, so a request nothing went wrong for is answered with an
    /// error (decode is aborted once prefill's transfer succeeded). Safe (an abort
    /// always is), so no safety invariant breaks; the model checker's "an error
    /// answer has a cause" property catches it (an availability defect). Found by a
    /// mutation run, not an upstream report.
    AbortAfterSuccess,
    /// SGLang #30545 (the staging path of #19890/#22536, before that fix, merged July
    /// 2026): chunks are identified by position, `chunk_idx = start_page //
    /// full_chunk_pages`, against a uniform grid. A prefill radix-cache hit makes the
    /// first send carry the cached prefix with the first computed chunk, past one grid
    /// slot, and every later chunk's index is skewed: its KV lands at the grid slot of
    /// its index, at the wrong offset inside the room's own pages (owner and tags
    /// right, positions wrong), and the pages past the skew are never written. Needs
    /// `prefix_hit_pages` not a multiple of `chunk_pages`. Breaks S4 (the unwritten
    /// pages; detected by verification when it is on) and S3 by position (the read of
    /// a slot written for another position).
    ChunkIndexByPosition,
    /// Issue 37, class 2: SGLang #40125 (fix proposed in #40185; the Mooncake #1400
    /// `check_status` KeyError): `bootstrap_room` is a plain field of the request,
    /// and neither half checks that a room is in use. Prefill's bootstrap state is
    /// keyed by the room number alone (`MooncakeKVManager`'s bootstrap thread:
    /// `transfer_infos[room][session] = TransferInfo.from_zmq(..)`, no liveness check),
    /// so a second start for a live room takes the live room's entry over: here
    /// prefill takes the second start's request, prompt and decode node into the live
    /// room use, and decode joins it silently. Without the switch both halves refuse a
    /// start naming another request for a room use they hold (peer-refused, no page
    /// moves). The live request is then served from the other request's prompt (S10,
    /// or S4 when the lengths differ), or paired with a decode that reserved nothing.
    DuplicateRoomJoinsLive,
    /// Issue 37, class 3, the replay: the `sglang-router` policy draws a request's
    /// bootstrap room once, before its retry loop, and replays every attempt in it
    /// (kthena #1423, fixed by #1424: `SGLangConnector` stored the room it drew at
    /// construction and the router called it once per worker-pair attempt; the class of
    /// SGLang #34570, tracked in #34572: a replay of a request that may already be
    /// dispatched). A retried attempt reaches the halves as a second start for the room
    /// use the given-up attempt may still hold (a duplicate bootstrap entry), and the
    /// router, which keeps one attempt per room, forgets the first (orphaned: its
    /// halves' answers are taken for the replay's). Breaks S7 first (a room use routed
    /// for two attempts: the halves cannot tell whose metadata they hold).
    RetryReusesRoom,
    /// Issue 37, class 1: vLLM #56104 (fixed by that PR, "Fix multiple handles xfer
    /// race", merged 2026-09): a request owns one NIXL transfer handle per remote TP
    /// rank (heterogeneous TP), and on `main` before it the first handle to reach
    /// `ERR` invalidated the request's blocks and reported the failure to the
    /// scheduler at once, while the sibling handles were still posting RDMA into those
    /// blocks (a posted transfer cannot be aborted). Here: decode's pull, on the first
    /// failed READ handle of a room, fails the request and frees its pages while its
    /// sibling handles may still land. Needs `ranks` > 1. Breaks S2 (a sibling's bytes
    /// land in pages the room no longer owns), then S3 for their next owner.
    FirstFailedHandleFrees,
    /// Issue 37, class 1: Mooncake #1865 (grouped scatter RDMA reads; closed, not
    /// merged): a transfer task completes when its completed and failed slices add up
    /// to its slice count, and a slice marked failed before it was counted is counted
    /// again when its completion is, so the count is reached while a sibling slice is
    /// still in flight and the task completes (failed) early. Here: decode's pull
    /// counts a failed READ handle twice (for itself and for a sibling still pending),
    /// so the room's count completes early, the request fails and its pages are freed
    /// while the uncounted sibling still lands. Needs `ranks` > 1. Breaks S2.
    FailedSliceCountedTwice,
    /// Issue 37, class 1: Mooncake #3000 (scatter transfers in the Transfer Engine,
    /// merged as commit 98e17a2d7; the review thread on `transferScatter` before
    /// 258f10d6): validation and `openSegment()` failures were reported only through
    /// optional per-fragment callbacks, so when every fragment was rejected before
    /// submission the request list was empty and the call returned `OK` with nothing
    /// written. Here: a READ handle that failed is counted as a success, so the pull
    /// runs on a slice that was never written. Breaks S3 (decode reads slots its
    /// request never wrote) and S10.
    RejectedScatterReturnsOk,
    /// Issue 37, class 1: vLLM #50754 (open; row C2 of #48633): in push mode decode
    /// knows it has everything by counting notifications, and a prefill that cannot
    /// post one of its NIXL writes logs and moves on, so the count never reaches its
    /// number and the request hangs holding its blocks. Here, on the count kvsim's
    /// vLLM protocol keeps (decode's pull counts its READ handles, one per remote
    /// rank): a handle that failed is logged and skipped, neither counted nor failed,
    /// so the room never completes. Breaks L1 (the request is never answered by
    /// decode), L2 and L4.
    FailedHandleSkipped,
    /// vLLM #20139 (merged June 2025, `nixl_connector.py`'s `get_finished`): prefill
    /// keeps a finished request's blocks for a fixed `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`
    /// counted from the request's finish, which nothing renews (the heartbeat-renewed
    /// lease came later, #38027/#41383). When decode's queue backs up the timeout runs
    /// out before decode reads (#21570: "the D node retrieves the already released kv
    /// blocks"; #25897 raised the default from 120 s to 480 s for it). Here prefill
    /// ignores decode's heartbeats. Breaks S2 first (the READ served after the lease
    /// expired), then S3/S10 where the pages were handed on.
    LeaseIgnoresHeartbeat,
    /// vLLM #55181 (the class of wtdcode/vllm-backport#33): a NIXL transfer exception
    /// (`NIXL_ERR_REMOTE_DISCONNECT`) escapes the completion path, so the request gets
    /// no terminal transition: it stays waiting for its KV until the client gives up.
    /// Here decode drops its READ's failed completion unhandled: the request neither
    /// runs nor fails, and once it is aborted its pages wait in quarantine for a
    /// completion that already came. Breaks L3 first (then L1/L4).
    ReadErrorLeavesPending,
    /// Issue 37, class 6: kvsim's own defended engine before commit f4fe9ff (found by a
    /// peer's test under the `sglang-router` policy), and SGLang's: a prefill 400 (an
    /// over-length prompt with auto-truncation off) leaves decode waiting and the
    /// gateway with it until the request times out (the 2026-06-26 report on SGLang
    /// #29017, whose fix is the gateway's); SGLang #36033 (NIXL pushes no failure to
    /// decode, which waits out `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`, 300 s, at
    /// `c9f6b9ba25`), with the prefill-side fix proposed in #30329 (bounded per-room
    /// failure state for decodes that register after prefill failed). A room use
    /// prefill fails for a reason of its own before the transfer begins (refused at
    /// intake, its bootstrap timed out, too large for its pool) is retired silently:
    /// decode's page list, kept early or arriving later, is dropped, and nobody tells
    /// the decode node that reserved pages for it. Behind SGLang's gateway nobody
    /// cancels the other half, so decode holds its pages until its own waiting timeout
    /// (300 s upstream) and the router's retry waits as long. No safety invariant breaks: the
    /// liveness bound does (L1-L4 at the end of a run shorter than that timeout; the
    /// models with no timer longer than the run, `failed-room`).
    PrefillDropsFailedPageList,
}

impl Bug {
    pub const ALL: [Bug; Bug::COUNT] = crate::enum_table::every(Bug::VARIANTS);

    /// The switch name used on command lines and in scenario files.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A bug name that is not one of [`Bug::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown bug switch `{0}` (known: {known})", known = Bug::ALL.map(Bug::name).join(", "))]
pub struct UnknownBug(pub String);

impl std::str::FromStr for Bug {
    type Err = UnknownBug;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Bug::ALL
            .into_iter()
            .find(|b| b.name() == s || b.name().replace('-', "_") == s)
            .ok_or_else(|| UnknownBug(s.to_string()))
    }
}

/// A set of enabled bug switches. Empty (the defended engine) by default. Its bits are
/// `enumset`'s, one per [`Bug`] variant: a new switch cannot overflow or alias a bit.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct BugSet(EnumSet<Bug>);

impl BugSet {
    pub const NONE: BugSet = BugSet(EnumSet::empty());

    /// The two switches that together re-create the GLM-5.3 incident.
    pub const INCIDENT: BugSet = BugSet(enum_set!(
        Bug::GateChecksFinishedOnly | Bug::NoLengthAgreement
    ));

    pub fn with(mut self, bug: Bug) -> BugSet {
        self.insert(bug);
        // Restates the insert just above: debug only.
        debug_assert!(self.has(bug));
        self
    }

    pub fn has(self, bug: Bug) -> bool {
        self.0.contains(bug)
    }

    pub fn insert(&mut self, bug: Bug) {
        self.0.insert(bug);
    }

    pub fn is_empty(self) -> bool {
        self.0.is_empty()
    }

    /// The switches in the set, in [`Bug::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Bug> {
        self.0.iter()
    }

    /// Parse a comma-separated list (`""` and `"none"` are the empty set).
    pub fn parse(list: &str) -> Result<BugSet, UnknownBug> {
        let mut set = BugSet::NONE;
        for part in list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "none")
        {
            set.insert(part.parse()?);
        }
        Ok(set)
    }
}

impl fmt::Display for BugSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter().map(Bug::name).collect();
        f.write_str(&names.join(","))
    }
}

impl Serialize for BugSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Bug::name))
    }
}

impl<'de> Deserialize<'de> for BugSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        BugSet::parse(&names.join(",")).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for bug in Bug::ALL {
            assert_eq!(bug.name().parse::<Bug>(), Ok(bug));
        }
        let all = BugSet::parse(&Bug::ALL.map(Bug::name).join(",")).unwrap();
        assert_eq!(all.iter().count(), Bug::COUNT);
        assert!(
            all.iter().eq(Bug::ALL),
            "a set lists its switches in declaration order"
        );
        assert_eq!(BugSet::parse(&all.to_string()), Ok(all));
        assert_eq!(BugSet::parse("none"), Ok(BugSet::NONE));
        assert_eq!(
            BugSet::parse("gate-checks-finished-only,no-length-agreement"),
            Ok(BugSet::INCIDENT)
        );
    }

    #[test]
    fn unknown_names_are_refused_with_the_list() {
        let err = BugSet::parse("gate-checks-finished-only,no-such-bug").unwrap_err();
        assert_eq!(err.0, "no-such-bug");
        assert!(err.to_string().contains("admit-beyond-pool"));
    }
}
