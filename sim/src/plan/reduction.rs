//! [`Reduction`]: a plan with some of its faults or requests taken away, as a
//! shrink or a replay names it. Not the drawing or the plan itself.

use crate::plan::fault::FaultKind;
use crate::scenario::ScenarioError;
use kvsim_engine::ids::RequestId;
use std::collections::BTreeSet;
use std::fmt;

/// A smaller run carved out of a seed's plan: the shrinker's output, and what
/// `--reduce` replays. Empty means the plan as drawn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reduction {
    /// Keep only these requests (by id); `None` keeps all.
    pub keep: Option<Vec<RequestId>>,
    /// Fault kinds turned off.
    pub off: BTreeSet<FaultKind>,
    /// Heal the faults this early (never later than drawn).
    pub safety_ns: Option<u64>,
}

impl Reduction {
    pub fn is_empty(&self) -> bool {
        self.keep.is_none() && self.off.is_empty() && self.safety_ns.is_none()
    }

    /// Parse `keep=0,3,7;off=loss,crash;safety-ms=1200` (any part may be left out).
    pub fn parse(spec: &str) -> Result<Reduction, ScenarioError> {
        let bad = |reason: String| ScenarioError::Invalid {
            field: "--reduce".into(),
            reason,
        };
        let mut r = Reduction::default();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, val) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            match key.trim() {
                "keep" => {
                    let mut ids = Vec::new();
                    for x in val.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                        let n: u64 = x
                            .trim_start_matches("req")
                            .parse()
                            .map_err(|_| bad(format!("`{x}` is not a request number")))?;
                        ids.push(RequestId(n));
                    }
                    ids.sort();
                    ids.dedup();
                    r.keep = Some(ids);
                }
                "off" => {
                    for x in val.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                        let k = FaultKind::parse(x).ok_or_else(|| {
                            bad(format!(
                                "unknown fault kind `{x}` (known: {})",
                                FaultKind::ALL.map(FaultKind::name).join(", ")
                            ))
                        })?;
                        r.off.insert(k);
                    }
                }
                "safety-ms" => {
                    let ms: u64 = val
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("`{val}` is not a number of milliseconds")))?;
                    r.safety_ns = Some(ms.saturating_mul(1_000_000));
                }
                other => {
                    return Err(bad(format!(
                        "unknown key `{other}` (known: keep, off, safety-ms)"
                    )))
                }
            }
        }
        Ok(r)
    }
}

impl fmt::Display for Reduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(keep) = &self.keep {
            let ids: Vec<String> = keep.iter().map(|r| r.0.to_string()).collect();
            parts.push(format!("keep={}", ids.join(",")));
        }
        if !self.off.is_empty() {
            let off: Vec<&str> = self.off.iter().map(|k| k.name()).collect();
            parts.push(format!("off={}", off.join(",")));
        }
        if let Some(ns) = self.safety_ns {
            parts.push(format!("safety-ms={}", ns / 1_000_000));
        }
        f.write_str(&parts.join(";"))
    }
}
