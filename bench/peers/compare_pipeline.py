#!/usr/bin/env python3
"""dtensor's train_gpt --mesh pp=2 against torch.distributed.pipelining (torch_pipeline_peer.py) on the same GPT.
    python3 bench/peers/compare_pipeline.py --python .peer-venv/bin/python [--pairs 3]
For 1F1B and GPipe at m = 4 and 8 micro-batches, runs the two programs in turn (A B A B ...), so load drift
on a shared machine hits both alike, and prints each run's median step time (steps after 3 warm-up) and
the ratios per pair. Model: 8 blocks of width 128, 4 heads, vocab 256, untied head, 16 x 64 tokens per
step, AdamW, no clipping; both split it as embeddings + blocks 0-3 | blocks 4-7 + norm + head.
PyTorch is a benchmark tool here, never a dependency of dtensor."""
import argparse, json, os, re, statistics, subprocess, sys, tempfile
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--train-gpt", default=os.path.join(ROOT, "build", "examples", "train_gpt"))
ap.add_argument("--python", default=os.path.join(ROOT, ".peer-venv", "bin", "python"))
ap.add_argument("--pairs", type=int, default=3)
A = ap.parse_args()
TG = A.train_gpt
PY = A.python
PEER = os.path.join(HERE, "torch_pipeline_peer.py")
rows = []
for m in (4, 8):
    for sched in ("1f1b", "gpipe"):
        d, t = [], []
        for r in range(A.pairs):
            out = subprocess.run([TG, "--mesh", "pp=2", "--layers", "8", "--dim", "128", "--heads", "4",
                                  "--seq-len", "64", "--vocab", "256", "--batch", "16", "--tie-weights", "false", "--clip", "0",
                                  "--schedule", sched, "--microbatches", str(m), "--steps", "23", "--log", "plain",
                                  "--out", os.path.join(tempfile.gettempdir(), "compare_pipeline_loss.csv")], capture_output=True, text=True).stdout
            ms = [float(x) for x in re.findall(r"\| ([\d.]+) ms \|", out)][3:]
            d.append(statistics.median(ms))
            out = subprocess.run([PY, PEER, sched, "--microbatches", str(m), "--steps", "20", "--warmup", "3"],
                                 capture_output=True, text=True).stdout
            j = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
            t.append(j.get("step_ms_median", j.get("ms_per_step")))
            print(sched, m, r, d[-1], t[-1], file=sys.stderr, flush=True)
        rows.append((sched, m, d, t))
print("| schedule | dtensor median step ms (3 runs) | torch median step ms (3 runs) | torch / dtensor per pair | medians ratio |")
print("| --- | --- | --- | --- | --- |")
for sched, m, d, t in rows:
    print(f"| {sched}, m = {m} | {', '.join(f'{x:.0f}' for x in d)} | {', '.join(f'{x:.0f}' for x in t)} | "
          f"{', '.join(f'{b/a:.2f}' for a, b in zip(d, t))} | {statistics.median(t)/statistics.median(d):.2f}x |")
