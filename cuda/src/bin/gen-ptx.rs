//! Regenerates `cuda/kernels/kv.ptx` from `kernels/kv.cu` with NVRTC and the
//! backend's options (`cargo run -p kvsim-cuda --bin gen-ptx`).
//!
//! It is the only writer of the committed PTX; it needs NVRTC (the
//! `nvidia-cuda-nvrtc-cu12` wheel or `KVSIM_NVRTC_DIR`) and no GPU. It refuses to
//! write PTX from a compilation that printed warnings.

use kvsim_cuda::{kernels, nvrtc};
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/kv.ptx");
    match nvrtc::compile(kernels::SOURCE, kernels::PROGRAM) {
        Ok(c) if !c.log.is_empty() => {
            eprintln!("NVRTC warnings, PTX not written:\n{}", c.log);
            ExitCode::FAILURE
        }
        Ok(c) => match std::fs::write(&out, format!("{}\n", c.ptx.trim_end())) {
            Ok(()) => {
                println!("wrote {} ({} bytes)", out.display(), c.ptx.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", out.display());
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
