//! The KV transports, stated once: how a KV write reaches the receiver's memory and
//! what the receiver's software sees of it. Every rule that depends on the transport
//! asks here; no handler branches on a transport.

use crate::msg::Msg;
use serde::{Deserialize, Serialize};

/// How a KV write reaches the receiver's memory. The two transports the deployments
/// use, stated once (docs/ARCHITECTURE.md, "Two transports").
#[derive(
    Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum KvTransport {
    /// RDMA WRITE (Mooncake, NIXL): the writer's NIC places the byte range at the
    /// address it names inside the receiver's registered memory; no receiver software
    /// runs before the bytes land, so nothing there can refuse them. The completion
    /// goes to the writer only; the receiver learns that a transfer finished from a
    /// separate notification (`KvDone`), a control message like any other (lost, late,
    /// duplicated, reordered with respect to the writes). The page tag travels with the
    /// write's bytes, so a write that lands where it should not carries the tag its
    /// writer meant, and only the read-time check can notice it.
    #[default]
    OneSided,
    /// A receive that the receiver's thread copies into place (kvsim's runtime over
    /// TCP): the receiver's software sees each write before it lands and can refuse it
    /// (the landing gate, `Defenses::landing_gate`).
    TwoSided,
}

impl KvTransport {
    /// Does receiver software see a KV write before its bytes land?
    pub fn receiver_sees_writes(self) -> bool {
        matches!(self, KvTransport::TwoSided)
    }

    /// Does `msg`'s arrival at a frozen (paused) receiver wait until its process runs
    /// again? Everything does (control messages and completions sit in its receive
    /// queues), except a KV write on a one-sided transport: the NIC places its bytes
    /// and reports its completion with no receiver software running.
    pub fn arrival_waits_for_receiver<K>(self, msg: &Msg<K>) -> bool {
        !matches!(msg, Msg::KvWrite { .. }) || self.receiver_sees_writes()
    }

    pub fn name(self) -> &'static str {
        match self {
            KvTransport::OneSided => "one-sided",
            KvTransport::TwoSided => "two-sided",
        }
    }
}
