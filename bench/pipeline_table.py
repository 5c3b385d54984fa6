#!/usr/bin/env python3
"""Markdown tables from bench_pipeline's JSON (--benchmark_out=FILE --benchmark_out_format=json).

  python3 bench/pipeline_table.py bench_pipeline.json

Table 1, measured at p = 2: per m, each schedule's measured bubble / theory, tokens/s,
and the simulator's pipeline time against the measured one. Table 2, simulated p = 4
and 8: bubble / theory and tokens/s per schedule."""
import json
import sys

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zero-bubble"]


def rows(path):
    out = []
    for b in json.load(open(path))["benchmarks"]:
        label = b.get("label", "")
        if not label or b.get("error_occurred"):
            continue
        parts = label.split()
        out.append(dict(schedule=parts[0], p=int(parts[1][2:]), simulated=parts[2] == "simulated", **b))
    return out


def pct(x):
    return f"{100 * x:.1f}"


def main(path):
    data = rows(path)
    measured = [r for r in data if not r["simulated"]]
    print("Measured, p = 2 (bubble % measured / theory; tokens/s; simulated vs measured pipeline time):\n")
    print("| m | " + " | ".join(SCHEDULES) + " |")
    print("|---|" + "---|" * len(SCHEDULES))
    for m in range(1, 17):
        cells = []
        for s in SCHEDULES:
            r = next((r for r in measured if r["schedule"] == s and int(r["m"]) == m), None)
            cells.append("" if r is None else
                         f"{pct(r['bubble'])} / {pct(r['bubble_theory'])}; {r['tokens_per_s']:.0f}; "
                         f"{100 * r['sim_error']:+.1f}%")
        print(f"| {m} | " + " | ".join(cells) + " |")
    errs = [abs(r["sim_error"]) for r in measured]
    gaps = [abs(r["bubble"] - r["bubble_theory"]) for r in measured]
    print(f"\nsimulator vs measured pipeline time: |error| median {100 * sorted(errs)[len(errs) // 2]:.1f}%, "
          f"max {100 * max(errs):.1f}%, within 10% on {sum(e <= 0.1 for e in errs)} of {len(errs)} rows; "
          f"measured bubble within 5 points of theory on {sum(g <= 0.05 for g in gaps)} of {len(gaps)} rows")
    for p in (4, 8):
        sim = [r for r in data if r["simulated"] and r["p"] == p]
        if not sim:
            continue
        print(f"\nSimulated, p = {p} (bubble % simulated / theory; tokens/s):\n")
        print("| m | " + " | ".join(SCHEDULES) + " |")
        print("|---|" + "---|" * len(SCHEDULES))
        for m in range(1, 17):
            cells = []
            for s in SCHEDULES:
                r = next((r for r in sim if r["schedule"] == s and int(r["m"]) == m), None)
                cells.append("" if r is None else f"{pct(r['bubble'])} / {pct(r['bubble_theory'])}; {r['tokens_per_s']:.0f}")
            if any(cells):
                print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
