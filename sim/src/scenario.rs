//! Scenario files: topology, engine config, workload and network, as TOML.
//!
//! A scenario is data, not code: every field is named in the file, unknown fields are
//! refused, and a value that breaks a stated relation is an error naming the field.
//! Loading never panics on a bad file.

use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::{RequestId, TenantId, Token};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A whole scenario file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A short name, used in reports and replay commands.
    pub name: String,
    /// What the scenario re-creates, in a sentence or two.
    #[serde(default)]
    pub description: String,
    /// The default seed (a command line `--seed` overrides it).
    #[serde(default)]
    pub seed: u64,
    /// The engine configuration shared by all nodes (defenses, bug switches, limits).
    #[serde(default)]
    pub engine: EngineConfig,
    pub topology: Topology,
    #[serde(default)]
    pub network: NetworkConfig,
    /// Explicit requests, in the order listed.
    #[serde(default)]
    pub requests: Vec<RequestSpec>,
    /// Limits on a run.
    #[serde(default)]
    pub run: RunLimits,
}

/// Nodes and their pool sizes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Pool size in pages of each prefill node (one entry per node).
    pub prefill_pool_pages: Vec<u32>,
    /// Pool size in pages of each decode node (one entry per node).
    pub decode_pool_pages: Vec<u32>,
}

/// The network between nodes: FIFO per link with a fixed latency.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    pub latency_us: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig { latency_us: 50 }
    }
}

/// Bounds on one run (a limit on everything).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunLimits {
    /// Most events one run may process before it is declared stuck.
    pub max_events: u64,
    /// Simulated time after which the run is declared stuck, in milliseconds.
    pub max_time_ms: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_events: 5_000_000,
            max_time_ms: 600_000,
        }
    }
}

/// One request (or `repeat` identical ones) of the workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    pub tenant: u32,
    pub prompt_len: u64,
    #[serde(default = "default_new_tokens")]
    pub max_new_tokens: u32,
    /// Submit time, in microseconds of simulated time.
    #[serde(default)]
    pub at_us: u64,
    /// Submit this many copies, `every_us` apart.
    #[serde(default = "one")]
    pub repeat: u32,
    #[serde(default)]
    pub every_us: u64,
    /// The client disconnects this long after submitting (none if absent).
    #[serde(default)]
    pub cancel_after_us: Option<u64>,
}

fn default_new_tokens() -> u32 {
    16
}
fn one() -> u32 {
    1
}

/// A scenario that cannot be loaded or run, naming the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario {path}: {message}")]
    Parse { path: String, message: String },
    #[error("scenario field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    #[error("scenario field `engine`: {0}")]
    Engine(#[from] kvsim_engine::config::ConfigError),
}

/// One concrete request of a run, with its canary prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    pub req: RequestId,
    pub tenant: TenantId,
    pub prompt_len: u64,
    pub max_new_tokens: u32,
    pub at_ns: u64,
    pub cancel_at_ns: Option<u64>,
}

/// The most requests a run may hold: canary tokens carry the request number in 16 bits.
pub const MAX_REQUESTS: usize = 0xFFFF;

impl PlannedRequest {
    /// The canary id of this request (never 0: token 0 is the placeholder).
    pub fn canary(&self) -> u32 {
        (self.req.0 as u32) + 1
    }

    /// The canary prompt: token `i` names this request and its position, so any token
    /// echoed back identifies whose prompt it came from.
    pub fn prompt(&self) -> Vec<Token> {
        let c = self.canary() << 16;
        (0..self.prompt_len)
            .map(|i| c | (i as u32 & 0xFFFF))
            .collect()
    }
}

