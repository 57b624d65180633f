//! NVIDIA's NIXL wheel for `kvsim serve --transport nixl`: downloaded (pinned, without
//! its dependencies) and unzipped under `target/nixl` on first use; the folder of its
//! libraries is what the server's `LD_LIBRARY_PATH` must name.

use crate::paths::target_dir;
use crate::pins::{NIXL_LIB_FOLDER, NIXL_WHEEL};
use crate::setup::{run, SetupLock};
use std::path::PathBuf;
use std::process::Command;

/// The wheel's library folder: `KVSIM_NIXL_LIB_DIR` when set, else the pinned wheel
/// under `target/nixl`, downloaded with pip (`--no-deps`) and unzipped on first use.
pub fn lib_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KVSIM_NIXL_LIB_DIR") {
        let dir = PathBuf::from(dir);
        return match dir.join("libnixl_capi.so").is_file() {
            true => Ok(dir),
            false => Err(format!(
                "KVSIM_NIXL_LIB_DIR={} holds no libnixl_capi.so",
                dir.display()
            )),
        };
    }
    let root = target_dir().join("nixl");
    let unzipped = root.join(NIXL_WHEEL.replace("==", "-"));
    let lib = unzipped.join(NIXL_LIB_FOLDER);
    if lib.join("libnixl_capi.so").is_file() {
        return Ok(lib);
    }
    let _lock = SetupLock::take()?;
    if lib.join("libnixl_capi.so").is_file() {
        return Ok(lib);
    }
    let wheels = root.join("wheel");
    let _ = std::fs::remove_dir_all(&wheels);
    run(
        Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args(["--disable-pip-version-check", "--only-binary=:all:", "-d"])
            .arg(&wheels)
            .arg(NIXL_WHEEL)
            .env("PIP_NO_INPUT", "1"),
        &format!("pip download --no-deps {NIXL_WHEEL}"),
    )?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| format!("reading {}: {e}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip left no wheel in {}", wheels.display()))?;
    let _ = std::fs::remove_dir_all(&unzipped);
    run(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unzipped),
        &format!("unzipping {}", wheel.display()),
    )?;
    match lib.join("libnixl_capi.so").is_file() {
        true => Ok(lib),
        false => Err(format!("the wheel has no {}", lib.display())),
    }
}
