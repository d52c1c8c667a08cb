#!/usr/bin/env bash
# Trains LeNet-5 with the paper's recipe (Adam lr 1e-3, batch 128, inputs in [-1, 1], no
# regularisation) on full Fashion-MNIST and MNIST in every config of RESULTS.md, then writes
# the comparison tables and plots. Runs resume: re-running continues unfinished ones.
# Usage: scripts/results.sh [EPOCHS] [MNIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-10}"
mnist="${2:-../shared/data/mnist}"
configs=(float32 bf16 posit32 "posit<16,1>" "posit<8,0>")
# QCANDLE_BIN: a prebuilt binary (default: build this checkout).
bin="${QCANDLE_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --quiet
    bin=target/release/qcandle
fi
mkdir -p results
for data in fashion-mnist mnist; do
    dir_arg=()
    [ "$data" = mnist ] && dir_arg=(--data-dir "$mnist")
    runs=()
    for config in "${configs[@]}"; do
        # The run's directory: the config with <, > and , made underscores (posit_16_1).
        label=$(printf '%s' "$config" | tr '<>,' '___' | sed 's/_*$//')
        out="runs/lenet5-$data-$label"
        "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" --config "$config" \
            --epochs "$epochs" --batch 128 --lr 1e-3 --optimizer adam --seed 0 --out "$out" --quiet \
            > /dev/null || echo "$out failed (its finished epochs are kept)" >&2
        runs+=("$out")
    done
    "$bin" compare "${runs[@]}" --plot "results/lenet5-$data.png" \
        --title "LeNet-5 on $data" > "results/lenet5-$data.md"
done
