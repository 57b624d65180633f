//! What a run hands out besides its nodes: the replies clients received, the
//! counters of what the faults did, and the sink a run's trace goes to. Plain
//! data: nothing here drives a run.

use kvsim_engine::ids::Token;
use kvsim_engine::msg::Status;
use kvsim_oracle::schema::Entry;

/// A reply as the client received it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClientReply {
    pub status: Status,
    pub tokens: Vec<Token>,
}

/// Counters of what the faults did in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultStats {
    pub messages: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub dropped: u64,
    pub writes: u64,
    pub writes_failed: u64,
    pub writes_late: u64,
    pub writes_flushed: u64,
    pub crashes: u64,
    /// Pauses that froze a live node.
    pub pauses: u64,
    pub cancels: u64,
    /// Engine paths hit and cancel phases fired (the sweep's coverage summary).
    pub coverage: crate::coverage::run::RunCoverage,
    /// KV writes that landed with a data fault (corrupted, misdirected, torn), and
    /// stale duplicates that landed (delivered to their node; the gate may refuse them).
    pub data_faults: u64,
    /// Of those: corrupted, misdirected and torn writes, and stale duplicates.
    pub corrupted: u64,
    pub misdirected: u64,
    pub torn: u64,
    pub stale_duplicates: u64,
    /// Control messages of an earlier use redelivered at a room number's reuse (also
    /// counted in `duplicated`).
    pub stale_replayed: u64,
    /// Start pairs a client sent for a live room use of another request.
    pub client_rooms: u64,
}

/// Where a run's trace goes besides the oracle.
pub trait TraceSink {
    fn line(&mut self, line: &str);
    /// An entry: its JSON line, unless the sink reads entries as they are (an audit
    /// handed the run in memory).
    fn entry(&mut self, e: &Entry) {
        self.line(&kvsim_oracle::schema::entry_line(e));
    }
}

impl TraceSink for Vec<String> {
    fn line(&mut self, line: &str) {
        self.push(line.to_string());
    }
}
