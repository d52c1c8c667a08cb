#!/bin/bash
# The posit thesis's dataset-reduction curve (RESULTS.md): float32 lenet5-classic on the
# first N MNIST training images for N = 500, 1000, 2500, 5000, 10000 and 60000 (all), 7
# epochs, batch 32, Adam lr 1e-3, seed 0, each evaluated on the full 10,000-image test set
# after every epoch. Then one epoch on all 60,000 images in posit<16,2> (every category), to
# set our time per epoch on the full set beside the thesis's. Writes runs/lenet5-classic-mnist-<N>-*/,
# results/metrics/ (per-epoch metrics), results/thesis-dataset-reduction.{md,png} (the
# curves by `qcandle compare`) and results/thesis-dataset-reduction-table.md (top-1 per
# epoch). Runs resume: re-running continues unfinished ones.
# Usage: scripts/thesis_dataset_reduction.sh MNIST_DIR
set -euo pipefail
mnist_dir=${1:?usage: $0 MNIST_DIR}
bin=${QCANDLE_BIN:-target/release/qcandle}
sizes=(500 1000 2500 5000 10000 60000)
mkdir -p results/metrics
train() { # train NAME CONFIG LIMIT EPOCHS
  "$bin" train --model lenet5-classic --data mnist --data-dir "$mnist_dir" --train-limit "$3" \
    --epochs "$4" --batch 32 --lr 1e-3 --optimizer adam --config "$2" --seed 0 --quiet \
    --out "runs/$1" > /dev/null
  cp "runs/$1/metrics.csv" "results/metrics/$1.csv"
}
runs=()
for n in "${sizes[@]}"; do
  train "lenet5-classic-mnist-$n-float32-s0" float32 "$n" 7
  runs+=("runs/lenet5-classic-mnist-$n-float32-s0")
done
train lenet5-classic-mnist-60000-posit16-s0-1epoch posit16 60000 1
"$bin" compare "${runs[@]}" --plot results/thesis-dataset-reduction.png \
  --title "lenet5-classic, float32, MNIST: 500 to 60000 training images" \
  > results/thesis-dataset-reduction.md
# Test top-1 (%) per epoch, one row per training-set size, and the full-set epochs.
{
  echo "| training images | epoch 1 | 2 | 3 | 4 | 5 | 6 | 7 | seconds per epoch (mean) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for n in "${sizes[@]}"; do
    awk -F, -v n="$n" 'NR > 1 { row = row " | " $4; s += $6; e++ }
      END { printf "| %s%s | %.1f |\n", n, row, s / e }' \
      "results/metrics/lenet5-classic-mnist-$n-float32-s0.csv"
  done
  for cfg in posit16; do
    awk -F, -v c="$cfg" 'NR == 2 { printf "| 60000 (%s, 1 epoch) | %s | | | | | | | %.1f |\n", c, $4, $6 }' \
      "results/metrics/lenet5-classic-mnist-60000-$cfg-s0-1epoch.csv"
  done
} > results/thesis-dataset-reduction-table.md
