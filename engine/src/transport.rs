//! The KV transports, stated once: what each one does with a KV write at the writer,
//! on the wire and at the receiver ([`Semantics`], one table row per transport). Every
//! rule that depends on the transport asks here: whether receiver software sees a
//! write before it lands (so a landing gate can exist), whether a write waits for a
//! frozen receiver, who reports a write's completion, which data faults the wire and
//! the NICs can commit. No node handler branches on a transport.
//!
//! Adding a transport is a variant of [`KvTransport`] and its row in
//! [`KvTransport::semantics`]; the world ([`crate::world::receive`] lands a delivered
//! write by the row), the drivers and the oracle follow it (docs/ARCHITECTURE.md,
//! "Adding a transport, a router policy, a protocol").

use crate::msg::Carried;
use serde::{Deserialize, Serialize};
use strum::{EnumCount, VariantArray};

/// How a KV write reaches the receiver's memory. The two transports the deployments
/// use; what each does is its [`Semantics`] row.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
pub enum KvTransport {
    /// RDMA WRITE (Mooncake, NIXL): the writer's NIC places the byte range at the
    /// address it names inside the receiver's registered memory.
    #[default]
    OneSided,
    /// A receive that the receiver's thread copies into place (kvsim's runtime over
    /// TCP).
    TwoSided,
    /// NVIDIA's NIXL library, `nixl-cu12` 1.5.1 through `nixl-sys` 1.5.2, with its UCX
    /// backend over TCP (what runs without an RDMA card; issue 41 measured it): a
    /// WRITE that the receiver's NIXL progress thread places, with no application
    /// code running there.
    Nixl,
}

/// What the receiver's software sees of a KV write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiverSees {
    /// Nothing: no receiver software runs before (or when) the bytes land, so nothing
    /// there can refuse them; the receiver learns that a transfer finished only from
    /// the writer's notification (`KvDone`), a control message like any other.
    Nothing,
    /// Every write: the receiver's thread takes each write off the wire and copies it
    /// into place, so it can check it first (the landing gate,
    /// `Defenses::landing_gate`) and refuse it.
    EveryWrite,
}

/// Who reports a KV write's completion to its writer, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletedBy {
    /// The writer's own NIC, once the receiver's NIC acknowledged placing the bytes:
    /// a completion no partition loses, with no receiver software involved.
    WriterNic,
    /// The receiver's software, after it copied the write into place (or refused it).
    ReceiverSoftware,
}

/// What happens to a KV write whose receiver's process is frozen (a pause: GC, a long
/// kernel, SIGSTOP) when it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhileFrozen {
    /// It lands at once and completes: the NIC needs no receiver software.
    Lands,
    /// It waits in the receiver's queues until the process runs again.
    Waits,
}

/// What a KV write addressed through stale metadata does: its destination tags name
/// pages of an earlier incarnation of the receiver (a page list taken before it
/// restarted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleWrite {
    /// It fails back to its writer (`WriteFailure::StaleRegistration`): the
    /// registration it names is gone, and the hardware or the receiver says so.
    FailsBack,
    /// It lands, silently, where its descriptors point in the receiver's memory: the
    /// transport checks a descriptor only against the writer's last-known copy of the
    /// receiver's metadata, and deregistering memory revokes nothing on the wire. Only
    /// the page generations the write stamps (their epoch) can tell a reader.
    Lands,
}

/// One transport's semantics, at each end of a KV write and between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Semantics {
    /// The name a scenario, a trace and the CLI use.
    pub name: &'static str,
    /// What the writer does: how the bytes leave it.
    pub at_writer: &'static str,
    /// What the receiver's software sees of a write.
    pub receiver_sees: ReceiverSees,
    /// When the bytes are visible to the receiver's reads.
    pub visible: &'static str,
    /// Who reports the write's completion to the writer.
    pub completed_by: CompletedBy,
    /// A write to a frozen receiver.
    pub while_frozen: WhileFrozen,
    /// A write to a receiver whose incarnation died: its memory registration is gone,
    /// so the write fails back to its writer with one failed completion (never lands
    /// in the restarted incarnation's memory). [`crate::world::arrival`] carries it
    /// out; every transport here behaves so.
    pub dead_receiver: &'static str,
    /// A write addressed with page tags of an earlier incarnation of its receiver
    /// (a stale registration): it fails back as a write to a dead receiver does.
    pub stale_registration: &'static str,
    /// What such a stale write does, as the world carries it out
    /// ([`crate::world::write_arrival`]).
    pub stale_write: StaleWrite,
    /// The data faults the wire and the NICs can commit on a write that lands (the
    /// completion still says success).
    pub data_faults: &'static [DataFault],
}

