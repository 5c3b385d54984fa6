#!/usr/bin/env python3
"""dtensor's train_gpt against the PyTorch peer (torch_train_peer.py) on the same GPT, alternating.

    python3 -m venv .peer-venv && .peer-venv/bin/pip install torch numpy     # bench-only tool
    python3 bench/peers/compare_train.py --python .peer-venv/bin/python --rounds 3

Each round runs every configuration once, dtensor and PyTorch interleaved (A B A B ...), so load
drift on a shared machine hits both alike; the table reports, per configuration, the median and
the best over rounds of the per-run mean step time (steps after the warm-up), tokens/s from the
median, and peak memory per rank: dtensor's tensor bytes (its allocator's counters) and
PyTorch's MemTracker peak (parameters, gradients, optimizer state and activations), the
like-for-like pair; PyTorch's peak RSS is printed too. Model: vocab 256, dim 256, 4 layers,
4 heads, seq 128, global batch 8, AdamW, no clipping; the peer's docstring gives the
architecture. PyTorch is a benchmark tool here, never a dependency of dtensor.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--python", default=os.path.join(ROOT, ".peer-venv", "bin", "python"))
ap.add_argument("--train-gpt", default=os.path.join(ROOT, "build", "examples", "train_gpt"))
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--configs", default="single:fp32,ddp2:fp32,single:bf16",
                help="comma-separated MODE:PRECISION, MODE in single, ddp2, fsdp2, tp2, or single1 (one "
                     "process and one thread, both programs pinned to CPU 0: kernel efficiency without "
                     "threading, which holds up on a loaded machine)")
ap.add_argument("--json", help="also write the raw runs here")
A = ap.parse_args()

TMP = tempfile.mkdtemp(prefix="compare_train_")
MODEL = dict(vocab=256, dim=256, layers=4, heads=4, seq=128, batch=8)


def run(cmd, env=None, one_core=False):
    if one_core:
        cmd = ["taskset", "-c", "0"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def dtensor_run(mode, precision):
    one_core = mode == "single1"
    dp = 1 if mode in ("single", "single1") else int(mode[-1])
    if mode not in ("single", "single1", "ddp2"):
        return None  # dtensor's train_gpt has data parallelism only
    cmd = [A.train_gpt, "--vocab", str(MODEL["vocab"]), "--dim", str(MODEL["dim"]), "--layers", str(MODEL["layers"]),
           "--heads", str(MODEL["heads"]), "--seq-len", str(MODEL["seq"]), "--batch", str(MODEL["batch"]),
           "--precision", precision, "--clip", "0", "--log", "plain", "--warmup", "0",
           "--steps", str(A.warmup + A.steps), "--mesh", f"dp={dp}", "--out", os.path.join(TMP, "loss.csv")]
    env = dict(os.environ, DTENSOR_NUM_THREADS="1") if one_core else None
    out = run(cmd, env, one_core)
    steps = [float(m.group(1)) for m in re.finditer(r"^step\s+\d+/\d+ .*?\|\s*([\d.]+) ms", out, re.M)]
    peaks = [float(m.group(1)) for m in re.finditer(r"peak mem r0 ([\d.]+) MiB", out)]
    measured = steps[A.warmup:]
    return dict(lib="dtensor", header=out.splitlines()[0], ms=statistics.mean(measured),
                step_min=min(measured), peak_mib=max(peaks[A.warmup:]) if peaks else None)


def torch_run(mode, precision):
    one_core = mode == "single1"
    peer_mode, world = ("single", 1) if mode in ("single", "single1") else (mode[:-1], int(mode[-1]))
    cmd = [A.python, os.path.join(HERE, "torch_train_peer.py"), peer_mode, str(world), "--steps", str(A.steps),
           "--warmup", str(A.warmup), "--precision", precision]
    env = dict(os.environ, PEER_CORES="1" if one_core else str(os.cpu_count()))
    line = [l for l in run(cmd, env, one_core).splitlines() if l.startswith("{")][-1]
    r = json.loads(line)
    mt = r["memtracker_peak_mib"][0]
    return dict(lib="torch", header=f"PyTorch {r['version']}, {r['threads']} threads per process",
                ms=r["ms_per_step"], step_min=r["step_ms_min"], peak_mib=mt if isinstance(mt, float) else None,
                rss_mib=max(r["peak_rss_mib"]))


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


configs = [tuple(c.split(":")) for c in A.configs.split(",")]
runs = {}
for r in range(A.rounds):
    for mode, precision in configs:
        for lib, fn in (("dtensor", dtensor_run), ("torch", torch_run)):
            res = fn(mode, precision)
            if res is None:
                continue
            runs.setdefault((mode, precision, lib), []).append(res)
            print(f"round {r + 1}: {lib:7s} {mode:6s} {precision}: {res['ms']:.1f} ms/step", file=sys.stderr, flush=True)

tokens = MODEL["batch"] * MODEL["seq"]
print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {A.rounds} rounds alternating, {A.steps} steps after {A.warmup} "
      f"warm-up per run")
for key, rs in runs.items():
    if key[2] == "dtensor":
        print(f"dtensor: {rs[0]['header']}")
        break
for key, rs in runs.items():
    if key[2] == "torch":
        print(f"peer: {rs[0]['header']}")
        break
print()
print("| config | program | ms/step median | ms/step best | tokens/s (median) | peak MiB per rank | vs PyTorch |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for mode, precision in configs:
    medians = {}
    for lib in ("torch", "dtensor"):
        rs = runs.get((mode, precision, lib))
        if rs:
            medians[lib] = statistics.median(x["ms"] for x in rs)
    for lib in ("torch", "dtensor"):
        rs = runs.get((mode, precision, lib))
        if not rs:
            continue
        med = medians[lib]
        best = min(x["ms"] for x in rs)
        peak = max((x["peak_mib"] for x in rs if x["peak_mib"] is not None), default=None)
        peak_s = f"{peak:.1f}" if peak is not None else "-"
        if lib == "torch" and rs[0].get("rss_mib"):
            peak_s += f" (RSS {rs[0]['rss_mib']:.0f})"
        ratio = f"{medians['torch'] / med:.2f}x" if lib == "dtensor" and "torch" in medians else ""
        print(f"| {mode} {precision} | {lib} | {med:.1f} | {best:.1f} | {tokens / med * 1e3:.0f} | {peak_s} | {ratio} |")
if A.json:
    with open(A.json, "w") as f:
        json.dump({f"{k[0]}:{k[1]}:{k[2]}": v for k, v in runs.items()}, f, indent=1)
