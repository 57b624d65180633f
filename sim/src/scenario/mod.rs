//! Scenario files: topology, engine config, workload and network, as TOML.
//!
//! A scenario is data, not code: every field is named in the file, unknown fields are
//! refused, and a value that breaks a stated relation is an error naming the field.
//! Loading never panics on a bad file.

mod load;
mod request;
mod spec;
mod validate;

pub use request::{
    canary_owner, Cancel, CancelAt, CancelHow, PlannedRequest, ReqPhase, MAX_REQUESTS,
    MAX_SCENARIO_BYTES,
};
pub use spec::{
    kv_bytes_per_page, FaultSpec, NetworkConfig, Phases, RequestSpec, RunLimits, Scenario,
    ScenarioError, SwarmSpec, TailSpec, Topology, WindowSpec, WorkloadSpec, COST_BUDGET_TOKENS,
    MAX_KV_BYTES, MAX_TIME_MS,
};

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::{RequestId, TenantId};

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
        // The transport: one-sided by default, two-sided or nixl on request, nothing else.
        assert_eq!(
            Scenario::parse(MINIMAL, "t.toml").unwrap().engine.transport,
            kvsim_engine::world::KvTransport::OneSided
        );
        let two = MINIMAL.replace(
            "[topology]",
            "[engine]\ntransport = \"two-sided\"\n[topology]",
        );
        assert_eq!(
            Scenario::parse(&two, "t.toml").unwrap().engine.transport,
            kvsim_engine::world::KvTransport::TwoSided
        );
        let bad = MINIMAL.replace("[topology]", "[engine]\ntransport = \"rdma\"\n[topology]");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("transport")
                && err.contains("one-sided")
                && err.contains("two-sided")
                && err.contains("nixl"),
            "{err}"
        );
        let bad = format!("{MINIMAL}[faults]\nstale_duplicate_write_permille = 1001\n");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("faults.stale_duplicate_write_permille") && err.contains("at most 1000"),
            "{err}"
        );
        let bad = format!("{MINIMAL}[faults]\nstale_duplicate_write_permille = -1\n");
        let err = Scenario::parse(&bad, "t.toml").unwrap_err().to_string();
        assert!(err.contains("stale_duplicate_write_permille"), "{err}");
    }

    #[test]
    fn canary_tokens_name_their_request() {
        let r = PlannedRequest {
            req: RequestId(41),
            tenant: TenantId(1),
            prompt_len: 5,
            max_new_tokens: 1,
            at_ns: 0,
            cancel: None,
        };
        for t in r.prompt() {
            assert_eq!(canary_owner(t), Some(RequestId(41)));
        }
        assert_eq!(canary_owner(0), None);
    }
}
