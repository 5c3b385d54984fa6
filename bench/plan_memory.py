#!/usr/bin/env python3
"""The estimator (dtensor/parallel/plan.h, models::gpt_model_spec) against train_gpt's
measured peaks, and with a calibrated profile its step time against the measured one.

Each layout trains the model for --steps steps on the threads backend (and under
mpirun with --mpi); train_gpt's summary sets its peak per rank (the most loaded, the
allocator's counters) and median step beside the estimator's figures for the same
configuration. The layouts run in --rounds rounds, alternating, and a layout's step is
the median of its rounds' medians (this machine's speed drifts by 10-50% over
minutes), its spread the lowest and highest of them. MPI rows are estimated on
--mpi-profile (`mpirun -np 2 dtensor-plan --calibrate F --backend mpi`). With
--calibrate, each round first calibrates (threads, and MPI with --mpi) and estimates
its rows on its own profiles; with --calibrate-each, every row is calibrated right
before it runs (its backend's profile with as many ranks busy as the row has, a few
seconds), so that the machine's drift between a calibration and the run it predicts
stays small, and ranks that outnumber the cores are measured sharing them. A row's error is then the
median of its rounds' errors.
Prints a markdown table; exits 1 when a memory estimate is off by more than
--memory-tolerance.

  python3 bench/plan_memory.py --calibrate-each --mpi --rounds 3 -- --layers 4 --dim 128 --seq-len 64 --heads 8
"""
import argparse
import re
import statistics
import subprocess
import sys

LAYOUTS = [
    ("DDP", "--mesh dp=2"),
    ("ZeRO-1", "--mesh dp=2 --fsdp 1"),
    ("ZeRO-2", "--mesh dp=2 --fsdp 2"),
    ("ZeRO-3", "--mesh dp=2 --fsdp 3"),
    ("ZeRO-3, 4 ranks", "--mesh dp=4 --fsdp 3"),
    ("DDP, grad-accum 2", "--mesh dp=2 --grad-accum 2"),
    ("DDP, recomputed", "--mesh dp=2 --checkpoint-activations"),
    ("TP", "--mesh tp=2"),
    ("TP + SP", "--mesh tp=2 --sequence-parallel"),
    ("TP 4", "--mesh tp=4"),
    ("PP 1F1B", "--mesh pp=2"),
    ("PP 1F1B, 4 stages", "--mesh pp=4"),
    ("PP interleaved v=2", "--mesh pp=2 --schedule interleaved --virtual-stages 2"),
    ("PP GPipe", "--mesh pp=2 --schedule gpipe"),
    ("DDP x TP", "--mesh dp=2,tp=2"),
    ("PP x DDP", "--mesh pp=2,dp=2"),
    ("3-D: PP x DDP x TP", "--mesh pp=2,dp=2,tp=2"),
    ("CP", "--mesh cp=2"),
    ("DDP x CP", "--mesh dp=2,cp=2"),
    ("CP x TP", "--mesh cp=2,tp=2"),
    ("HSDP", "--mesh replicate=2,dp=2 --fsdp 3 --hsdp"),
    ("ZeRO-3 offload", "--mesh dp=2 --fsdp 3 --offload"),
    ("ZeRO-3 offload, 4 ranks", "--mesh dp=4 --fsdp 3 --offload"),
    ("MoE, DDP", "--mesh dp=2 --moe-experts 4 --moe-top-k 2"),
    ("MoE, EP", "--mesh ep=2 --moe-experts 4 --moe-top-k 2"),
    ("MoE, DDP x EP", "--mesh dp=2,ep=2 --moe-experts 4 --moe-top-k 2"),
    ("MoE, DDP x EP, capacity 1.25", "--mesh dp=2,ep=2 --moe-experts 4 --moe-top-k 2 --moe-capacity 1.25"),
    ("MoE + shared expert, DDP x EP", "--mesh dp=2,ep=2 --moe-experts 4 --moe-top-k 2 --moe-shared-expert"),
    ("MoE + shared expert, TP", "--mesh tp=2 --moe-experts 4 --moe-top-k 2 --moe-shared-expert"),
    ("BF16, DDP", "--mesh dp=2 --precision bf16"),
    ("BF16, ZeRO-1", "--mesh dp=2 --fsdp 1 --precision bf16"),
    ("BF16, ZeRO-3", "--mesh dp=2 --fsdp 3 --precision bf16"),
    ("BF16, TP + SP", "--mesh tp=2 --sequence-parallel --precision bf16"),
    ("BF16, PP 1F1B", "--mesh pp=2 --precision bf16"),
    ("BF16, 3-D", "--mesh pp=2,dp=2,tp=2 --precision bf16"),
    ("TP, logits gathered", "--mesh tp=2 --gather-logits"),
    ("ZeRO-3, half offloaded", "--mesh dp=2 --fsdp 3 --offload --offload-fraction 0.5"),
    ("ZeRO-3 offload, delayed update", "--mesh dp=2 --fsdp 3 --offload --delayed-update 2"),
    ("DDP, dropout", "--mesh dp=2 --dropout 0.1"),
    ("PP zero-bubble", "--mesh pp=2 --schedule zero-bubble"),
    ("PP zero-bubble, 4 stages", "--mesh pp=4 --schedule zero-bubble"),
    ("ZeRO-3, layer units", "--mesh dp=2 --fsdp 3 --fsdp-unit layer"),
    ("ZeRO-3, no prefetch", "--mesh dp=2 --fsdp 3 --fsdp-prefetch 0"),
    ("ZeRO-3, prefetch 2", "--mesh dp=2 --fsdp 3 --fsdp-prefetch 2"),
    ("ZeRO-3, kept after forward", "--mesh dp=2 --fsdp 3 --fsdp-reshard-after-forward false"),
]
MPI = ["DDP", "ZeRO-3", "TP", "PP 1F1B", "DDP x TP"]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 2:  # train_gpt refused the flags for this model (e.g. more stages than blocks)
        return None
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out.stdout


