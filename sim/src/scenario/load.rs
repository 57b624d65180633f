//! Reading a scenario: parsing TOML, loading a file, overlaying a fault spec, and
//! turning its explicit workload into [`PlannedRequest`]s. The checks a loaded
//! scenario must pass live in `validate`.

use crate::scenario::request::{
    Cancel, CancelAt, CancelHow, PlannedRequest, ReqPhase, MAX_SCENARIO_BYTES,
};
use crate::scenario::spec::{RequestSpec, Scenario, ScenarioError};
use kvsim_engine::ids::{RequestId, TenantId};
use std::path::Path;

/// The cancel an explicit request asks for (`cancel_after_us` or `cancel_on`).
fn explicit_cancel(r: &RequestSpec) -> Option<Cancel> {
    if let Some(phase) = r.cancel_on.as_deref().and_then(ReqPhase::parse) {
        return Some(Cancel {
            how: CancelHow::Disconnect,
            at: CancelAt::Phase {
                phase,
                delay_ns: r.cancel_delay_us.saturating_mul(1_000),
            },
        });
    }
    r.cancel_after_us.map(|c| Cancel {
        how: CancelHow::Disconnect,
        at: CancelAt::AfterNs(c.saturating_mul(1_000)),
    })
}

impl Scenario {
    /// Parse a scenario from TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let sc: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        sc.validate()?;
        Ok(sc)
    }

    /// Load a scenario file of at most [`MAX_SCENARIO_BYTES`]: a larger file (or a
    /// device such as `/dev/zero`) is refused after that many bytes, not read to its end.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        use std::io::Read;
        let read = |source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::open(path).map_err(read)?;
        let mut buf = Vec::new();
        f.take(MAX_SCENARIO_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(read)?;
        if buf.len() as u64 > MAX_SCENARIO_BYTES {
            return Err(ScenarioError::TooLarge {
                path: path.display().to_string(),
                limit: MAX_SCENARIO_BYTES,
            });
        }
        let text = String::from_utf8(buf).map_err(|_| ScenarioError::Parse {
            path: path.display().to_string(),
            message: "not UTF-8 text".into(),
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Lay `spec`, TOML key/value lines of `[faults]` (`pause = { count = 2, max_ms =
    /// 300 }`, `clock_skew_permille = 200`), over the scenario's faults: each key
    /// replaces the file's value. An unknown key or a bad value is refused by name,
    /// and the result must validate as a file would.
    pub fn overlay_faults(&mut self, spec: &str) -> Result<(), ScenarioError> {
        let parse = |e: String| ScenarioError::Parse {
            path: format!("--faults `{spec}`"),
            message: e,
        };
        let over: toml::Table = toml::from_str(spec).map_err(|e| parse(e.to_string()))?;
        let mut table = toml::Table::try_from(&self.faults).map_err(|e| parse(e.to_string()))?;
        table.extend(over);
        self.faults = table
            .try_into()
            .map_err(|e: toml::de::Error| parse(e.to_string()))?;
        self.fault_overlay.push(spec.to_string());
        self.validate()
    }

    /// The explicit workload as concrete requests, numbered in order.
    pub fn planned_requests(&self) -> Vec<PlannedRequest> {
        let mut out = Vec::new();
        for r in &self.requests {
            for k in 0..r.repeat {
                // Bounded by `validate`; saturating all the same.
                let at_ns = u64::from(k)
                    .saturating_mul(r.every_us)
                    .saturating_add(r.at_us)
                    .saturating_mul(1_000);
                out.push(PlannedRequest {
                    req: RequestId(out.len() as u64),
                    tenant: TenantId(r.tenant),
                    prompt_len: r.prompt_len,
                    max_new_tokens: r.max_new_tokens,
                    at_ns,
                    cancel: explicit_cancel(r),
                });
            }
        }
        out
    }
}
