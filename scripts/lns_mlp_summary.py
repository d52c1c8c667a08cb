#!/usr/bin/env python3
"""Summarise results/lns-mlp/<arith>-seed<S>.csv (scripts/lns_mlp_results.sh): per-epoch mean
and sample standard deviation of the test accuracy over the seeds present, beside the LNS
proposal's table, and the mean wall-clock seconds of a run (training plus testing).
Usage: python3 scripts/lns_mlp_summary.py [DIR]"""
import csv
import pathlib
import statistics
import sys

PAPER = {
    "lns": [0.9064, 0.9249, 0.9353, 0.9428, 0.9483, 0.9530, 0.9564],
    "f32": [0.9067, 0.9260, 0.9368, 0.9440, 0.9492, 0.9534, 0.9569],
}

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "results/lns-mlp")
runs = {}
for arith in ("f32", "lns"):
    for path in sorted(root.glob(f"{arith}-seed*.csv")):
        rows = list(csv.DictReader(path.open()))
        if rows:
            runs.setdefault(arith, []).append(rows)


def fmt(values):
    if len(values) > 1:
        return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"
    return f"{values[0]:.4f}"


print("| epoch | paper LNS | ours LNS | paper float | ours float32 |")
print("|---|---|---|---|---|")
epochs = max((len(r) for rs in runs.values() for r in rs), default=0)
for e in range(epochs):
    cells = []
    for arith in ("lns", "f32"):
        vals = [float(r[e]["test_accuracy"]) for r in runs.get(arith, []) if len(r) > e]
        cells += [f"{PAPER[arith][e]:.4f}" if e < 7 else "", fmt(vals) if vals else ""]
    print(f"| {e + 1} | " + " | ".join(cells) + " |")
print()
for arith in ("lns", "f32"):
    rs = runs.get(arith, [])
    if not rs:
        continue
    totals = [sum(float(x["train_seconds"]) + float(x["test_seconds"]) for x in r) for r in rs]
    train = [sum(float(x["train_seconds"]) for x in r) for r in rs]
    print(
        f"- {arith}: {len(rs)} run(s); wall-clock per run (7 epochs, training + testing) "
        f"mean {statistics.mean(totals):.1f} s (training alone {statistics.mean(train):.1f} s)"
    )
