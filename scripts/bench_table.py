#!/usr/bin/env python3
"""Summarise criterion results of `cargo bench --bench quantize` as markdown tables, one per
tensor size: for each case the allocating call (`quantize`) against candle's allocating
`copy`, and the in-place call (`quantize_`) against `memcpy` (a copy into a preallocated
buffer, the memory-bandwidth limit), all from the same group (run). GB/s counts 8 bytes per
f32 element (one read, one write). Usage: python3 scripts/bench_table.py [target/criterion]"""
import json
import pathlib
import sys

IN_PLACE = " in-place"

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
for group in sorted(root.glob("quantize_2_*")):
    log2 = int(group.name.split("_")[-1])
    n = 1 << log2
    rows = {}
    for est in group.rglob("new/estimates.json"):
        bench = json.loads((est.parent / "benchmark.json").read_text())
        name = bench["function_id"] + ("/" + bench["value_str"] if bench.get("value_str") else "")
        rows[name] = json.loads(est.read_text())["mean"]["point_estimate"] * 1e-9
    if "copy" not in rows and "memcpy" not in rows:
        continue

    def cell(name, base):
        t = rows.get(name)
        if t is None:
            return "| | |"
        ratio = f"{rows[base] / t:.2f}x" if base in rows else ""
        return f"| {t*1e3:.2f} | {8*n/t/1e9:.2f} | {ratio}"

    print(f"\n2^{log2} f32 elements\n")
    print("| op | alloc (ms) | alloc GB/s | alloc / copy | in place (ms) | in place GB/s | in place / memcpy |")
    print("|---|---|---|---|---|---|---|")
    for base in ("memcpy", "copy"):
        if base in rows:
            t = rows[base]
            side = (f"| {t*1e3:.2f} | {8*n/t/1e9:.2f} | 1.00x | | | " if base == "copy"
                    else f"| | | | {t*1e3:.2f} | {8*n/t/1e9:.2f} | 1.00x ")
            print(f"| {base} {side}|")
    cases = sorted({k.removesuffix(IN_PLACE) for k in rows if k not in ("copy", "memcpy")})
    for case in cases:
        print(f"| {case} {cell(case, 'copy')} {cell(case + IN_PLACE, 'memcpy')} |")
