#!/bin/bash
# The transformer in many formats (RESULTS.md): runs the sweep examples/sweeps/transformer.toml
# (one point at a time; re-running skips finished points and resumes interrupted ones), writes
# its report, the curves of each seed's runs (`qcandle compare`) and a table of the final
# test top-1 and test loss, mean ± sample standard deviation over the seeds, into
# results/sweeps/transformer/.
# Usage: scripts/transformer_results.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${QCANDLE_BIN:-target/release/qcandle}
spec=examples/sweeps/transformer.toml
out=results/sweeps/transformer
epochs=$(sed -n 's/^epochs = //p' "$spec")
configs=(float32 bf16 fp8 posit_16_1 posit_8_0 mxfp8 mxfp6 mxfp4)
"$bin" sweep run "$spec" --workers 1 || echo "some points failed: the report lists them" >&2
"$bin" sweep report "$spec" > /dev/null
mkdir -p "$out"
cp sweeps/transformer/report.md sweeps/transformer/report.csv "$out/"
for seed in 0 1 2; do
  runs=()
  for c in "${configs[@]}"; do
    r="sweeps/transformer/runs/$c-s$seed"
    if [ -f "$r/run.json" ]; then runs+=("$r"); fi
  done
  "$bin" compare "${runs[@]}" --plot "$out/curves-s$seed.png" \
    --title "transformer on modadd, seed $seed" > "$out/compare-s$seed.md"
done
for c in "${configs[@]}"; do
  for seed in 0 1 2; do
    f="sweeps/transformer/runs/$c-s$seed/metrics.csv"
    if [ -f "$f" ]; then cp "$f" "$out/$c-s$seed.csv"; fi
  done
done
# Last epoch's test top-1 and test loss per config: mean ± sample sd over the seeds.
{
  echo "| config | seeds | test top-1 % | test loss | top-1 per seed |"
  echo "|---|---|---|---|---|"
  for c in "${configs[@]}"; do
    for seed in 0 1 2; do
      if [ -f "$out/$c-s$seed.csv" ]; then tail -n 1 "$out/$c-s$seed.csv"; fi
    done | awk -F, -v c="$c" -v epochs="$epochs" '
      { t[NR] = $4; l[NR] = $3; st += $4; sl += $3; per = per (NR > 1 ? ", " : "") $4 ($1 < epochs ? " (stopped after epoch " $1 ")" : "") }
      END {
        if (NR == 0) { printf "| %s | 0 | - | - | - |\n", c; exit }
        mt = st / NR; ml = sl / NR
        for (i = 1; i <= NR; i++) { vt += (t[i] - mt) ^ 2; vl += (l[i] - ml) ^ 2 }
        if (NR == 1) { printf "| %s | 1 | %.2f | %.4f | %s |\n", c, mt, ml, per; exit }
        printf "| %s | %d | %.2f ± %.2f | %.4f ± %.4f | %s |\n", c, NR, mt, sqrt(vt / (NR - 1)), ml, sqrt(vl / (NR - 1)), per
      }'
  done
} > "$out/table.md"
