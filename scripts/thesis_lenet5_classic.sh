#!/bin/bash
# The posit thesis's LeNet-5 experiment (RESULTS.md): lenet5-classic (TanH, average pooling)
# on 5000 MNIST and 2500 Fashion-MNIST training images, 7 epochs, batch 32, Adam lr 1e-3,
# float32 against posit<16,2> in every category. Usage: scripts/thesis_lenet5_classic.sh MNIST_DIR
set -euo pipefail
mnist_dir=${1:?usage: $0 MNIST_DIR}
bin=${QCANDLE_BIN:-target/release/qcandle}
for cfg in float32 posit16; do
  "$bin" train --model lenet5-classic --data mnist --data-dir "$mnist_dir" --train-limit 5000 \
    --epochs 7 --batch 32 --lr 1e-3 --optimizer adam --config "$cfg" --seed 0 --quiet \
    --out "runs/lenet5-classic-mnist-5000-$cfg"
  "$bin" train --model lenet5-classic --data fashion-mnist --train-limit 2500 \
    --epochs 7 --batch 32 --lr 1e-3 --optimizer adam --config "$cfg" --seed 0 --quiet \
    --out "runs/lenet5-classic-fashion-mnist-2500-$cfg"
done
