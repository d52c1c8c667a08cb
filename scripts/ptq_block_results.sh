#!/usr/bin/env bash
# Post-training quantization of the float32-trained LeNet-5 models of scripts/results.sh (full
# Fashion-MNIST and MNIST; missing runs are trained here, unfinished ones resume) to the
# block-scaled formats: every MX element type and NVFP4, operands blocked along the input
# channels with f32 sums. Writes results/ptq/lenet5-<data>-float32-blocks.{md,csv}.
# Usage: scripts/ptq_block_results.sh [EPOCHS] [MNIST_DIR]
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
    run="runs/lenet5-$data-float32"
    "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" --config float32 \
        --epochs "$epochs" --batch 128 --lr 1e-3 --optimizer adam --seed 0 --out "$run" --quiet \
        > /dev/null
    formats=()
    for f in mxfp8_e4m3 mxfp8_e5m2 mxfp6_e3m2 mxfp6_e2m3 mxfp4_e2m1 mxint8 nvfp4; do
        formats+=(--format "$f")
    done
    "$bin" ptq --model "$run/model.safetensors" --arch lenet5 --data "$data" "${dir_arg[@]}" \
        "${formats[@]}" --out "$run/ptq-blocks"
    cp "$run/ptq-blocks/ptq.md" "results/ptq/lenet5-$data-float32-blocks.md"
    cp "$run/ptq-blocks/ptq.csv" "results/ptq/lenet5-$data-float32-blocks.csv"
done
