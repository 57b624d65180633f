//! Every pinned version the tests install, in one place. `.ci/run` and `cargo xtask
//! setup` install exactly these; a test that installs on first use does too.

/// The Python packages of the clients' virtual environment (`target/pyclients`):
/// the official `openai` client (tests/http_front.rs), SGLang's router (the Rust
/// gateway wheel; no GPU, no torch: tests/serve_router.rs, tests/serve_netns.rs),
/// `requests` for the incident write-ups' canary script, and NVIDIA's NVRTC wheel
/// (the committed `kernels/kv.ptx` is this version's output; gpu-tests/tests/cpu.rs).
pub const PYTHON_PACKAGES: &[&str] = &[
    "openai==3.57.0",
    "sglang-router==0.3.2",
    "requests==2.32.5",
    "nvidia-cuda-nvrtc-cu12==12.4.127",
];

/// mdBook, which builds the guide under `docs/` (installed with `cargo install
/// --locked` into `target/tools`, without its `serve` and `watch` features).
pub const MDBOOK_VERSION: &str = "0.5.4";

/// The Debian packages the tests use, installed by `cargo xtask setup` as root:
/// the namespace fault bed (`ip`, `tc`, `nft`), the incident write-ups' pool check
/// (`curl`, `jq`), the headless browser the HTML timeline test renders in, and `nm`,
/// which the product-boundary test reads the server binary's symbols with.
/// Each package with the commands the tests run from it.
pub const APT_PACKAGES: &[(&str, &[&str])] = &[
    ("iproute2", &["ip", "tc"]),
    ("nftables", &["nft"]),
    ("jq", &["jq"]),
    ("curl", &["curl"]),
    ("chromium", &["chromium"]),
    ("binutils", &["nm"]),
];
