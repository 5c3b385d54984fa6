#!/usr/bin/env python3
"""Draws loss curves (train_gpt --out CSVs: step,loss) into one SVG, standard library only.

    python3 bench/loss_curves_svg.py OUT.svg "TITLE" LABEL=FILE.csv [LABEL=FILE.csv ...]
"""
import csv
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    out, title, specs = argv[1], argv[2], argv[3:]
    curves = []
    for spec in specs:
        label, _, path = spec.partition("=")
        with open(path, newline="") as f:
            rows = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]
        curves.append((label, rows))
    steps = max(s for _, rows in curves for s, _ in rows)
    lo = min(v for _, rows in curves for _, v in rows)
    hi = max(v for _, rows in curves for _, v in rows)
    lo, hi = math.floor(lo * 2) / 2, math.ceil(hi * 2) / 2
    w, h, left, right, top, bottom = 720, 420, 60, 20, 40, 50
    pw, ph = w - left - right, h - top - bottom

    def x(step):
        return left + pw * (step - 1) / max(1, steps - 1)

    def y(loss):
        return top + ph * (hi - loss) / (hi - lo)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    tick = 0.5 if hi - lo <= 6 else 1.0
    v = lo
    while v <= hi + 1e-9:
        svg.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += tick
    for s in range(0, steps + 1, max(1, steps // 8)):
        if s == 0:
            continue
        svg.append(f'<text x="{x(s):.1f}" y="{top + ph + 18}" text-anchor="middle">{s}</text>')
    svg.append(f'<text x="{left + pw / 2}" y="{h - 8}" text-anchor="middle">step</text>')
    svg.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    for i, (label, rows) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in rows)
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{points}"/>')
        ly = top + 16 + 16 * i
        svg.append(f'<line x1="{left + pw - 230}" x2="{left + pw - 210}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        svg.append(f'<text x="{left + pw - 204}" y="{ly + 4}">{label}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv)
