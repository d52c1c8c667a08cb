#!/usr/bin/env bash
# Post-training quantization of the LeNet-5 models trained in float32 and posit<32,2> on full
# Fashion-MNIST and MNIST (the runs of scripts/results.sh; missing ones are trained here, and
# unfinished ones resume), evaluated in float32, float16, int8 and posit<8,0>, posit<8,2>,
# posit<16,1> (naive and quire). Writes results/ptq/lenet5-<data>-<config>.{md,csv}.
# Usage: scripts/ptq_results.sh [EPOCHS] [MNIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-10}"
mnist="${2:-../shared/data/mnist}"
# QCANDLE_BIN: a prebuilt binary (default: build this checkout).
bin="${QCANDLE_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --quiet
    bin=target/release/qcandle
fi
mkdir -p results/ptq
for data in fashion-mnist mnist; do
    dir_arg=()
    [ "$data" = mnist ] && dir_arg=(--data-dir "$mnist")
    for config in float32 posit32; do
        run="runs/lenet5-$data-$config"
        "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" --config "$config" \
            --epochs "$epochs" --batch 128 --lr 1e-3 --optimizer adam --seed 0 --out "$run" --quiet \
            > /dev/null
        "$bin" ptq --model "$run/model.safetensors" --arch lenet5 --data "$data" "${dir_arg[@]}" \
            --format "posit<8,0>" --format "posit<8,2>" --format "posit<16,1>" --out "$run/ptq"
        cp "$run/ptq/ptq.md" "results/ptq/lenet5-$data-$config.md"
        cp "$run/ptq/ptq.csv" "results/ptq/lenet5-$data-$config.csv"
    done
done
