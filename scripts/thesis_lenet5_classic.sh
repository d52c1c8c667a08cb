#!/bin/bash
# The posit thesis's LeNet-5 experiment (RESULTS.md): lenet5-classic (TanH, average pooling)
# on 5000 MNIST and 2500 Fashion-MNIST training images, 7 epochs, batch 32, Adam lr 1e-3,
# float32 against posit<16,2> in every category, with f32 sums (`posit16`) and with every
# multiply and add rounded (`posit16-naive`, examples/configs/posit16-naive.toml), seeds 0 and
# 1 (the thesis averages 2 runs).
# Writes runs/lenet5-classic-<data>-<images>-<config>-s<seed>/ and copies each run's
# per-epoch metrics to results/metrics/, and writes the table results/thesis-lenet5-classic.md
# (each seed and their mean). Runs resume: re-running continues unfinished ones.
# Usage: scripts/thesis_lenet5_classic.sh MNIST_DIR
set -euo pipefail
mnist_dir=${1:?usage: $0 MNIST_DIR}
bin=${QCANDLE_BIN:-target/release/qcandle}
mkdir -p results/metrics
for seed in 0 1; do
  for cfg in float32 posit16 posit16-naive; do
    config="$cfg"
    [ "$cfg" = posit16-naive ] && config=examples/configs/posit16-naive.toml
    for data in mnist fashion-mnist; do
      if [ "$data" = mnist ]; then limit=5000; dir_arg=(--data-dir "$mnist_dir")
      else limit=2500; dir_arg=(); fi
      name="lenet5-classic-$data-$limit-$cfg-s$seed"
      "$bin" train --model lenet5-classic --data "$data" "${dir_arg[@]}" --train-limit "$limit" \
        --epochs 7 --batch 32 --lr 1e-3 --optimizer adam --config "$config" --seed "$seed" --quiet \
        --out "runs/$name" > /dev/null
      cp "runs/$name/metrics.csv" "results/metrics/$name.csv"
    done
  done
done
# Top-1, top-5 and test loss after the last epoch (each seed and the mean of the two), and
# the mean seconds of an epoch's training steps over both runs.
{
  echo "| data (training images) | config | top-1 seed 0 | top-1 seed 1 | top-1 mean | top-5 mean | test loss mean | seconds per epoch |"
  echo "|---|---|---|---|---|---|---|---|"
  for data in mnist-5000 fashion-mnist-2500; do
    for cfg in float32 posit16 posit16-naive; do
      files=("results/metrics/lenet5-classic-$data-$cfg-s0.csv" "results/metrics/lenet5-classic-$data-$cfg-s1.csv")
      { tail -q -n 1 "${files[@]}"; tail -q -n +2 "${files[@]}"; } | awk -F, -v data="$data" -v cfg="$cfg" '
        NR <= 2 { t[NR] = $4; t5 += $5; l += $3; next }
        { s += $6; e++ }
        END { printf "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.4f | %.1f |\n",
                data, cfg, t[1], t[2], (t[1] + t[2]) / 2, t5 / 2, l / 2, s / e }'
    done
  done
} > results/thesis-lenet5-classic.md
