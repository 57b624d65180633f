//! The HTTP canary's verdict and report: the findings judged from the outcomes
//! (leaks, over-length prompts answered 200), the counts and latency percentiles, and
//! their printing and `--json` file. Running the load is [`super::http`]'s.

use crate::canary::args::CanaryArgs;
use crate::canary::limits::Limits;
use crate::canary::plan::{describe, Outcome};
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::BTreeMap;

/// What the HTTP canary judged: each line names the requests involved.
pub(super) struct Findings {
    /// A reply carried another request's marker.
    leaks: Vec<String>,
    /// An over-length prompt (past the context) answered 200: the incident.
    over_ok: Vec<String>,
    /// A prompt past the smallest pool but within the context answered 200 (a warning).
    over_pool: Vec<String>,
}

impl Findings {
    pub(super) fn judge(all: &[Outcome], limits: &Limits) -> Findings {
        let owner: BTreeMap<&str, &Outcome> =
            all.iter().map(|o| (o.plan.marker.as_str(), o)).collect();
        let mut f = Findings {
            leaks: Vec::new(),
            over_ok: Vec::new(),
            over_pool: Vec::new(),
        };
        for o in all {
            for m in &o.foreign {
                let from = owner
                    .get(m.as_str())
                    .map(|f| describe(f))
                    .unwrap_or(format!("{m} (not sent by this run)"));
                f.leaks.push(format!(
                    "LEAK: reply to {} carried marker {m} of {from}",
                    describe(o)
                ));
            }
            if o.plan.over_length && o.status == 200 {
                if o.plan.tokens as u64 > limits.context {
                    f.over_ok
                        .push(format!("OVER-LENGTH ANSWERED 200: {}", describe(o)));
                } else {
                    f.over_pool.push(format!(
                        "WARNING: a prompt over the smallest pool ({} tokens) answered 200: {}",
                        limits.pool.unwrap_or(0),
                        describe(o)
                    ));
                }
            }
        }
        f
    }

    pub(super) fn failed(&self) -> bool {
        !self.leaks.is_empty() || !self.over_ok.is_empty()
    }
}

/// The outcomes' counts by status (`disconnected`, `transport-error`, or the HTTP
/// status) and the answered requests' latency percentiles (p50, p90, p99, in ms).
pub(super) struct Tally {
    counts: BTreeMap<String, usize>,
    answered: usize,
    pct: [f64; 3],
}

impl Tally {
    pub(super) fn of(all: &[Outcome]) -> Tally {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for o in all {
            let k = match o.status {
                0 => "disconnected".to_string(),
                1 => "transport-error".to_string(),
                s => s.to_string(),
            };
            *counts.entry(k).or_default() += 1;
        }
        let mut lat: Vec<f64> = all
            .iter()
            .filter(|o| o.status >= 100)
            .map(|o| o.latency.as_secs_f64() * 1e3)
            .collect();
        lat.sort_by(|x, y| x.total_cmp(y));
        let pct = |p: f64| {
            if lat.is_empty() {
                0.0
            } else {
                lat[((lat.len() as f64 - 1.0) * p).round() as usize]
            }
        };
        Tally {
            answered: lat.len(),
            pct: [pct(0.5), pct(0.9), pct(0.99)],
            counts,
        }
    }
}

/// The HTTP canary's report on stdout.
pub(super) fn print_report(all: &[Outcome], wall: f64, limits: &Limits, t: &Tally, f: &Findings) {
    println!(
        "canary: {} requests ({} over-length) in {wall:.2} s = {:.0} req/s; status {}",
        all.len(),
        all.iter().filter(|o| o.plan.over_length).count(),
        t.answered as f64 / wall.max(1e-9),
        t.counts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "canary: latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        t.pct[0], t.pct[1], t.pct[2]
    );
    if let Some(p) = limits.pool {
        println!(
            "canary: context {} tokens, smallest pool {p} tokens: over-length prompts \
             alternate {} and {} tokens",
            limits.context,
            limits.context + 1,
            p + 1
        );
    }
    for l in f.leaks.iter().chain(&f.over_ok).chain(&f.over_pool) {
        println!("{l}");
    }
    println!(
        "canary: {}",
        if f.failed() {
            format!(
                "FAIL ({} foreign markers, {} over-length prompts answered 200)",
                f.leaks.len(),
                f.over_ok.len()
            )
        } else {
            "PASS (no reply carried another request's marker; every over-length prompt refused)"
                .into()
        }
    );
}

/// `--json`: the report as one JSON object.
pub(super) fn write_json(
    path: &std::path::Path,
    a: &CanaryArgs,
    (all, wall): (&[Outcome], f64),
    limits: &Limits,
    t: &Tally,
    f: &Findings,
) -> Result<()> {
    let report = json!({
        "url": a.url, "seed": a.seed, "context": limits.context,
        "requests": all.len(), "wall_s": wall,
        "status": t.counts,
        "latency_ms": {"p50": t.pct[0], "p90": t.pct[1], "p99": t.pct[2]},
        "leaks": f.leaks, "over_length_answered_200": f.over_ok,
        "over_pool_answered_200": f.over_pool, "smallest_pool": limits.pool,
        "pass": !f.failed(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("--json {}", path.display()))
}
