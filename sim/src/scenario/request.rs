//! A request as a run plans it: [`PlannedRequest`], the [`ReqPhase`]s of its life
//! and the [`Cancel`] its client may make at one. Not the scenario sections that
//! ask for them (`spec`).

use kvsim_engine::ids::{RequestId, TenantId, Token};
use serde::{Deserialize, Serialize};

/// A point in a request's life at which its client may give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReqPhase {
    /// Prefill admitted its half (a sender exists).
    PrefillAdmitted,
    /// Decode reserved its pages and announced them.
    DecodeReserved,
    /// Prefill issued its first KV write.
    KvSent,
    /// A KV write landed in decode's pool.
    KvLanded,
    /// Decode accepted the transfer.
    TransferAccepted,
    /// Decode ran step `n` of the reply.
    Decoding(u32),
    /// Prefill gave its terminal answer.
    PrefillAnswered,
    /// The client already has its answer (a disconnect after the fact).
    Answered,
}

impl ReqPhase {
    /// The phases a drawn cancel picks from (`Decoding` with its step drawn).
    pub const ALL: [ReqPhase; 8] = [
        ReqPhase::PrefillAdmitted,
        ReqPhase::DecodeReserved,
        ReqPhase::KvSent,
        ReqPhase::KvLanded,
        ReqPhase::TransferAccepted,
        ReqPhase::Decoding(0),
        ReqPhase::PrefillAnswered,
        ReqPhase::Answered,
    ];

    /// Parse a scenario name: `prefill-admitted`, `decode-reserved`, `kv-sent`,
    /// `kv-landed`, `transfer-accepted`, `decoding` or `decoding:N`, `prefill-answered`,
    /// `answered`.
    pub fn parse(s: &str) -> Option<ReqPhase> {
        let s = s.trim();
        if let Some(n) = s.strip_prefix("decoding:") {
            return n.parse().ok().map(ReqPhase::Decoding);
        }
        Some(match s {
            "prefill-admitted" => ReqPhase::PrefillAdmitted,
            "decode-reserved" => ReqPhase::DecodeReserved,
            "kv-sent" => ReqPhase::KvSent,
            "kv-landed" => ReqPhase::KvLanded,
            "transfer-accepted" => ReqPhase::TransferAccepted,
            "decoding" => ReqPhase::Decoding(0),
            "prefill-answered" => ReqPhase::PrefillAnswered,
            "answered" => ReqPhase::Answered,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ReqPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReqPhase::PrefillAdmitted => f.write_str("prefill-admitted"),
            ReqPhase::DecodeReserved => f.write_str("decode-reserved"),
            ReqPhase::KvSent => f.write_str("kv-sent"),
            ReqPhase::KvLanded => f.write_str("kv-landed"),
            ReqPhase::TransferAccepted => f.write_str("transfer-accepted"),
            ReqPhase::Decoding(n) => write!(f, "decoding:{n}"),
            ReqPhase::PrefillAnswered => f.write_str("prefill-answered"),
            ReqPhase::Answered => f.write_str("answered"),
        }
    }
}

/// How a client gives up on a request (part of the trace schema).
pub use kvsim_oracle::schema::CancelHow;

/// When a client gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelAt {
    /// This long after submitting.
    AfterNs(u64),
    /// When the request reaches `phase`, `delay_ns` later.
    Phase { phase: ReqPhase, delay_ns: u64 },
}

/// A planned client abort or disconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub how: CancelHow,
    pub at: CancelAt,
}

impl std::fmt::Display for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.how {
            CancelHow::Abort => "abort",
            CancelHow::Disconnect => "disconnect",
        };
        match self.at {
            CancelAt::AfterNs(ns) => write!(f, "{how} {}us after submit", ns / 1_000),
            CancelAt::Phase { phase, delay_ns } => {
                write!(f, "{how} {}us after {phase}", delay_ns / 1_000)
            }
        }
    }
}

/// One concrete request of a run, with its canary prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    pub at_ns: u64,
    pub cancel: Option<Cancel>,
}

/// The largest scenario file [`Scenario::load`] reads, in bytes (the largest shipped
/// scenario is a few kilobytes).
///
/// [`Scenario::load`]: crate::scenario::Scenario::load
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// The most requests a run may hold: canary tokens carry the request number in 16 bits.
pub use kvsim_oracle::canary::MAX_REQUESTS;

impl PlannedRequest {
    /// The canary prompt: token `i` names this request and its position, so any token
    /// echoed back identifies whose prompt it came from (`kvsim_oracle::canary`).
    pub fn prompt(&self) -> Vec<Token> {
        kvsim_oracle::canary::prompt(self.req, self.prompt_len)
    }
}

/// Which request's prompt a token came from (`None` for placeholder tokens).
pub use kvsim_oracle::canary::owner as canary_owner;
