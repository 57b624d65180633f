//! The invariants (`docs/ARCHITECTURE.md`, "Invariants the oracle judges"), as values.
//!
//! The engine reports a broken local invariant (a pool whose partition no longer adds
//! up) as a [`Violation`]; the simulator and the model checker report the global ones
//! with the same type, so every tool names a failure the same way.

use serde::{Deserialize, Serialize};
use std::fmt;
use strum::{EnumCount, VariantArray};

/// One invariant (S1-S10 safety, L1-L6 liveness).
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
)]
pub enum Invariant {
    S1,
    S2,
    S3,
    S4,
    S5,
    S6,
    S7,
    S8,
    S9,
    S10,
    L1,
    L2,
    L3,
    L4,
    L5,
    L6,
}

impl Invariant {
    pub const ALL: [Invariant; Invariant::COUNT] = crate::enum_table::every(Invariant::VARIANTS);

    /// The one-line statement of the invariant.
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::S1 => "partition: every page is free, owned by one request, or quarantined",
            Invariant::S2 => "no write after free: KV moves only through pages its room still owns",
            Invariant::S3 => "isolation: decode attends only over slots its own request wrote",
            Invariant::S4 => "length agreement: prefill and decode agree on tokens and pages",
            Invariant::S5 => "rejected means retired: no sender, receiver, pages or batch",
            Invariant::S6 => "one honest answer: exactly one terminal response, errors stay errors",
            Invariant::S7 => "metadata integrity: decode commits only its own room's metadata",
            Invariant::S8 => "free discipline: only the owner frees a page, once",
            Invariant::S9 => "release after drain: quarantine ends only after every write drained",
            Invariant::S10 => "reply correctness: a 200 carries exactly the tokens echo attention over the request's own prompt yields",
            Invariant::L1 => "every request terminates on both sides",
            Invariant::L2 => "every room is cleared",
            Invariant::L3 => "quarantine empties",
            Invariant::L4 => "at quiescence every pool is full again",
            Invariant::L5 => "no request larger than the pool is admitted",
            Invariant::L6 => "bounded cleanup: after a request's answer every node stops work for it and lets its pages go within the stated bound",
        }
    }

    /// Parse "S3" or "s3".
    pub fn parse(s: &str) -> Option<Invariant> {
        Invariant::ALL
            .into_iter()
            .find(|i| i.to_string().eq_ignore_ascii_case(s.trim()))
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A broken invariant with a sentence saying where and how.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: Invariant, detail: impl Into<String>) -> Self {
        Violation {
            invariant,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.invariant,
            self.invariant.statement(),
            self.detail
        )
    }
}
