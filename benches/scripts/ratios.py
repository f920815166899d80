#!/usr/bin/env python3
"""Print criterion's latest mean per benchmark and the peer/kvbm ratios.

Usage: python3 benches/scripts/ratios.py [GROUP_PREFIX ...]
Reads target/criterion/<group>/<function>/<param>/new/estimates.json.
"""
import json
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parents[2] / "target" / "criterion"
prefixes = sys.argv[1:]
rows = {}
for est in sorted(root.glob("**/new/estimates.json")):
    parts = est.relative_to(root).parts[:-2]
    if len(parts) < 3:
        continue
    group, who, param = "/".join(parts[:-2]), parts[-2], parts[-1]
    if prefixes and not any(group.startswith(p) for p in prefixes):
        continue
    bench = json.loads((est.parent / "benchmark.json").read_text())
    throughput = bench.get("throughput") or {}
    per = throughput.get("Elements") or throughput.get("Bytes") or 1
    mean_ns = json.loads(est.read_text())["mean"]["point_estimate"]
    rows.setdefault((group, param), {})[who] = (mean_ns, per)

for (group, param), sides in sorted(rows.items()):
    ours = sides.get("kvbm")
    line = f"{group}/{param}:"
    for who, (ns, per) in sorted(sides.items()):
        line += f"  {who} {ns / per:,.1f} ns/elem"
    for who, (ns, per) in sorted(sides.items()):
        if ours and who != "kvbm":
            line += f"  [{who}/kvbm {ns / ours[0]:.1f}x]"
    print(line)
