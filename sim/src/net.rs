//! The network model: per-message fault decisions, drawn from seeded streams.
//!
//! It decides, when a node sends, what the network does with the message; the
//! [`crate::simulator::Simulator`] carries the decision out. Two classes of traffic, as in a
//! disaggregated deployment:
//!
//! - **KV writes** (`Msg::KvWrite`) ride an RDMA reliable connection: a write may be
//!   slow or land very late, or fail (not applied; its sender then gets exactly one
//!   `WriteDone { ok: false }`, which the world synthesises in place of delivery), but
//!   it is never lost silently and never duplicated. Completions (`WriteDone`) are
//!   never lost either.
//! - **Control messages** (everything else between nodes) may be held back, lost,
//!   duplicated, and reordered by jitter.
//!
//! The client's link to the router is the test harness and is never faulted. After
//! the faults heal, every decision is "deliver after the base latency". Partitions
//! and crashes are not decided here: they depend on the instant of delivery and the
//! world checks them then. Each decision kind draws from its own stream, a fixed
//! number of times per message, so turning one kind off leaves the others' draws as
//! they were for the same sequence of messages.

use crate::plan::NetParams;
use crate::rng::{self, between, chance, log_between, Component};
use kvsim_engine::world::DataFault;

/// The longest a stale duplicate trails the write it lands over.
pub const STALE_DUPLICATE_MAX_NS: u64 = 100_000_000;

/// How long after the write it follows a stale duplicate lands, from the salt drawn
/// with the fault: spread over orders of magnitude from 1 µs to
/// [`STALE_DUPLICATE_MAX_NS`] (a decade drawn evenly, then a step within it), so that
/// some land while the newer write's transfer is still under way (before decode's
/// checksum) and some while its request reads the page.
pub fn stale_duplicate_delay(salt: u64) -> u64 {
    let decade = (salt >> 16) % 5; // 1 µs, 10 µs, 100 µs, 1 ms, 10 ms
    let step = 1 + (salt >> 24) % 10;
    (1_000 * 10u64.pow(decade as u32) * step).min(STALE_DUPLICATE_MAX_NS)
}

/// What happens to one control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlFate {
    /// Delivered after this long; `Some(d2)` also delivers a duplicate after `d2`.
    Deliver {
        after_ns: u64,
        dup_ns: Option<u64>,
    },
    Lost,
}

/// What happens to one KV write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFate {
    /// Lands after this long; `late` when it is one of the very late ones; `data`: a
    /// data fault it suffers as it lands, with the salt that picks the page and slot.
    Land {
        after_ns: u64,
        late: bool,
        data: Option<(DataFault, u64)>,
    },
    /// Fails: not applied; the failed completion reaches the sender after this long.
    Fail { after_ns: u64 },
}

/// The per-message decision streams of one run.
pub struct NetModel {
    p: NetParams,
    healed: bool,
    delay: rng::Rng,
    loss: rng::Rng,
    dup: rng::Rng,
    jitter: rng::Rng,
    slow: rng::Rng,
    late: rng::Rng,
    fail: rng::Rng,
    data: rng::Rng,
    stale: rng::Rng,
    client: rng::Rng,
}

impl NetModel {
    pub fn new(seed: u64, p: NetParams) -> Self {
        NetModel {
            p,
            healed: false,
            delay: rng::stream(seed, Component::NetDelay),
            loss: rng::stream(seed, Component::NetLoss),
            dup: rng::stream(seed, Component::NetDuplicate),
            jitter: rng::stream(seed, Component::NetJitter),
            slow: rng::stream(seed, Component::WriteSlow),
            late: rng::stream(seed, Component::WriteLate),
            fail: rng::stream(seed, Component::WriteFail),
            data: rng::stream(seed, Component::WriteData),
            stale: rng::stream(seed, Component::StaleReplay),
            client: rng::stream(seed, Component::ClientRoom),
        }
    }

    pub fn params(&self) -> &NetParams {
        &self.p
    }

