//! The canary's plan and its record: each request's marker, length and disconnect
//! point drawn from the seed ([`Round`]), what happened to it ([`Outcome`]) and the
//! markers a reply carried. Sending is [`super::phase`]'s and the transports'.

use kvsim_engine::gpu::splitmix64 as mix;
use std::collections::BTreeSet;
use std::time::Duration;

/// One planned request.
#[derive(Clone, Debug)]
pub(super) struct Planned {
    pub(super) n: usize,
    pub(super) marker: String,
    pub(super) over_length: bool,
    /// Disconnect after this many milliseconds instead of reading the reply.
    pub(super) disconnect_ms: Option<u64>,
    pub(super) tokens: usize,
}

/// What happened to one request.
#[derive(Clone, Debug)]
pub(super) struct Outcome {
    pub(super) plan: Planned,
    /// 0: disconnected on purpose; 1: transport error.
    pub(super) status: u16,
    pub(super) latency: Duration,
    /// The markers of other requests the reply carried, each once, in order.
    pub(super) foreign: Vec<String>,
}

/// The seeded plan of one round: `requests` short prompts, then `over_length` prompts
/// past the server's limit; each request's marker and disconnect point are drawn from
/// the seed and its number, so a seed names the whole load.
pub(super) struct Round<'a> {
    pub(super) seed: u64,
    pub(super) round: u64,
    pub(super) disconnect_rate: f64,
    /// The prompt length of the `i`-th short (`false`) or over-length (`true`)
    /// request, given its draw.
    pub(super) tokens: &'a dyn Fn(bool, usize, u64) -> usize,
}

impl Round<'_> {
    /// The next request, number `*n` of the run.
    fn plan(&self, n: &mut usize, over: bool, i: usize) -> Planned {
        let r = mix(self.seed ^ mix(*n as u64 + 1));
        let kind = if over { "long" } else { "short" };
        let p = Planned {
            n: *n,
            marker: format!("CANARY-{kind}{i}r{}-{:08x}", self.round, r as u32),
            over_length: over,
            disconnect_ms: ((mix(r) % 1_000_000) as f64 / 1e6 < self.disconnect_rate)
                .then_some((r >> 40) % 20),
            tokens: (self.tokens)(over, i, r),
        };
        *n += 1;
        p
    }

    /// `short` short requests and `long` over-length ones.
    pub(super) fn plans(
        &self,
        n: &mut usize,
        short: usize,
        long: usize,
    ) -> (Vec<Planned>, Vec<Planned>) {
        let s = (0..short).map(|i| self.plan(n, false, i)).collect();
        let l = (0..long).map(|i| self.plan(n, true, i)).collect();
        (s, l)
    }
}

fn markers_in(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|w| w.starts_with("CANARY-"))
        .collect()
}

/// The markers in `text` other than `own`, each once.
pub(super) fn foreign_markers(text: &str, own: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    markers_in(text)
        .into_iter()
        .filter(|m| *m != own && seen.insert(*m))
        .map(str::to_string)
        .collect()
}

pub(super) fn describe(o: &Outcome) -> String {
    format!(
        "request #{} ({}, {} tokens, marker {}, status {})",
        o.plan.n,
        if o.plan.over_length {
            "over-length"
        } else {
            "short"
        },
        o.plan.tokens,
        o.plan.marker,
        o.status
    )
}
