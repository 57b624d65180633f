#!/usr/bin/env bash
# A kvsim sweep across a Slurm cluster: a job array of COUNT tasks, each running one
# shard (`--shard K/COUNT`, K = SLURM_ARRAY_TASK_ID) of the same seed range and
# writing its JSON summary to a shared directory, then a dependent merge job.
#
#   sbatch deploy/slurm-array.sh                    # submits the array and the merge
#   SEEDS=0..10000000 COUNT=64 sbatch --array=1-64 deploy/slurm-array.sh
#
# `kvsim merge` exits 0 when every seed of the range ran clean, 1 on a violation
# (each failing seed is printed with its replay command), 3 when a shard is missing
# (it names the missing shards), 2 on bad input. Needs `kvsim` on the PATH
# (`cargo install --path .`) and the repository (for scenarios/) as the working
# directory.
#SBATCH --job-name=kvsim-sweep
#SBATCH --array=1-16
#SBATCH --cpus-per-task=4
#SBATCH --time=04:00:00
#SBATCH --output=kvsim-%A-%a.out
set -uo pipefail

COUNT=${COUNT:-16}
SEEDS=${SEEDS:-0..1000000}
SCENARIO=${SCENARIO:-scenarios/mixed-faults.toml}
OUT=${OUT:-results}
mkdir -p "$OUT"

if [ "${1:-}" = "merge" ]; then
    exec kvsim merge "$OUT"/shard-*-of-"$COUNT".json --json "$OUT/merged.json"
fi

K=${SLURM_ARRAY_TASK_ID:?run under sbatch --array=1-COUNT}
kvsim sweep "$SCENARIO" --seeds "$SEEDS" --shard "$K/$COUNT" --jobs "${SLURM_CPUS_PER_TASK:-1}" \
    --quiet --json "$OUT/shard-$K-of-$COUNT.json"
rc=$?
# The last task to start submits the merge, after every task of the array ended
# (afterany: a failed shard is reported missing by the merge, not hidden).
if [ "$K" = "$COUNT" ] && [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    sbatch --dependency="afterany:${SLURM_ARRAY_JOB_ID}" --job-name=kvsim-merge \
        --export=ALL,COUNT="$COUNT",OUT="$OUT" "$0" merge
fi
# Exit 1 (a violation) is a result: the JSON holds it. Anything else is a failure.
[ "$rc" -le 1 ]
