//! Installing what the tests need: pinned, idempotent, and safe to call from many
//! test processes at once (one lock file under `target/`). The Python packages and
//! mdBook go under `target/`; Debian's packages need root ([`system`]).

use crate::paths::target_dir;
use crate::pins::{
    APT_PACKAGES, MDBOOK_VERSION, NIXL_BUILD_PACKAGES, PYTHON_PACKAGES, VLLM_ROUTER,
};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Holds the set-up lock while alive: one installer at a time, across processes.
pub(crate) struct SetupLock(File);

impl SetupLock {
    pub(crate) fn take() -> Result<SetupLock, String> {
        let dir = target_dir();
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(".kvsim-setup.lock");
        let f = File::create(&path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        f.lock()
            .map_err(|e| format!("locking {}: {e}", path.display()))?;
        Ok(SetupLock(f))
    }
}

impl Drop for SetupLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Run a set-up command to completion; its output is returned in the error.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let tail: Vec<&str> = text.lines().rev().take(6).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "{what} failed ({}): {}",
        out.status,
        tail.join(" | ")
    ))
}

/// The clients' virtual environment.
pub fn venv_dir() -> PathBuf {
    target_dir().join("pyclients")
}

/// The pinned list, as written to the environment's stamp once installed.
fn pins_stamp() -> String {
    PYTHON_PACKAGES.join("\n") + "\n"
}

/// The clients' environment with every pinned package installed (creating it and
/// installing on first use; a no-op when its stamp matches the pins). Its Python.
pub fn python_clients() -> Result<PathBuf, String> {
    let venv = venv_dir();
    let py = venv.join("bin/python");
    let stamp = venv.join("kvsim-pins.txt");
    let current = || std::fs::read_to_string(&stamp).ok().as_deref() == Some(pins_stamp().as_str());
    if py.exists() && current() {
        return Ok(py);
    }
    let _lock = SetupLock::take()?;
    if py.exists() && current() {
        return Ok(py);
    }
    if !py.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv target/pyclients (Debian: apt-get install python3-venv)",
        )?;
    }
    let mut pip = Command::new(&py);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(PYTHON_PACKAGES)
    .env("PIP_NO_INPUT", "1");
    run(
        &mut pip,
        &format!("pip install {}", PYTHON_PACKAGES.join(" ")),
    )?;
    std::fs::write(&stamp, pins_stamp())
        .map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(py)
}

/// vLLM's router's own environment.
pub fn vllm_router_dir() -> PathBuf {
    target_dir().join("vllm-router")
}

/// The `vllm-router` executable: `KVSIM_VLLM_ROUTER` when set, else the pinned wheel
/// ([`VLLM_ROUTER`]) in its own virtual environment under `target/` (made and installed
/// on first use; a no-op when its stamp matches the pin).
pub fn vllm_router() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("KVSIM_VLLM_ROUTER") {
        let p = PathBuf::from(p);
        return match p.is_file() {
            true => Ok(p),
            false => Err(format!("KVSIM_VLLM_ROUTER={} is not a file", p.display())),
        };
    }
    let venv = vllm_router_dir();
    let (py, exe) = (venv.join("bin/python"), venv.join("bin/vllm-router"));
    let stamp = venv.join("kvsim-pins.txt");
    let current = || std::fs::read_to_string(&stamp).ok().as_deref() == Some(VLLM_ROUTER);
    if exe.exists() && current() {
        return Ok(exe);
    }
    let _lock = SetupLock::take()?;
    if exe.exists() && current() {
        return Ok(exe);
    }
    if !py.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv target/vllm-router (Debian: apt-get install python3-venv)",
        )?;
    }
    let mut pip = Command::new(&py);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .arg(VLLM_ROUTER)
    .env("PIP_NO_INPUT", "1");
    run(&mut pip, &format!("pip install {VLLM_ROUTER}"))?;
    std::fs::write(&stamp, VLLM_ROUTER).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    match exe.is_file() {
        true => Ok(exe),
        false => Err(format!("{VLLM_ROUTER} installed no {}", exe.display())),
    }
}

