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

/// vLLM's router, the Rust gateway wheel (no torch, no GPU), in its own virtual
/// environment (`target/vllm-router`: its dependencies are not the clients' pins):
/// `vllm-router --vllm-pd-disaggregation` drives kvsim's vLLM-kind workers
/// (tests/serve_vllm_router.rs).
pub const VLLM_ROUTER: &str = "vllm-router==0.1.17";

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

/// NVIDIA's NIXL library for `kvsim serve --transport nixl` (the tests in
/// tests/serve_nixl.rs): this wheel, downloaded without its dependencies (the meta
/// package `nixl` pulls CUDA torch) and unzipped under `target/nixl`; its
/// `.nixl_cu12.mesonpy.libs` folder holds `libnixl_capi.so`, the UCX plugin and the
/// bundled UCX. Pinned with the `nixl-sys` crate (runtime/Cargo.toml, `=1.5.2`): a
/// function the crate calls that the wheel lacks aborts on first call.
pub const NIXL_WHEEL: &str = "nixl-cu12==1.5.1";

/// The folder of the wheel that holds its libraries.
pub const NIXL_LIB_FOLDER: &str = ".nixl_cu12.mesonpy.libs";

/// The Debian packages the `nixl` feature's build needs (`nixl-sys` runs bindgen,
/// which loads libclang and needs clang's own headers), each with a file that is there
/// once it is installed.
pub const NIXL_BUILD_PACKAGES: &[(&str, &str)] = &[
    ("libclang1-14", "/usr/lib/x86_64-linux-gnu/libclang-14.so.1"),
    (
        "libclang-common-14-dev",
        "/usr/lib/llvm-14/lib/clang/14.0.6/include/stddef.h",
    ),
];
