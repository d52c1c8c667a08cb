#!/bin/bash
# The posit thesis's LeNet-5 experiment (RESULTS.md): lenet5-classic (TanH, average pooling)
# on 5000 MNIST and 2500 Fashion-MNIST training images, 7 epochs, batch 32, Adam lr 1e-3,
# float32 against posit<16,2> in every category, seeds 0 and 1 (the thesis averages 2 runs).
# Writes runs/lenet5-classic-<data>-<images>-<config>-s<seed>/ and copies each run's
# per-epoch metrics to results/metrics/. Runs resume: re-running continues unfinished ones.
# Usage: scripts/thesis_lenet5_classic.sh MNIST_DIR
set -euo pipefail
mnist_dir=${1:?usage: $0 MNIST_DIR}
bin=${QCANDLE_BIN:-target/release/qcandle}
mkdir -p results/metrics
for seed in 0 1; do
  for cfg in float32 posit16; do
    for data in mnist fashion-mnist; do
      if [ "$data" = mnist ]; then limit=5000; dir_arg=(--data-dir "$mnist_dir")
      else limit=2500; dir_arg=(); fi
      name="lenet5-classic-$data-$limit-$cfg-s$seed"
      "$bin" train --model lenet5-classic --data "$data" "${dir_arg[@]}" --train-limit "$limit" \
        --epochs 7 --batch 32 --lr 1e-3 --optimizer adam --config "$cfg" --seed "$seed" --quiet \
        --out "runs/$name" > /dev/null
      cp "runs/$name/metrics.csv" "results/metrics/$name.csv"
    done
  done
done