def ranks_of(flags):
    ranks = 1
    for size in re.findall(r"=(\d+)", flags.split()[1]):
        ranks *= int(size)
    return ranks


def calibrate(args, mpi, ranks=2):
    path = f"/tmp/plan_memory_{'mpi' if mpi else 'threads'}_{ranks}.json"
    cmd = [args.dtensor_plan, "--calibrate", path]
    if mpi:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *cmd, "--backend", "mpi"]
    else:
        cmd += ["--ranks", str(ranks)]
    out = run(cmd)
    fitted = [line for line in out.splitlines() if line.startswith("fitted:")]
    print(f"calibrated ({'mpi' if mpi else 'threads'}): {fitted[-1] if fitted else '?'}", file=sys.stderr, flush=True)
    return path


def measure(args, flags, mpi):
    ranks = ranks_of(flags)
    cmd = [args.train_gpt, *flags.split(), *args.model, "--steps", str(args.steps), "--log", "plain",
           "--out", "/tmp/plan_memory_loss.csv"]
    profile = args.mpi_profile if mpi and args.mpi_profile else args.profile
    if profile:
        cmd += ["--profile", profile]
    if mpi:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *cmd, "--backend", "mpi"]
    out = run(cmd)
    if out is None:
        return None, None
    mem = re.search(r"memory: peak (.+?) on rank \d+ in the last step; estimated (.+?) \(dtensor-plan's model, "
                    r"([+-][0-9.]+)%\)", out)
    if not mem:
        sys.exit(f"no memory line from: {' '.join(cmd)}\n{out[-2000:]}")
    step = re.search(r"step: median ([0-9.]+) s \(steps [^)]*\); estimated ([0-9.]+) s .*\(([+-][0-9.]+)%\)", out)
    return mem.groups(), step.groups() if step else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", default="build/examples/train_gpt")
    ap.add_argument("--profile", default="", help="a dtensor-plan --calibrate file: step times are estimated too")
    ap.add_argument("--mpi-profile", default="", help="the MPI rows' profile (default: --profile)")
    ap.add_argument("--calibrate", action="store_true", help="calibrate at the start of every round instead")
    ap.add_argument("--calibrate-each", action="store_true", help="calibrate right before every row instead")
    ap.add_argument("--dtensor-plan", default="build/examples/dtensor-plan")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="runs of every layout, alternating")
    ap.add_argument("--mpi", action="store_true", help="also run the MPI rows under mpirun")
    ap.add_argument("--memory-tolerance", type=float, default=10.0, help="percent")
    ap.add_argument("--only", default="",
                    help="the layouts whose names contain one of these, comma-separated (=NAME: that name exactly)")
    ap.add_argument("model", nargs="*", help="train_gpt's model flags, after --")
    args = ap.parse_args()
    wanted = [w for w in args.only.split(",") if w]
    layouts = [(n, f) for n, f in LAYOUTS
               if not wanted or any(n == w[1:] if w.startswith("=") else w in n for w in wanted)]
    rows = [(name, flags, False) for name, flags in layouts]
    if args.mpi:
        rows += [(name + " (MPI)", flags, True) for name, flags in layouts if name in MPI]
    print(f"model: {' '.join(args.model) or 'train_gpt defaults'}; {args.rounds} rounds of {args.steps} steps")
    results = {}
    for _ in range(args.rounds):
        if args.calibrate:
            args.profile = calibrate(args, False)
            args.mpi_profile = calibrate(args, True) if args.mpi else ""
        for name, flags, mpi in rows:
            if args.calibrate_each:  # as many ranks busy as the row has
                if mpi:
                    args.mpi_profile = calibrate(args, True, ranks_of(flags))
                else:
                    args.profile = calibrate(args, False, ranks_of(flags))
            results.setdefault(name, []).append(measure(args, flags, mpi))
    print("| layout | flags | peak measured | estimated | error | step measured (spread) | estimated | error |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, flags, mpi in rows:
        memory, step = results[name][-1]
        if memory is None:
            print(f"| {name} | `{flags}` | not for this model | | | | | |", flush=True)
            continue
        peak, est, err = memory
        worst = max(worst, abs(float(err)))
        step_cells = "| |"
        if step:
            measured = sorted(float(r[1][0]) for r in results[name])
            estimated = statistics.median(float(r[1][1]) for r in results[name])
            error = statistics.median(float(r[1][1]) / float(r[1][0]) - 1 for r in results[name])
            step_cells = (f"{statistics.median(measured):.4f} s ({measured[0]:.4f}-{measured[-1]:.4f}) | "
                          f"{estimated:.4f} s | {error * 100:+.1f}%")
        print(f"| {name} | `{flags}` | {peak} | {est} | {err}% | {step_cells} |", flush=True)
    print(f"worst memory error {worst:.1f}% (tolerance {args.memory_tolerance}%)")
    return 0 if worst <= args.memory_tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
