//! The kinds of need, their require variables, and the one way a test skips.

use crate::skips::{self, visible};

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The pinned Python clients (`openai`, `sglang-router`, `requests`).
    PyClients,
    /// NVIDIA's runtime compiler, for the CUDA kernels' compile checks.
    Nvrtc,
    /// Root, `ip`, `tc` and `nft`: the namespace fault bed.
    Netns,
    /// Command-line tools from Debian's packages (`curl`, `jq`, `chromium`) and mdBook.
    Tools,
    /// NVIDIA's NIXL wheel and a `kvsim` built with the `nixl` feature.
    Nixl,
    /// vLLM's router (`vllm-router`, pinned, under `target/vllm-router`).
    VllmRouter,
}

impl Need {
    /// The variable that turns this need's skip into a failure.
    pub fn require_var(self) -> &'static str {
        match self {
            Need::PyClients => "KVSIM_REQUIRE_PY_CLIENTS",
            Need::Nvrtc => "KVSIM_REQUIRE_NVRTC",
            Need::Netns => "KVSIM_REQUIRE_NETNS",
            Need::Tools => "KVSIM_REQUIRE_TOOLS",
            Need::Nixl => "KVSIM_REQUIRE_NIXL",
            Need::VllmRouter => "KVSIM_REQUIRE_VLLM_ROUTER",
        }
    }
}

/// Must this need be met here (its require variable, or `KVSIM_REQUIRE_ALL`, is 1)?
pub fn required(need: Need) -> bool {
    required_by(need, |var| std::env::var(var).ok())
}

/// [`required`] over any environment (`var` looks a variable up).
pub fn required_by(need: Need, var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).as_deref() == Some("1");
    set("KVSIM_REQUIRE_ALL") || set(need.require_var())
}

/// The test `test` cannot run because `why`: fails under the need's require variable;
/// otherwise prints `SKIPPED: <why> [<test>]` past the harness's capture and records
/// it for the run's closing list.
pub fn skip(test: &str, need: Need, why: &str) {
    assert!(
        !required(need),
        "{}=1 (or KVSIM_REQUIRE_ALL=1) but {why} [{test}]",
        need.require_var()
    );
    visible(&format!("SKIPPED: {why} [{test}]"));
    skips::record(test, why, false);
}

/// The test `test` does not run on this machine by design (no CUDA device on a CPU
/// machine): printed and recorded like [`skip`], marked expected, never a failure.
/// Callers that must insist on a device check `KVSIM_EXPECT_NO_GPU` themselves.
pub fn skip_expected(test: &str, why: &str) {
    visible(&format!("SKIPPED: {why} [{test}]"));
    skips::record(test, why, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_need_is_required_by_its_variable_or_by_all() {
        assert!(!required_by(Need::Netns, env(&[])));
        assert!(required_by(
            Need::Netns,
            env(&[("KVSIM_REQUIRE_NETNS", "1")])
        ));
        assert!(!required_by(
            Need::Netns,
            env(&[("KVSIM_REQUIRE_NVRTC", "1")])
        ));
        assert!(!required_by(
            Need::Netns,
            env(&[("KVSIM_REQUIRE_NETNS", "0")])
        ));
        assert!(required_by(Need::Tools, env(&[("KVSIM_REQUIRE_ALL", "1")])));
    }
}
