//! `cargo xtask setup | test | schedules | book | layout`: the README's test command and
//! its set-up.
//!
//! - `setup`: installs what the tests need, pinned and idempotently (Debian's packages
//!   as root, libclang among them for the `nixl` feature's build; the Python clients
//!   and NVRTC in `target/pyclients`; vLLM's router in `target/vllm-router`; the
//!   NIXL wheel in `target/nixl`; mdBook in
//!   `target/tools`). Prints what it could not install and why.
//! - `test [ARGS]`: `setup`, then `cargo test --workspace ARGS` with every require
//!   variable set (the namespace bed's only as root, since it needs root), so a
//!   missing piece fails instead of skipping; then the runtime's thread schedules
//!   (`runtime/tests/schedules.rs`, built with `--cfg shuttle` in `target-shuttle`);
//!   prints last every skipped test and why.
//! - `schedules`: the thread schedules alone.
//! - `book`: builds the guide (`docs/`, mdBook) into `target/book` and checks its links.
//! - `layout [--write-allow]`: the source layout limits of issue 35 against
//!   `xtask/layout-allow.toml`; `--write-allow` rewrites the list from today's tree.

use anyhow::{bail, Context, Result};
use kvsim_testenv::{setup, skips, workspace_root};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("setup") => setup_all().map(|_| ExitCode::SUCCESS),
        Some("test") => test(&args[1..]),
        Some("schedules") => Ok(match schedules()? {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        }),
        Some("book") => book().map(|()| ExitCode::SUCCESS),
        Some("layout") => layout(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask setup | test [CARGO TEST ARGS] | schedules | book | layout [--write-allow]"
            );
            Ok(ExitCode::from(2))
        }
    }
}

/// What set-up found or installed, for the test run's environment.
struct Installed {
    python: Option<PathBuf>,
    nvrtc: Option<PathBuf>,
    /// The NIXL wheel's libraries, and whether the `nixl` feature can build here.
    nixl: (Option<PathBuf>, bool),
    root: bool,
}

/// Install everything; report each piece. Failures are printed, not fatal: the tests
/// then fail naming the missing piece.
fn setup_all() -> Result<Installed> {
    let root = setup::is_root();
    println!("== set-up (pinned; see testenv/src/pins.rs)");
    report(
        "Debian packages",
        setup::system().map(|()| "present".to_string()),
    );
    let python = report(
        "Python clients (target/pyclients)",
        setup::python_clients().map(show),
    );
    let nvrtc = report("NVRTC wheel", setup::nvrtc_dir().map(show));
    report(
        "vLLM's router (target/vllm-router)",
        setup::vllm_router().map(show),
    );
    let nixl = report(
        "NIXL wheel (target/nixl)",
        kvsim_testenv::nixl::lib_dir().map(show),
    );
    let nixl_builds = setup::missing_apt_packages().is_empty();
    report("mdBook (target/tools)", setup::mdbook().map(show));
    if !root {
        println!(
            "   (not root: the namespace fault bed cannot run and its tests will say SKIPPED)"
        );
    }
    Ok(Installed {
        python: python.map(PathBuf::from),
        nvrtc: nvrtc.map(PathBuf::from),
        nixl: (nixl.map(PathBuf::from), nixl_builds),
        root,
    })
}

fn show(p: PathBuf) -> String {
    p.display().to_string()
}

fn report(what: &str, r: Result<String, String>) -> Option<String> {
    match r {
        Ok(v) => {
            println!("   {what}: {v}");
            Some(v)
        }
        Err(why) => {
            println!("   {what}: NOT INSTALLED: {why}");
            None
        }
    }
}

/// `cargo test --workspace` with the require variables, then the skip list.
fn test(extra: &[String]) -> Result<ExitCode> {
    let installed = setup_all()?;
    let run = format!("xtask-{}", std::process::id());
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root())
        .args(["test", "--workspace"])
        .args(
            installed
                .nixl
                .1
                .then_some(["--features", "kvsim/nixl"])
                .iter()
                .flatten(),
        )
        .args(extra)
        .env("KVSIM_SKIP_RUN", &run)
        .env("KVSIM_REQUIRE_PY_CLIENTS", "1")
        .env("KVSIM_REQUIRE_NVRTC", "1")
        .env("KVSIM_REQUIRE_TOOLS", "1")
        .env("KVSIM_REQUIRE_VLLM_ROUTER", "1")
        // The `nixl` feature (`kvsim serve --transport nixl`) builds where libclang is
        // (installed above as root); without it the NIXL tests fail, naming why.
        .env("KVSIM_REQUIRE_NIXL", "1");
    if let Some(dir) = &installed.nixl.0 {
        cmd.env("KVSIM_NIXL_LIB_DIR", dir);
    }
    if installed.root {
        cmd.env("KVSIM_REQUIRE_NETNS", "1");
    }
    if let Some(py) = &installed.python {
        cmd.env("KVSIM_PYTHON", py);
    }
    if let Some(dir) = &installed.nvrtc {
        cmd.env("KVSIM_NVRTC_DIR", dir);
    }
    println!("== cargo test --workspace {}", extra.join(" "));
    let status = cmd.status().context("running cargo test")?;
    let schedules = schedules()?;
    print!("{}", skips::render(&skips::list(&run)));
    let _ = std::fs::remove_dir_all(skips::run_dir(&run));
    Ok(match status.success() && schedules {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}

/// The runtime's threads under shuttle's seeded scheduler: `--cfg shuttle` swaps the
/// runtime's primitives (`runtime/src/sync/`) and rebuilds every dependency, so it
/// builds in a target directory of its own, `target-shuttle` (as loom's models build
/// in `target-loom`). About 4 minutes cold on the 2-core VM, then seconds.
fn schedules() -> Result<bool> {
    let root = workspace_root();
    let flags = match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.trim().is_empty() => format!("{f} --cfg shuttle"),
        _ => "--cfg shuttle".to_string(),
    };
    println!("== the runtime's thread schedules (--cfg shuttle, target-shuttle)");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(&root)
        .args(["test", "-p", "kvsim-runtime", "--test", "schedules"])
        .env("CARGO_TARGET_DIR", root.join("target-shuttle"))
        .env("RUSTFLAGS", flags)
        .status()
        .context("running the schedule tests")?;
    Ok(status.success())
}

/// Check the guide's links, then build it with mdBook into `target/book`.
fn book() -> Result<()> {
    let root = workspace_root();
    let broken = xtask::links::check(&root);
    for b in &broken {
        eprintln!("broken link: {b}");
    }
    if !broken.is_empty() {
        bail!("{} broken link(s) in the guide", broken.len());
    }
    let mdbook = setup::mdbook().map_err(anyhow::Error::msg)?;
    let status = Command::new(&mdbook)
        .arg("build")
        .arg(root.join("docs"))
        .status()
        .with_context(|| format!("running {}", mdbook.display()))?;
    if !status.success() {
        bail!("mdbook build failed ({status})");
    }
    println!(
        "the guide: {}",
        root.join("target/book/index.html").display()
    );
    Ok(())
}

/// Check the layout limits against the allow-list, or rewrite the list.
fn layout(args: &[String]) -> Result<ExitCode> {
    let root = workspace_root();
    let allow = root.join(xtask::layout::ALLOW_PATH);
    if args.iter().any(|a| a == "--write-allow") {
        xtask::layout::write_allow(&root, &allow)?;
        println!("wrote {}", allow.display());
    }
    let outcome = xtask::layout::check(&root, &allow)?;
    print!("{}", outcome.report);
    Ok(match outcome.violations.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}