/// Which request's prompt a token came from (`None` for placeholder tokens).
pub fn canary_owner(token: Token) -> Option<RequestId> {
    let c = token >> 16;
    (c != 0).then(|| RequestId(u64::from(c) - 1))
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

    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Check every relation the engine config does not cover.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.engine.validate()?;
        let t = &self.topology;
        if t.prefill_pool_pages.is_empty() || t.prefill_pool_pages.len() > 64 {
            return Err(Self::invalid(
                "topology.prefill_pool_pages",
                "needs 1 to 64 nodes",
            ));
        }
        if t.decode_pool_pages.is_empty() || t.decode_pool_pages.len() > 64 {
            return Err(Self::invalid(
                "topology.decode_pool_pages",
                "needs 1 to 64 nodes",
            ));
        }
        for (i, &p) in t
            .prefill_pool_pages
            .iter()
            .chain(&t.decode_pool_pages)
            .enumerate()
        {
            if p == 0 || p > 1 << 24 {
                return Err(Self::invalid(
                    format!("topology pool #{i}"),
                    format!("{p} pages: a pool has 1 to 16777216 pages"),
                ));
            }
        }
        let mut total = 0usize;
        for (i, r) in self.requests.iter().enumerate() {
            let f = |name: &str| format!("requests[{i}].{name}");
            if r.prompt_len == 0 || r.prompt_len > 1 << 24 {
                return Err(Self::invalid(
                    f("prompt_len"),
                    "must be 1 to 16777216 tokens",
                ));
            }
            if r.max_new_tokens == 0 {
                return Err(Self::invalid(f("max_new_tokens"), "must be at least 1"));
            }
            if r.repeat == 0 {
                return Err(Self::invalid(f("repeat"), "must be at least 1"));
            }
            total += r.repeat as usize;
        }
        if total > MAX_REQUESTS {
            return Err(Self::invalid(
                "requests",
                format!("{total} requests; at most {MAX_REQUESTS}"),
            ));
        }
        if self.run.max_events == 0 {
            return Err(Self::invalid("run.max_events", "must be at least 1"));
        }
        Ok(())
    }

    /// Run the pre-flight rule on every node, naming the node.
    pub fn preflight(&self) -> Result<(), ScenarioError> {
        for (i, &p) in self.topology.prefill_pool_pages.iter().enumerate() {
            self.engine.preflight(&format!("prefill node #{i}"), p)?;
        }
        for (i, &p) in self.topology.decode_pool_pages.iter().enumerate() {
            self.engine.preflight(&format!("decode node #{i}"), p)?;
        }
        Ok(())
    }

    /// The explicit workload as concrete requests, numbered in order.
    pub fn planned_requests(&self) -> Vec<PlannedRequest> {
        let mut out = Vec::new();
        for r in &self.requests {
            for k in 0..r.repeat {
                let at_ns = (r.at_us + u64::from(k) * r.every_us) * 1_000;
                out.push(PlannedRequest {
                    req: RequestId(out.len() as u64),
                    tenant: TenantId(r.tenant),
                    prompt_len: r.prompt_len,
                    max_new_tokens: r.max_new_tokens,
                    at_ns,
                    cancel_at_ns: r.cancel_after_us.map(|c| at_ns + c * 1_000),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "t"
[topology]
prefill_pool_pages = [16]
decode_pool_pages = [16]
[[requests]]
tenant = 1
prompt_len = 10
"#;

    #[test]
    fn minimal_parses_with_defaults() {
        let sc = Scenario::parse(MINIMAL, "t.toml").unwrap();
        assert_eq!(sc.requests[0].max_new_tokens, 16);
        assert_eq!(sc.planned_requests().len(), 1);
    }

    #[test]
    fn unknown_field_is_named() {
        let bad = MINIMAL.replace("prompt_len = 10", "prompt_len = 10\nprompt_lenght = 3");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("prompt_lenght"), "{err}");
    }

    #[test]
    fn missing_field_is_named() {
        let bad = MINIMAL.replace("decode_pool_pages = [16]", "");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("decode_pool_pages"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let bad = MINIMAL.replace("prompt_len = 10", "prompt_len = 0");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("requests[0].prompt_len"), "{err}");
        let bad = MINIMAL.replace("[topology]", "[engine]\nchunk_pages = 0\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("chunk_pages"), "{err}");
        let bad = MINIMAL.replace("[topology]", "[engine]\nbugs = [\"no-such\"]\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("no-such"), "{err}");
    }

    #[test]
    fn canary_tokens_name_their_request() {
        let r = PlannedRequest {
            req: RequestId(41),
            tenant: TenantId(1),
            prompt_len: 5,
            max_new_tokens: 1,
            at_ns: 0,
            cancel_at_ns: None,
        };
        for t in r.prompt() {
            assert_eq!(canary_owner(t), Some(RequestId(41)));
        }
        assert_eq!(canary_owner(0), None);
    }
}
