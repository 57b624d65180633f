//! What the command-line tests share: run the built `kvsim` from the repository root
//! with its folder first on the PATH, read its output, make temporary files.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The PATH with the built `kvsim`'s folder first: printed replay commands then
/// read `kvsim ...` (without it, `cargo run --release -- ...`).
pub fn path_with_kvsim() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_kvsim"))
        .parent()
        .expect("a folder")
        .to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&rest))).expect("a PATH")
}

/// Run `kvsim` with `args` and wait for it.
pub fn kvsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsim"))
        .current_dir(root())
        .env("PATH", path_with_kvsim())
        .args(args)
        .output()
        .expect("kvsim runs")
}

/// Standard output and standard error together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A path in this test binary's own temporary folder (`tag` keeps binaries apart).
pub fn tmp_in(tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsim-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

pub const MIXED: &str = "scenarios/mixed-faults.toml";
pub const INCIDENT: &str = "gate-checks-finished-only,no-length-agreement";

/// The canary's load where a test expects the incident's leak in a reply: 32 short
/// requests, 4 over-length prompts, 16 new tokens (the scenarios' limit), so a short
/// request fills its pages with its marker and an over-length reply reads 16 positions
/// of its pages (why 8 is too few: scripts/netns-bed.sh).
pub const LEAK_LOAD: [&str; 6] = [
    "--requests",
    "32",
    "--over-length",
    "4",
    "--max-new-tokens",
    "16",
];

/// How long a test waits for a `kvsim serve` line or exit.
pub const SERVE_WAIT: Duration = Duration::from_secs(20);

/// A running `kvsim serve` process, killed if a test fails before stopping it.
pub struct Served {
    pub child: Child,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Served {
    pub fn start(args: &[&str]) -> Served {
        Served::start_env(args, &[])
    }

    /// [`Served::start`] with `env` added to the server's environment.
    pub fn start_env(args: &[&str], env: &[(&str, String)]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvsim"))
            .current_dir(root())
            .arg("serve")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kvsim serve starts");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Served {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Wait for a stdout line that `f` accepts.
    pub fn wait_for<R>(&mut self, what: &str, f: impl Fn(&str) -> Option<R>) -> R {
        let end = Instant::now() + SERVE_WAIT;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = f(&line);
                    self.seen.push(line);
                    if let Some(r) = hit {
                        return r;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no `{what}` from kvsim serve; it printed:\n{}",
            self.seen.join("\n")
        );
    }

    pub fn endpoint(&mut self) -> SocketAddr {
        self.wait_for("client endpoint", kvsim::serve::endpoint_of)
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Send `sig` and wait for the exit; everything it printed, and whether it
    /// exited 0.
    pub fn stop(mut self, sig: &str) -> (String, bool) {
        self.signal(sig);
        let end = Instant::now() + SERVE_WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(Instant::now() < end, "kvsim serve did not exit after {sig}");
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (self.seen.join("\n"), status.success())
    }
}

impl Drop for Served {
    /// A test that failed leaves its servers behind: stop them with SIGTERM (so their
    /// traces are complete for a look), and kill what does not exit within 5 s.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python that has the pinned client packages (the virtual environment under
/// `target/pyclients`, made on first use by kvsim-testenv, or `KVSIM_PYTHON`), or
/// `None` with the skip printed and recorded; under `KVSIM_REQUIRE_PY_CLIENTS=1` (set
/// by `cargo xtask test`) a missing one fails the test.
pub fn python_with(test: &str, module: &str) -> Option<String> {
    kvsim_testenv::python(test, module).map(|p| p.display().to_string())
}

/// The Python with `sglang_router` (SGLang's router, pinned in kvsim-testenv), or
/// `None` (SKIPPED) where it cannot be had.
pub fn router_python(test: &str) -> Option<String> {
    python_with(test, "sglang_router")
}
