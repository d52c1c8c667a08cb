#!/usr/bin/env bash
# LeNet-5 trained in quire arithmetic (RESULTS.md, "Training in the formats' own
# arithmetic"): Deep PeNSieve's recipe (Adam lr 1e-3, batch 128, 10 epochs, seed 0) on full
# Fashion-MNIST and MNIST, every category in posit<16,1> or posit<8,0> and every layer's
# GEMMs, forward and backward, with a quire (examples/configs/quire-*.toml). Writes
# runs/lenet5-<data>-quire-<format>/ and copies each run's per-epoch metrics to
# results/metrics/. Runs resume: re-running continues unfinished ones.
# Usage: scripts/quire_training.sh [MNIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
mnist="${1:-../shared/data/mnist}"
bin="${QCANDLE_BIN:-target/release/qcandle}"
mkdir -p results/metrics
for label in posit_16_1 posit_8_0; do
    for data in fashion-mnist mnist; do
        dir_arg=()
        [ "$data" = mnist ] && dir_arg=(--data-dir "$mnist")
        name="lenet5-$data-quire-$label"
        "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" \
            --config "examples/configs/quire-$label.toml" --epochs 10 --batch 128 --lr 1e-3 \
            --optimizer adam --seed 0 --out "runs/$name" --quiet > /dev/null
        cp "runs/$name/metrics.csv" "results/metrics/$name.csv"
    done
done
