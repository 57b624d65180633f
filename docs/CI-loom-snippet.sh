# Lines for .ci/run: the loom models of kv::shared (engine/tests/loom_shared.rs).
# Not a script of its own; merge into .ci/run after the ordinary `cargo test` step.
#
# `--cfg loom` rebuilds every dependency, so it gets its own target directory
# (ignored by .gitignore's /target-*). The preemption bound is set in the test file:
# four models run unbounded, the two with three busy threads at HEAVY_PREEMPTIONS = 6,
# and each pins its interleaving count. Do not set KVSIM_LOOM_PREEMPTIONS or
# LOOM_MAX_PREEMPTIONS here: either one overrides every model and skips the pins.
# Measured on the 2-core VM (docs/PERFORMANCE-shared.md), machine busy: cold release
# build 2 min 14 s, then 75 s of tests; about 3.5 minutes in all.
# The unbounded run (hours, not for CI):
#   KVSIM_LOOM_PREEMPTIONS=none CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" \
#     cargo test -p kvsim-engine --release loom -- --nocapture
echo "== loom: kv::shared models (bounded, see docs/PERFORMANCE-shared.md)"
CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" \
    cargo test -p kvsim-engine --release loom