    /// From now on every message is delivered after the base latency.
    pub fn heal(&mut self) {
        self.healed = true;
    }

    pub fn healed(&self) -> bool {
        self.healed
    }

    /// The fixed latency of an unfaulted link (the client's, and every link after
    /// the faults healed).
    pub fn latency_ns(&self) -> u64 {
        self.p.latency_ns
    }

    fn jitter(&mut self) -> u64 {
        if self.p.jitter_ns == 0 {
            0
        } else {
            between(&mut self.jitter, 0, self.p.jitter_ns)
        }
    }

    /// Decide a control message's fate.
    pub fn control(&mut self, faulty: bool) -> ControlFate {
        let base = self.p.latency_ns;
        if self.healed || !faulty {
            return ControlFate::Deliver {
                after_ns: base,
                dup_ns: None,
            };
        }
        let lost = chance(&mut self.loss, self.p.loss_permille);
        let dup = chance(&mut self.dup, self.p.duplicate_permille);
        let held = chance(&mut self.delay, self.p.delay_permille);
        let hold_ns = if held {
            log_between(&mut self.delay, 1_000, self.p.delay_max_ns.max(1_000))
        } else {
            0
        };
        let j1 = self.jitter();
        let j2 = self.jitter();
        if lost {
            return ControlFate::Lost;
        }
        ControlFate::Deliver {
            after_ns: base + j1 + hold_ns,
            dup_ns: dup.then_some(base + j2 + hold_ns / 2),
        }
    }

    /// A room number is reused: redeliver its previous use's control messages now?
    pub fn stale_replay(&mut self) -> bool {
        !self.healed && chance(&mut self.stale, self.p.stale_replay_permille)
    }

    /// A room use was routed: does a client supply its room for a request of its own?
    pub fn client_room(&mut self) -> bool {
        !self.healed && chance(&mut self.client, self.p.client_room_permille)
    }

    /// Decide a KV write's fate.
    pub fn write(&mut self) -> WriteFate {
        let base = self.p.latency_ns;
        if self.healed {
            return WriteFate::Land {
                after_ns: base,
                late: false,
                data: None,
            };
        }
        let fail = chance(&mut self.fail, self.p.write_fail_permille);
        let slow = chance(&mut self.slow, self.p.slow_write_permille);
        let slow_ns = log_between(&mut self.slow, 1_000, self.p.slow_write_max_ns.max(1_000));
        let late = chance(&mut self.late, self.p.late_write_permille);
        let late_ns = between(
            &mut self.late,
            self.p.late_write_max_ns / 4,
            self.p.late_write_max_ns.max(1),
        );
        let mut after_ns = base;
        if slow {
            after_ns += slow_ns;
        }
        if late {
            after_ns += late_ns;
        }
        // Data faults draw from their own stream, only when one is on, so runs without
        // them keep every other draw.
        let p = &self.p;
        let data = if p.corrupt_write_permille
            + p.misdirect_write_permille
            + p.torn_write_permille
            + p.stale_duplicate_write_permille
            > 0
        {
            // A kind at 0 draws nothing, so adding one left the others' draws as
            // they were.
            let kinds = [
                (DataFault::Corrupt, p.corrupt_write_permille),
                (DataFault::Misdirect, p.misdirect_write_permille),
                (DataFault::Torn, p.torn_write_permille),
                (DataFault::StaleDuplicate, p.stale_duplicate_write_permille),
            ];
            let hits: Vec<DataFault> = kinds
                .into_iter()
                .filter(|(_, permille)| chance(&mut self.data, *permille))
                .map(|(k, _)| k)
                .collect();
            let salt = between(&mut self.data, 0, u64::MAX - 1);
            hits.first().map(|k| (*k, salt))
        } else {
            None
        };
        if fail {
            // The sender's NIC reports the error after the transport's retries.
            WriteFate::Fail { after_ns }
        } else {
            WriteFate::Land {
                after_ns,
                late,
                data,
            }
        }
    }
}
