#!/bin/bash
# The transformer in many formats (RESULTS.md): runs the sweep examples/sweeps/transformer.toml
# (one point at a time; re-running skips finished points and resumes interrupted ones), writes
# its report, the curves of each seed's runs (`qcandle compare`) and a table of the final
# test top-1 and test loss, mean ± sample standard deviation over the seeds, into
# results/sweeps/transformer/.
# Usage: scripts/transformer_results.sh [--report-only]   (--report-only: no training, the
# report and tables of the points run so far)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${QCANDLE_BIN:-target/release/qcandle}
spec=examples/sweeps/transformer.toml
out=results/sweeps/transformer
epochs=$(sed -n 's/^epochs = //p' "$spec")
configs=(float32 bf16 fp8 posit_16_1 posit_8_0 mxfp8 mxfp6 mxfp4)
if [ "${1:-}" != "--report-only" ]; then
  "$bin" sweep run "$spec" --workers 1 || echo "some points failed: the report lists them" >&2
fi
"$bin" sweep report "$spec" > /dev/null
rm -rf "$out"
mkdir -p "$out"
cp sweeps/transformer/report.md sweeps/transformer/report.csv "$out/"
for seed in 0 1 2; do
  runs=()
  for c in "${configs[@]}"; do
    r="sweeps/transformer/runs/s$seed-$c"
    if [ -f "$r/run.json" ]; then runs+=("$r"); fi
  done
  if [ ${#runs[@]} -eq 0 ]; then continue; fi
  "$bin" compare "${runs[@]}" --plot "$out/curves-s$seed.png" \
    --title "transformer on modadd, seed $seed" > "$out/compare-s$seed.md"
done
for c in "${configs[@]}"; do
  for seed in 0 1 2; do
    f="sweeps/transformer/runs/s$seed-$c/metrics.csv"
    if [ -f "$f" ]; then cp "$f" "$out/$c-s$seed.csv"; fi
  done
done
# Last epoch's test top-1 and test loss per config: mean ± sample sd over the seeds whose
# run finished every epoch (a run stopped earlier, by a NaN loss or by the end of the
# compute budget, is listed with its last epoch and left out of the mean).
{
  echo "| config | seeds finished | test top-1 % | test loss | top-1 per seed |"
  echo "|---|---|---|---|---|"
  for c in "${configs[@]}"; do
    for seed in 0 1 2; do
      if [ -f "$out/$c-s$seed.csv" ]; then echo "$seed,$(tail -n 1 "$out/$c-s$seed.csv")"; fi
    done | awk -F, -v c="$c" -v epochs="$epochs" '
      {
        if ($2 == epochs) { n++; t[n] = $5; l[n] = $4; st += $5; sl += $4; v = "s" $1 " " $5 }
        else { v = "s" $1 " " $5 " (stopped after epoch " $2 ")" }
        per = per (NR > 1 ? ", " : "") v
      }
      END {
        if (n == 0) { printf "| %s | 0 | - | - | %s |\n", c, (NR ? per : "-"); exit }
        mt = st / n; ml = sl / n
        for (i = 1; i <= n; i++) { vt += (t[i] - mt) ^ 2; vl += (l[i] - ml) ^ 2 }
        if (n == 1) { printf "| %s | 1 | %.2f | %.3f | %s |\n", c, mt, ml, per; exit }
        printf "| %s | %d | %.2f ± %.2f | %.3f ± %.3f | %s |\n", c, n, mt, sqrt(vt / (n - 1)), ml, sqrt(vl / (n - 1)), per
      }'
  done
  echo
  # Per run: the first epoch above 2% test top-1 (leaving chance, about 1%), the first at or
  # above 90%, the best top-1 and its epoch.
  echo "| config | seed | epochs run | first epoch > 2% | first epoch >= 90% | best top-1 % (epoch) |"
  echo "|---|---|---|---|---|---|"
  for c in "${configs[@]}"; do
    for seed in 0 1 2; do
      f="$out/$c-s$seed.csv"
      if [ ! -f "$f" ]; then continue; fi
      awk -F, -v c="$c" -v s="$seed" '
        NR > 1 {
          if (left == "" && $4 > 2) left = $1
          if (ninety == "" && $4 >= 90) ninety = $1
          if (best == "" || $4 > best) { best = $4; at = $1 }
          last = $1
        }
        END { printf "| %s | %s | %s | %s | %s | %s (%s) |\n", c, s, last, (left ? left : "-"), (ninety ? ninety : "-"), best, at }' "$f"
    done
  done
} > "$out/table.md"
