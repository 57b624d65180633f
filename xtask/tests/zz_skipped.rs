//! The last test binary of `cargo test --workspace` (packages run in name order, and
//! `xtask` sorts after every `kvsim-*`): prints every test of this run that skipped,
//! and why, so a green run cannot hide a missing install. Not a test itself
//! (`harness = false`): it lists nothing to a test runner that asks (`--list`).
//! Under `cargo xtask test` it stays quiet: xtask prints the same list after cargo.

use kvsim_testenv::skips;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let run = skips::run_id();
    if run.starts_with("xtask-") {
        return;
    }
    print!("{}", skips::render(&skips::list(&run)));
    skips::prune(&run);
}
