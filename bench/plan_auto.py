#!/usr/bin/env python3
"""train_gpt --plan auto against hand-chosen layouts, measured on this machine.

Each configuration trains the same model for --steps steps; its figure is the median
step time of the steps after the first five. Rounds alternate the configurations
(A B C ... A B C ...) so that drift of the machine hits all alike; the figure is the
median over rounds. The auto plan's own choice is read from its first output line and
timed like the others.

  python3 bench/plan_auto.py --ranks 2 --rounds 3 -- --layers 4 --dim 128 --seq-len 64
"""
import argparse
import re
import statistics
import subprocess
import sys

HAND = {
    2: ["--mesh dp=2", "--mesh dp=2 --fsdp 1", "--mesh dp=2 --fsdp 2", "--mesh dp=2 --fsdp 3",
        "--mesh dp=2 --grad-accum 2", "--mesh tp=2", "--mesh tp=2 --sequence-parallel", "--mesh pp=2"],
    4: ["--mesh dp=4", "--mesh dp=4 --fsdp 3", "--mesh dp=2,tp=2", "--mesh tp=4", "--mesh pp=2,dp=2",
        "--mesh pp=4", "--mesh pp=2,tp=2"],
}


def median_step_ms(train_gpt, flags, model, steps):
    out = subprocess.run([train_gpt, *flags.split(), *model, "--steps", str(steps), "--log", "plain",
                          "--out", "/tmp/plan_auto_loss.csv"], capture_output=True, text=True, check=True).stdout
    times = [float(t) for t in re.findall(r"\| ([0-9.]+) ms \|", out)][5:]
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", default="build/examples/train_gpt")
    ap.add_argument("--profile", default="", help="a dtensor-plan --calibrate file (empty: --plan auto measures)")
    ap.add_argument("--ranks", type=int, default=2, choices=sorted(HAND))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("model", nargs="*", help="train_gpt's model flags, after --")
    a = ap.parse_args()
    auto = f"--mesh dp={a.ranks} --plan auto" + (f" --profile {a.profile}" if a.profile else "")
    _, out = median_step_ms(a.train_gpt, auto, a.model, 6)
    chose = re.search(r"--plan auto chose #\d+: (.*) \(\d+ configurations", out).group(1)
    print(f"--plan auto chose: {chose}")
    configs = HAND[a.ranks] + ([chose] if chose not in HAND[a.ranks] else [])
    rounds = {c: [] for c in configs}
    for _ in range(a.rounds):
        for c in configs:
            rounds[c].append(median_step_ms(a.train_gpt, c, a.model, a.steps)[0])
    figures = {c: statistics.median(r) for c, r in rounds.items()}
    best = min(figures, key=figures.get)
    for c, ms in sorted(figures.items(), key=lambda kv: kv[1]):
        mark = " <- --plan auto" if c == chose else ""
        print(f"{ms:8.2f} ms  {ms / figures[best]:5.2f}x  {c}{mark}")
    ratio = figures[chose] / figures[best]
    print(f"--plan auto's choice: {ratio:.2f}x the best hand-chosen layout ({best}); target <= 1.10")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
