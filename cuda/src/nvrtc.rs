//! Finding NVRTC and compiling `kernels/kv.cu` with the backend's options.
//!
//! NVRTC is looked up in `KVSIM_NVRTC_DIR`, else in the `nvidia-cuda-nvrtc-cu12` PyPI
//! wheel (asked of `python3`), else on the system's library path. A library found in
//! a folder is loaded by its full path before cudarc asks for it by name: the dynamic
//! loader matches an already loaded library by its soname, so `LD_LIBRARY_PATH` need
//! not be set. This module does not run kernels. Invariant: the options in
//! [`OPTIONS`] are the only ones kernels are ever compiled with (the backend, the
//! committed PTX and the CI check all use [`compile`]).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// NVRTC options: sm_90 (H100/H200) PTX, no fused multiply-add, IEEE division and
/// square root, denormals kept: the float semantics `gpu::layout` assumes.
pub const OPTIONS: [&str; 5] = [
    "--gpu-architecture=compute_90",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// A failed compilation, with NVRTC's log.
#[derive(Debug, thiserror::Error)]
pub enum CompileFailure {
    #[error("NVRTC is not available: {0}")]
    Unavailable(String),
    #[error("NVRTC call failed: {0:?}")]
    Nvrtc(cudarc::nvrtc::result::NvrtcError),
    #[error("compile error:\n{log}")]
    Errors { log: String },
    #[error("the source holds a NUL byte")]
    Nul,
}

/// A successful compilation: the PTX text and NVRTC's log (warnings; empty when clean).
#[derive(Clone, Debug)]
pub struct Compiled {
    pub ptx: String,
    pub log: String,
}

/// Where NVRTC came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Loaded by full path from this folder.
    Dir(PathBuf),
    /// Found by name on the system's library path.
    System,
}

/// The folder of the PyPI wheel's libraries, if `python3` knows the wheel.
pub fn wheel_dir() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], 'lib'))",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    dir.join("libnvrtc.so.12").is_file().then_some(dir)
}

fn load_from(dir: &Path) -> Result<Vec<libloading::Library>, String> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt."))
        })
        .collect();
    names.sort();
    names.push(dir.join("libnvrtc.so.12"));
    let mut libs = Vec::new();
    for path in names {
        // SAFETY: loading NVIDIA's NVRTC libraries runs only their initialisers.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        libs.push(lib);
    }
    Ok(libs)
}

/// Find and load NVRTC once per process; `Err` says why it is not available.
pub fn ensure() -> Result<Found, String> {
    ensure_in(None)
}

/// [`ensure`], looking first in `dir` when given (the tests' set-up names the pinned
/// wheel's folder). The first call in a process decides; later calls get its answer.
pub fn ensure_in(dir: Option<&Path>) -> Result<Found, String> {
    static FOUND: OnceLock<(Result<Found, String>, Vec<libloading::Library>)> = OnceLock::new();
    let (found, _libs) = FOUND.get_or_init(|| {
        let dir = dir
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("KVSIM_NVRTC_DIR").map(PathBuf::from))
            .or_else(wheel_dir);
        let mut libs = Vec::new();
        if let Some(dir) = &dir {
            match load_from(dir) {
                Ok(l) => libs = l,
                Err(e) => return (Err(format!("loading NVRTC from {}: {e}", dir.display())), libs),
            }
        }
        // SAFETY: only tries to dlopen the library by its names.
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        let found = match (present, dir) {
            (true, Some(d)) => Ok(Found::Dir(d)),
            (true, None) => Ok(Found::System),
            (false, Some(d)) => Err(format!("libnvrtc loaded from {} but not found by name", d.display())),
            (false, None) => Err(
                "libnvrtc not found (no KVSIM_NVRTC_DIR, no nvidia-cuda-nvrtc-cu12 wheel, not on the library path)"
                    .into(),
            ),
        };
        (found, libs)
    });
    found.clone()
}

/// Compile CUDA C with [`OPTIONS`].
pub fn compile(src: &str, name: &str) -> Result<Compiled, CompileFailure> {
    compile_with(src, name, &OPTIONS)
}

/// Compile CUDA C all the way to sm_90 machine code (NVRTC runs ptxas), with
/// [`OPTIONS`] but a real architecture, and ptxas's resource report in the log. The
/// PTX check's stronger sibling: it needs no GPU either. Returns the log and the
/// CUBIN's size.
pub fn assemble_sm90(src: &str, name: &str) -> Result<(String, usize), CompileFailure> {
    use cudarc::nvrtc::{result, sys};
    let mut opts: Vec<&str> = OPTIONS
        .iter()
        .map(|o| {
            if o.starts_with("--gpu-architecture=") {
                "--gpu-architecture=sm_90"
            } else {
                o
            }
        })
        .collect();
    opts.push("--ptxas-options=--verbose");
    ensure().map_err(CompileFailure::Unavailable)?;
    let src_c = CString::new(src).map_err(|_| CompileFailure::Nul)?;
    let name_c = CString::new(name).map_err(|_| CompileFailure::Nul)?;
    let prog = result::create_program(&src_c, Some(&name_c)).map_err(CompileFailure::Nvrtc)?;
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let log = unsafe { result::get_program_log(prog) }.map(|l| c_text(&l));
    let mut size = 0usize;
    let sized = if compiled.is_ok() {
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result()
    } else {
        Ok(())
    };
    let destroyed = unsafe { result::destroy_program(prog) };
    let log = log.map_err(CompileFailure::Nvrtc)?;
    if compiled.is_err() {
        return Err(CompileFailure::Errors { log });
    }
    sized.map_err(CompileFailure::Nvrtc)?;
    destroyed.map_err(CompileFailure::Nvrtc)?;
    Ok((log, size))
}

/// Compile CUDA C to PTX with the given options.
fn compile_with(src: &str, name: &str, options: &[&str]) -> Result<Compiled, CompileFailure> {
    use cudarc::nvrtc::result;
    ensure().map_err(CompileFailure::Unavailable)?;
    let src_c = CString::new(src).map_err(|_| CompileFailure::Nul)?;
    let name_c = CString::new(name).map_err(|_| CompileFailure::Nul)?;
    let prog = result::create_program(&src_c, Some(&name_c)).map_err(CompileFailure::Nvrtc)?;
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let compiled = unsafe { result::compile_program(prog, options) };
    let log = unsafe { result::get_program_log(prog) }.map(|l| c_text(&l));
    let ptx = if compiled.is_ok() {
        Some(unsafe { result::get_ptx(prog) }.map(|p| c_text(&p)))
    } else {
        None
    };
    let destroyed = unsafe { result::destroy_program(prog) };
    let log = log.map_err(CompileFailure::Nvrtc)?;
    if compiled.is_err() {
        return Err(CompileFailure::Errors { log });
    }
    destroyed.map_err(CompileFailure::Nvrtc)?;
    match ptx {
        Some(p) => Ok(Compiled {
            ptx: p.map_err(CompileFailure::Nvrtc)?,
            log,
        }),
        None => Err(CompileFailure::Errors { log }),
    }
}

/// NUL-terminated C text to a `String` (lossy, trailing NULs and whitespace dropped).
fn c_text(bytes: &[std::ffi::c_char]) -> String {
    let b: Vec<u8> = bytes
        .iter()
        .map(|&c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    String::from_utf8_lossy(&b).trim_end().to_string()
}