/// A Python that can import `module`: `KVSIM_PYTHON` when set, else the pinned
/// clients' environment (installed on first use).
pub fn python_with(module: &str) -> Result<PathBuf, String> {
    let py = match std::env::var_os("KVSIM_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => python_clients()?,
    };
    let ok = Command::new(&py)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(py)
    } else {
        Err(format!("`{}` cannot import `{module}`", py.display()))
    }
}

/// The folder of NVRTC's libraries: `KVSIM_NVRTC_DIR` when set, else the pinned wheel's
/// `lib` folder in the clients' environment.
pub fn nvrtc_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KVSIM_NVRTC_DIR") {
        let dir = PathBuf::from(dir);
        return match dir.is_dir() {
            true => Ok(dir),
            false => Err(format!("KVSIM_NVRTC_DIR={} is not a folder", dir.display())),
        };
    }
    let py = python_with("nvidia.cuda_nvrtc")?;
    let out = Command::new(&py)
        .args([
            "-c",
            "import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], 'lib'))",
        ])
        .output()
        .map_err(|e| format!("asking {} for the NVRTC wheel: {e}", py.display()))?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    match out.status.success() && dir.is_dir() {
        true => Ok(dir),
        false => Err(format!(
            "the NVRTC wheel has no lib folder ({})",
            dir.display()
        )),
    }
}

/// `tool`'s path on `PATH`, if it is there and executable.
pub fn which(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The Debian package that provides `tool`.
pub fn apt_package_of(tool: &str) -> &'static str {
    APT_PACKAGES
        .iter()
        .find(|(_, cmds)| cmds.contains(&tool))
        .map_or("(not one kvsim installs)", |(pkg, _)| pkg)
}

/// Is this process root?
pub fn is_root() -> bool {
    // The effective uid, as `id -u` prints it.
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The Debian packages of [`APT_PACKAGES`] whose commands are missing here, and of
/// [`NIXL_BUILD_PACKAGES`] whose files are.
pub fn missing_apt_packages() -> Vec<&'static str> {
    let tools = APT_PACKAGES
        .iter()
        .filter(|(_, cmds)| cmds.iter().any(|c| which(c).is_none()))
        .map(|(pkg, _)| *pkg);
    let libs = NIXL_BUILD_PACKAGES
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(pkg, _)| *pkg);
    tools.chain(libs).collect()
}

/// Install the missing Debian packages (root only; `apt-get update` when the package
/// lists do not have them yet). An error names what is still missing.
pub fn system() -> Result<(), String> {
    let missing = missing_apt_packages();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() || which("apt-get").is_none() {
        return Err(format!(
            "missing {} (install as root: apt-get install -y {})",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    let _lock = SetupLock::take()?;
    let install = |pkgs: &[&str]| {
        run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(pkgs)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &format!("apt-get install {}", pkgs.join(" ")),
        )
    };
    if install(&missing).is_err() {
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
        install(&missing)?;
    }
    Ok(())
}

/// mdBook at the pinned version: `target/tools/bin/mdbook`, installed with `cargo
/// install --locked` on first use (a few minutes of compiling, once per machine).
pub fn mdbook() -> Result<PathBuf, String> {
    let root = target_dir().join("tools");
    let bin = root.join("bin/mdbook");
    if has_version(&bin, MDBOOK_VERSION) {
        return Ok(bin);
    }
    let _lock = SetupLock::take()?;
    if has_version(&bin, MDBOOK_VERSION) {
        return Ok(bin);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        Command::new(cargo)
            .args([
                "install",
                "--locked",
                "--quiet",
                "mdbook",
                "--version",
                MDBOOK_VERSION,
            ])
            .args(["--no-default-features", "--features", "search", "--root"])
            .arg(&root)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS"),
        &format!("cargo install mdbook {MDBOOK_VERSION}"),
    )?;
    match has_version(&bin, MDBOOK_VERSION) {
        true => Ok(bin),
        false => Err(format!(
            "{} does not answer version {MDBOOK_VERSION}",
            bin.display()
        )),
    }
}

fn has_version(bin: &Path, version: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version))
}