const ONE_SIDED: Semantics = Semantics {
    name: "one-sided",
    at_writer: "the writer's NIC reads the source pages and sends them as an RDMA WRITE \
                to the address the writer names in the receiver's registered memory",
    receiver_sees: ReceiverSees::Nothing,
    visible: "as the receiver's NIC places them; the page tag travels with the bytes, so \
              a write that lands where it should not carries the tag its writer meant, \
              and only a read-time check can notice it",
    completed_by: CompletedBy::WriterNic,
    while_frozen: WhileFrozen::Lands,
    dead_receiver: "the memory key is invalid: a remote access error at the writer",
    stale_registration: "the region was deregistered: a remote access error at the writer",
    stale_write: StaleWrite::FailsBack,
    data_faults: &DataFault::ALL,
};

const TWO_SIDED: Semantics = Semantics {
    name: "two-sided",
    at_writer: "the writer's thread reads the source pages and sends them on a \
                connection to the receiver",
    receiver_sees: ReceiverSees::EveryWrite,
    visible: "once the receiver's thread copied them into place, after its landing gate",
    completed_by: CompletedBy::ReceiverSoftware,
    while_frozen: WhileFrozen::Waits,
    dead_receiver: "the connection is gone: the write fails at the writer",
    stale_registration: "the receiver's incarnation check refuses it",
    stale_write: StaleWrite::FailsBack,
    data_faults: &DataFault::ALL,
};

/// NIXL 1.5.1 with UCX over TCP, as issue 41 measured it (two processes on one host,
/// `UCX_TLS=tcp`; docs/DECISIONS.md, "Two transports", has the NIXL column).
const NIXL: Semantics = Semantics {
    name: "nixl",
    at_writer: "the writer's agent posts a WRITE of its registered source pages to \
                descriptors in the receiver's registered memory, checked only against \
                the writer's last-known copy of the receiver's metadata (an address \
                outside it is refused locally, NIXL_ERR_NOT_FOUND), with a notification \
                tagged with the writer's agent name that the receiver pulls",
    receiver_sees: ReceiverSees::Nothing,
    visible: "as the receiver's NIXL progress thread copies them off the socket; no \
              application code runs and nothing there checks a page's owner or tag",
    completed_by: CompletedBy::WriterNic,
    while_frozen: WhileFrozen::Waits,
    dead_receiver: "the peer's process is gone: REMOTE_DISCONNECT at the writer within \
                    25-500 ms (nixl-sys reports it as a generic BackendError)",
    stale_registration: "lands silently: deregistering memory revokes nothing over TCP, \
                         and a restarted incarnation in the same process keeps the \
                         registration; only the epoch in the page tags tells a reader",
    stale_write: StaleWrite::Lands,
    data_faults: &DataFault::ALL,
};

impl KvTransport {
    pub const ALL: [KvTransport; KvTransport::COUNT] =
        crate::enum_table::every(KvTransport::VARIANTS);

