//! `kvsim-server`: `kvsim serve` as a binary of its own, the one that runs a deployment.
//!
//! It links the engine, the trace schema and the runtime, and none of the fault
//! injection the simulator and the model checker use (the engine's `testing` half,
//! the simulator's plans and driver, the models): `tests/product_boundary.rs` reads its
//! symbols to hold that. `kvsim serve ARGS` runs this binary (the one beside `kvsim`)
//! with the same arguments, so both spellings serve the same way.

use clap::Parser;
use std::process::ExitCode;

/// Serve a scenario's topology for real: threads, TCP, a monotonic clock.
#[derive(Parser, Debug)]
#[command(name = "kvsim-server", version)]
struct Cli {
    #[command(flatten)]
    args: kvsim::serve::ServeArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match kvsim::serve::serve(&cli.args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
