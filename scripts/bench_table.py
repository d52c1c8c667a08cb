#!/usr/bin/env python3
"""Summarise criterion results of `cargo bench --bench quantize` as a markdown table:
mean time, GB/s (8 bytes moved per f32 element), elements/s, and the ratio to `copy` in the
same group. Usage: python3 scripts/bench_table.py [target/criterion]"""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
for group in sorted(root.glob("quantize_2_*")):
    log2 = int(group.name.split("_")[-1])
    n = 1 << log2
    rows = {}
    for est in group.rglob("new/estimates.json"):
        bench = json.loads((est.parent / "benchmark.json").read_text())
        name = bench["function_id"] + ("/" + bench["value_str"] if bench.get("value_str") else "")
        rows[name] = json.loads(est.read_text())["mean"]["point_estimate"] * 1e-9
    if "copy" not in rows:
        continue
    base = rows["copy"]
    print(f"\n2^{log2} f32 elements\n")
    print("| op | time (ms) | GB/s | Gelem/s | ratio to copy |")
    print("|---|---|---|---|---|")
    for name, t in sorted(rows.items(), key=lambda kv: (kv[0] != "copy", kv[0])):
        print(f"| {name} | {t*1e3:.2f} | {8*n/t/1e9:.2f} | {n/t/1e9:.3f} | {base/t:.2f}x |")
