"""PyTorch's CPU AdamW on one flat F32 parameter of N elements, the peer of bench_optim.

    python3 -m venv .peer-venv && .peer-venv/bin/pip install torch numpy     # bench-only tool
    .peer-venv/bin/python bench/peers/torch_adamw_peer.py 100               # millions of parameters

For each implementation (the default for-loop, foreach, fused) the best of 5 steps after
one warm-up, as bench_optim times dtensor's; prints one JSON line each. Alternate it
with ./build/bench/bench_optim (A B A B): only ratios from one run mean anything here.
"""
import json
import sys
import time

import torch


def best_step_seconds(impl, n):
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    kwargs = {"lr": 1e-3, "weight_decay": 0.01}
    if impl == "foreach":
        kwargs["foreach"] = True
    elif impl == "fused":
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = False
    opt = torch.optim.AdamW([p], **kwargs)
    opt.step()  # warm-up: the state allocated
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    millions = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    n = millions * 1_000_000
    for impl in ("default", "foreach", "fused"):
        s = best_step_seconds(impl, n)
        print(json.dumps({"peer": "torch", "impl": impl, "params_M": millions, "threads": torch.get_num_threads(),
                          "step_ms": s * 1e3, "GB_per_s": 28.0 * n / s / 1e9, "torch": torch.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
