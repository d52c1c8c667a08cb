#!/usr/bin/env bash
# The accumulator table (RESULTS.md, "FP8 training with fp32, bf16 and fp16 accumulation"):
# LeNet-5 on Fashion-MNIST with e4m3, e5m2 or split FP8 GEMM operands and every layer's GEMMs
# (forward and both backward) under f32, naive:fp32, naive:bf16, naive:fp16, fma:fp32,
# fma:bf16 and fma:fp16 accumulation, as the sweep spec examples/sweeps/accumulators.toml sets out. Runs the
# spec's unfinished points (WORKERS at a time) into sweeps/accumulators/, then copies each
# run's per-epoch metrics to results/metrics/accumulators-<run>.csv and the sweep's report
# to results/sweeps/accumulators/, and writes results/accumulator-table.md. Finished points
# are skipped and interrupted ones resume: raise the spec's `epochs` or add seeds and run
# this again to extend the table. A point that fails (a NaN loss stops a run) is recorded in
# sweeps/accumulators/failed/ and reported in the table; the others go on.
# Usage: scripts/accumulator_table.sh [WORKERS (default 2)]
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${1:-2}"
spec=examples/sweeps/accumulators.toml
sweep=sweeps/accumulators
bin="${QCANDLE_BIN:-target/release/qcandle}"
"$bin" sweep run "$spec" --workers "$workers" --quiet ||
    echo "accumulator_table.sh: some points did not finish (see $sweep/failed/)" >&2
"$bin" sweep report "$spec" > /dev/null
mkdir -p results/metrics results/sweeps/accumulators
for run in "$sweep"/runs/*/; do
    name="$(basename "$run")"
    if [ -s "$run/metrics.csv" ]; then
        cp "$run/metrics.csv" "results/metrics/accumulators-$name.csv"
    fi
done
cp "$sweep/report.md" "$sweep/report.csv" "$sweep/curves.png" results/sweeps/accumulators/
python3 scripts/accumulator_table.py "$sweep" > results/accumulator-table.md
cat results/accumulator-table.md
