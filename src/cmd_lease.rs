//! `kvsim lease-floor`: the minimum safe lease of vLLM's pull protocol for a
//! scenario's latencies and faults ([`kvsim_lab::lease_floor`]), printed as a table.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct LeaseFloorArgs {
    /// A scenario of vLLM's protocol (TOML; its routers must be vllm-router).
    pub scenario: PathBuf,
    /// Seeds swept at each candidate lease (0..N).
    #[arg(long, default_value_t = 500)]
    pub seeds: u64,
    /// The candidate leases in milliseconds, comma-separated.
    #[arg(
        long,
        value_name = "MS,MS,..",
        default_value = "50,100,200,400,800,1000,1200,1600,2000"
    )]
    pub leases_ms: String,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// Parse the candidate list: milliseconds, comma-separated, each a whole number above 0.
pub fn parse_leases_ms(list: &str) -> Result<Vec<u64>> {
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let ms: u64 = p
                .parse()
                .with_context(|| format!("--leases-ms: `{p}` is not a whole number of ms"))?;
            anyhow::ensure!(
                ms > 0,
                "--leases-ms: a lease of 0 ms frees the pages at once"
            );
            ms.checked_mul(1_000_000)
                .with_context(|| format!("--leases-ms: {ms} ms is too long"))
        })
        .collect()
}

pub fn run(a: &LeaseFloorArgs) -> Result<ExitCode> {
    let sc = crate::cmd_sim::load_to_run(&a.scenario, false, true)?;
    let leases = parse_leases_ms(&a.leases_ms)?;
    let path = a.scenario.display().to_string();
    let found = kvsim_lab::lease_floor::lease_floor(&sc, &path, &leases, a.seeds, a.jobs)?;
    print!("{}", found.render());
    Ok(if found.floor_ns().is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_lists_parse_or_name_the_bad_entry() {
        assert_eq!(
            parse_leases_ms("50, 100").unwrap(),
            vec![50_000_000, 100_000_000]
        );
        let e = parse_leases_ms("50,abc").unwrap_err().to_string();
        assert!(e.contains("`abc`"), "{e}");
        assert!(parse_leases_ms("0").is_err());
    }
}
