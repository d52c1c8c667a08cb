#!/usr/bin/env bash
# The LNS proposal's MNIST experiment (RESULTS.md, "An MLP trained in LNS arithmetic"):
# a 784-100-10 MLP, batch 128, SGD lr 0.1, normal initial weights (std 0.1), 7 epochs,
# in float32 and with every layer's GEMMs in lns<32,23> ideal arithmetic
# (examples/lns_mlp.rs), seeds 0 .. RUNS-1. Writes results/lns-mlp/<arith>-seed<S>.csv (one
# line per epoch, with the wall-clock seconds of training and testing) and
# results/lns-mlp/summary.md (mean and standard deviation over the runs present). Runs
# already written are kept: re-running continues where it stopped.
# Usage: scripts/lns_mlp_results.sh [RUNS (default 10)] [MNIST_DIR (default ../shared/data/mnist)]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
mnist="${2:-../shared/data/mnist}"
out=results/lns-mlp
mkdir -p "$out"
# QCANDLE_LNS_MLP_BIN: a binary built earlier (else the example is built now).
bin="${QCANDLE_LNS_MLP_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --example lns_mlp
    bin=target/release/examples/lns_mlp
fi
for ((seed = 0; seed < runs; seed++)); do
    for arith in f32 lns; do
        file="$out/$arith-seed$seed.csv"
        [ -s "$file" ] && continue
        "$bin" --data-dir "$mnist" --arith "$arith" --seed "$seed" > "$file.tmp"
        mv "$file.tmp" "$file"
    done
done
python3 scripts/lns_mlp_summary.py "$out" > "$out/summary.md"
cat "$out/summary.md"
