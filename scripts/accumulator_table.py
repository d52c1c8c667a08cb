#!/usr/bin/env python3
"""The accumulator table from a sweep directory of examples/sweeps/accumulators.toml
(scripts/accumulator_table.sh): test top-1 after the last epoch per operand config and
`accumulate` setting (seed 0, and where more seeds ran, their mean ± sample standard
deviation and range), the
per-epoch test top-1 and train loss of every run, the mean seconds of a training epoch,
and which runs ended with bit-identical models (same SHA-256 of model.safetensors).
Usage: python3 scripts/accumulator_table.py [SWEEP_DIR (default sweeps/accumulators)]"""
import csv
import json
import pathlib
import statistics
import sys

CONFIGS = [
    ("configs/fp8-e4m3.toml", "e4m3 everywhere"),
    ("configs/fp8-e5m2.toml", "e5m2 everywhere"),
    ("configs/fp8-split.toml", "FP8 split (e4m3 W/A, e5m2 E/G)"),
]
ACCUMULATE = [
    ("f32", "f32"),
    ("naive:float<8,23>", "naive:fp32"),
    ("naive:bf16", "naive:bf16"),
    ("naive:fp16", "naive:fp16"),
    ("fma:float<8,23>", "fma:fp32"),
    ("fma:bf16", "fma:bf16"),
    ("fma:fp16", "fma:fp16"),
]

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "sweeps/accumulators")
points = list(csv.DictReader((root / "report.csv").open()))


def metrics(run):
    path = root / "runs" / run / "metrics.csv"
    return list(csv.DictReader(path.open())) if path.exists() else []


def failure(run):
    path = root / "failed" / f"{run}.txt"
    return path.read_text().splitlines()[0] if path.exists() else ""


def model_digest(run):
    path = root / "runs" / run / "run.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("files", {}).get("model.safetensors")


def cell(config, acc):
    runs = [p for p in points if p["config"] == config and p["accumulate"] == acc]
    if not runs:
        return "not in the spec"
    done = [p for p in runs if p["status"] == "finished"]
    parts = []
    first = [p for p in done if p["seed"] == "0"]
    if first:
        parts.append(first[0]["top1"])
    if len(done) > 1:
        top1 = [float(p["top1"]) for p in done]
        parts.append(
            f"{len(done)} seeds: {statistics.mean(top1):.2f} ± {statistics.stdev(top1):.2f}, "
            f"{min(top1):.2f}-{max(top1):.2f}"
        )
    for p in runs:
        if p["status"] == "finished":
            continue
        rows = metrics(p["run"])
        why = failure(p["run"])
        state = p["status"] + (f" after epoch {rows[-1]['epoch']}" if rows else "")
        parts.append(f"s{p['seed']} {state}" + (f": {why}" if why else ""))
    return "; ".join(parts)


print("### Test top-1 after the last epoch (%): seed 0; where more seeds ran, their mean ± sample standard deviation and range\n")
print("| operands | " + " | ".join(label for _, label in ACCUMULATE) + " |")
print("|---|" + "---|" * len(ACCUMULATE))
for config, label in CONFIGS:
    print(f"| {label} | " + " | ".join(cell(config, acc) for acc, _ in ACCUMULATE) + " |")

print("\n### Per epoch: test top-1 (%) / train loss, and seconds of a training epoch\n")
print("| run | epochs | top-1 per epoch | train loss per epoch | s per epoch |")
print("|---|---|---|---|---|")
for p in points:
    rows = metrics(p["run"])
    if not rows:
        continue
    top1 = " ".join(r["top1"] for r in rows)
    loss = " ".join(r["train_loss"] for r in rows)
    secs = statistics.mean(float(r["seconds"]) for r in rows)
    print(f"| {p['run']} | {len(rows)} | {top1} | {loss} | {secs:.1f} |")

groups = {}
for p in points:
    digest = model_digest(p["run"]) if p["status"] == "finished" else None
    if digest:
        groups.setdefault(digest, []).append(p["run"])
same = [runs for runs in groups.values() if len(runs) > 1]
print("\n### Runs that ended with bit-identical models\n")
if same:
    for runs in same:
        print("- " + ", ".join(runs))
else:
    print("- none")
