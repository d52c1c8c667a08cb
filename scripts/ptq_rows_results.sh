#!/usr/bin/env bash
# Post-training quantization of the float32-trained LeNet-5 models of scripts/ptq_results.sh
# (full Fashion-MNIST and MNIST; missing runs are trained here) with accumulator-format and
# LNS rows: e4m3, e5m2 and posit<8,0> with naive:fp16, naive:fp32 and fma:fp32 sums beside
# their naive (and quire) rows, and lns<8,3>, lns<12,6>, lns<16,10> with lns:ideal and
# lns:table sums. Writes results/ptq/lenet5-<data>-float32-rows.{md,csv}.
# Usage: scripts/ptq_rows_results.sh [EPOCHS] [MNIST_DIR] [DATASETS...]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-10}"
mnist="${2:-../shared/data/mnist}"
shift $(( $# < 2 ? $# : 2 ))
if [ $# -eq 0 ]; then datasets=(fashion-mnist mnist); else datasets=("$@"); fi
# QCANDLE_BIN: a prebuilt binary (default: build this checkout).
bin="${QCANDLE_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --quiet
    bin=target/release/qcandle
fi
mkdir -p results/ptq
for data in "${datasets[@]}"; do
    dir_arg=()
    [ "$data" = mnist ] && dir_arg=(--data-dir "$mnist")
    run="runs/lenet5-$data-float32"
    "$bin" train --model lenet5 --data "$data" "${dir_arg[@]}" --config float32 \
        --epochs "$epochs" --batch 128 --lr 1e-3 --optimizer adam --seed 0 --out "$run" --quiet \
        > /dev/null
    "$bin" ptq --model "$run/model.safetensors" --arch lenet5 --data "$data" "${dir_arg[@]}" \
        --format "e4m3 naive naive:fp16 naive:fp32 fma:fp32" \
        --format "e5m2 naive naive:fp16 naive:fp32 fma:fp32" \
        --format "posit<8,0> naive quire naive:fp16 naive:fp32 fma:fp32" \
        --format "lns<8,3> lns:ideal lns:table" \
        --format "lns<12,6> lns:ideal lns:table" \
        --format "lns<16,10> lns:ideal lns:table" \
        --out "$run/ptq-rows"
    cp "$run/ptq-rows/ptq.md" "results/ptq/lenet5-$data-float32-rows.md"
    cp "$run/ptq-rows/ptq.csv" "results/ptq/lenet5-$data-float32-rows.csv"
done
