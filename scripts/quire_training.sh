#!/usr/bin/env bash
# LeNet-5 trained in posit arithmetic (RESULTS.md, "LeNet-5 trained in posit arithmetic"):
# Deep PeNSieve's recipe (Adam lr 1e-3, batch 128, 10 epochs, seed 0) on full Fashion-MNIST
# and MNIST, every category in one posit format and every layer's GEMMs, forward and
# backward, in that posit's arithmetic: with a quire (`quire-*`) or rounded after every
# multiply and add (`naive-*`), examples/configs/<run>.toml. Writes
# runs/lenet5-<data>-<run>/ and copies each run's per-epoch metrics to results/metrics/.
# Runs resume: re-running continues unfinished ones.
# Usage: scripts/quire_training.sh [MNIST_DIR] [RUN ...]
#   RUN: quire-posit_16_1, quire-posit_8_0, quire-posit_32_2, naive-posit_16_1,
#   naive-posit_32_2 (default: the first two)
set -euo pipefail
cd "$(dirname "$0")/.."
mnist="${1:-../shared/data/mnist}"
shift || true
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(quire-posit_16_1 quire-posit_8_0)
bin="${QCANDLE_BIN:-target/release/qcandle}"
mkdir -p results/metrics
for run in "${runs[@]}"; do
    config="examples/configs/$run.toml"
    [ -f "$config" ] || { echo "no config $config" >&2; exit 2; }
    for data in fashion-mnist mnist; do
        dir_arg=()
        [ "$data" = mnist ] && dir_arg=(--data-dir "$mnist")
        name="lenet5-$data-$run"
        "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" \
            --config "$config" --epochs 10 --batch 128 --lr 1e-3 \
            --optimizer adam --seed 0 --out "runs/$name" --quiet > /dev/null
        cp "runs/$name/metrics.csv" "results/metrics/$name.csv"
    done
done
