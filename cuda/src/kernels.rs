//! The kernel source, the committed PTX, and how a device gets a module from them.
//!
//! `kernels/kv.cu` is the only CUDA C; `kernels/kv.ptx` is its NVRTC output with
//! [`crate::nvrtc::OPTIONS`], committed so that a GPU machine without NVRTC (the lent
//! machines have no network) can load it with `Ptx::from_src`. Regenerate it with
//! `cargo run -p kvsim-cuda --bin gen-ptx`; a test compiles the source again and
//! fails if the committed PTX differs. This module launches nothing. Invariant: the
//! kernels a backend loads are exactly [`KERNELS`], from this source.

use crate::{nvrtc, GpuError};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `kernels/kv.cu`.
pub const SOURCE: &str = include_str!("../kernels/kv.cu");
/// `kernels/kv.ptx`, generated from [`SOURCE`] by `gen-ptx`.
pub const PTX: &str = include_str!("../kernels/kv.ptx");
/// The program name NVRTC is given (it appears in diagnostics).
pub const PROGRAM: &str = "kv.cu";
/// Every kernel entry point of [`SOURCE`].
pub const KERNELS: [&str; 7] = [
    "kv_write_tokens",
    "kv_gather_pages",
    "kv_scatter_pages",
    "kv_zero_pages",
    "kv_decode_tokens",
    "kv_check_tags",
    "kv_attend",
];
/// The oldest PTX ISA that targets sm_90 (CUDA 11.8): the retry when a driver older
/// than the NVRTC that wrote the PTX refuses its `.version`.
pub const FALLBACK_PTX_VERSION: &str = "7.8";

/// Where a loaded module's PTX came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxOrigin {
    /// Compiled at start-up by the NVRTC found.
    Nvrtc,
    /// The committed `kernels/kv.ptx`.
    Committed,
    /// The committed PTX with its `.version` lowered for an older driver.
    CommittedLowered,
}

/// `#define NAME VALUE` lines of a CUDA source, in order of appearance.
pub fn defines(src: &str) -> BTreeMap<String, String> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|rest| {
            let mut parts = rest.split_whitespace();
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

/// The `.entry` names of a PTX text.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.trim().trim_end_matches('(').trim().to_string())
        .collect()
}

/// Replace the PTX `.version` directive.
pub fn with_ptx_version(ptx: &str, version: &str) -> String {
    ptx.lines()
        .map(|l| {
            if l.trim_start().starts_with(".version ") {
                format!(".version {version}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Load the kernels into a context. In order, the first that loads: a fresh NVRTC
/// compilation (where NVRTC is present), the committed PTX, the committed PTX with its
/// `.version` lowered to [`FALLBACK_PTX_VERSION`] (a driver older than the NVRTC that
/// wrote it). The error lists why each failed.
pub fn load(ctx: &Arc<CudaContext>) -> Result<(Arc<CudaModule>, PtxOrigin), GpuError> {
    let mut why = Vec::new();
    match nvrtc::ensure() {
        Ok(_) => match nvrtc::compile(SOURCE, PROGRAM) {
            Ok(c) => match ctx.load_module(Ptx::from_src(c.ptx)) {
                Ok(m) => return Ok((m, PtxOrigin::Nvrtc)),
                Err(e) => why.push(format!("NVRTC's PTX: {e}")),
            },
            Err(e) => why.push(format!("NVRTC: {e}")),
        },
        // No NVRTC is no refusal: the committed PTX is next.
        Err(e) => why.push(format!("no NVRTC ({e})")),
    }
    match ctx.load_module(Ptx::from_src(PTX)) {
        Ok(m) => return Ok((m, PtxOrigin::Committed)),
        Err(e) => why.push(format!("committed PTX: {e}")),
    }
    let lowered = with_ptx_version(PTX, FALLBACK_PTX_VERSION);
    match ctx.load_module(Ptx::from_src(lowered)) {
        Ok(m) => Ok((m, PtxOrigin::CommittedLowered)),
        Err(e) => {
            why.push(format!("with .version {FALLBACK_PTX_VERSION}: {e}"));
            Err(GpuError::Module(why.join("; ")))
        }
    }
}