    /// The transport's row of the table: the one statement of what it does.
    pub const fn semantics(self) -> &'static Semantics {
        match self {
            KvTransport::OneSided => &ONE_SIDED,
            KvTransport::TwoSided => &TWO_SIDED,
            KvTransport::Nixl => &NIXL,
        }
    }

    /// Does receiver software see a KV write before its bytes land?
    pub fn receiver_sees_writes(self) -> bool {
        self.semantics().receiver_sees == ReceiverSees::EveryWrite
    }

    /// Does `c`'s arrival at a frozen (paused) receiver wait until its process runs
    /// again? Everything does (control messages and completions sit in its receive
    /// queues), except a KV write on a transport whose writes land while the receiver
    /// is frozen ([`Semantics::while_frozen`]).
    pub fn arrival_waits_for_receiver<K>(self, c: &Carried<K>) -> bool {
        !c.is_rdma() || self.semantics().while_frozen == WhileFrozen::Waits
    }

    /// Can the wire and the NICs commit `fault` on this transport?
    pub fn suffers(self, fault: DataFault) -> bool {
        self.semantics().data_faults.contains(&fault)
    }

    pub fn name(self) -> &'static str {
        self.semantics().name
    }
}

/// What the wire or the receiving NIC gets wrong about a KV write that lands (a
/// data fault: the completion still says success, the counts still add up, only the
/// contents or the place are wrong). A driver decides *whether* (a rate, a bounded
/// budget) and then calls `world::alter` on a write
/// [`arrival`](crate::world::arrival) delivers; what each fault does is stated here
/// once, and which faults a transport can suffer is its [`Semantics::data_faults`].
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
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "kebab-case")]
pub enum DataFault {
    /// One page's payload arrives with one slot's token changed
    /// ([`KvPayload::corrupt`](crate::gpu::KvPayload::corrupt)).
    Corrupt,
    /// One page of the write lands at another page of the same node (the next page
    /// id, wrapping within the pool), under the same generation; the page it was
    /// meant for keeps what it held.
    Misdirect,
    /// The write's last page lands its leading half of slots only
    /// ([`KvPayload::tear`](crate::gpu::KvPayload::tear)); the rest keep what they held.
    Torn,
    /// The write lands as it is, and a copy of an *earlier* KV write the same node
    /// took (a retransmission from an earlier use of the room or of the page,
    /// delivered late) lands again over the newer contents: with the original's write
    /// id, destination tags (the earlier generation) and payload, as it was sent.
    /// The earlier write already completed, so the writer gets no second completion
    /// (`world::duplicate_completion`). Which earlier write: `WriteHistory::duplicate`;
    /// `world::alter` leaves the write it strikes unchanged.
    StaleDuplicate,
}

impl DataFault {
    pub const ALL: [DataFault; DataFault::COUNT] = crate::enum_table::every(DataFault::VARIANTS);

    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows agree with themselves: a receiver that sees no write cannot gate one
    /// or be the one completing it; one whose software sees every write holds it while
    /// frozen and refuses a stale one. A write may wait for a frozen receiver whose
    /// software sees nothing (NIXL: the progress thread that copies it is the frozen
    /// process's).
    #[test]
    fn each_row_is_consistent() {
        for t in KvTransport::ALL {
            let s = t.semantics();
            let software = s.receiver_sees == ReceiverSees::EveryWrite;
            assert_eq!(
                s.completed_by == CompletedBy::ReceiverSoftware,
                software,
                "{}",
                s.name
            );
            if software {
                assert_eq!(s.while_frozen, WhileFrozen::Waits, "{}", s.name);
                assert_eq!(s.stale_write, StaleWrite::FailsBack, "{}", s.name);
            }
            assert_eq!(t.receiver_sees_writes(), software);
            assert!(!s.data_faults.is_empty(), "{}", s.name);
        }
        assert_eq!(KvTransport::OneSided.name(), "one-sided");
        assert_eq!(KvTransport::TwoSided.name(), "two-sided");
        assert_eq!(KvTransport::Nixl.name(), "nixl");
    }

    /// NIXL's row is the measured one: nothing at the receiver sees a write, a stopped
    /// receiver holds it (no transport timeout), stale metadata lands.
    #[test]
    fn nixl_row_is_the_measured_one() {
        let s = KvTransport::Nixl.semantics();
        assert_eq!(s.receiver_sees, ReceiverSees::Nothing);
        assert_eq!(s.while_frozen, WhileFrozen::Waits);
        assert_eq!(s.stale_write, StaleWrite::Lands);
        assert_eq!(
            KvTransport::OneSided.semantics().stale_write,
            StaleWrite::FailsBack
        );
    }
}
