#!/usr/bin/env python3
"""Peer: JAX's device_put between shardings of a 64 MiB F32 array on CPU host devices, the
transitions bench_redistribute times for dtensor.

    python3 -m venv .jax-venv && .jax-venv/bin/pip install jax     # bench-only tool
    .jax-venv/bin/python bench/peers/jax_redistribute_peer.py [--reps 9]

Cases (array [4096, 4096] F32, as bench_redistribute's kShape):
  R_to_S0     mesh of 2 devices: replicated -> P('a')            (dtensor: BM_ReplicateToShard, R_to_S0_ms)
  R_to_S1     mesh of 2 devices: replicated -> P(None, 'a')      (R_to_S1_ms)
  S0S1_to_S1S0  2x2 mesh: P('a', 'b') -> P('b', 'a')              (BM_Redistribute/6, block transfer)
Each repetition is device_put(...) followed by block_until_ready() (S0S1_to_S1S0_jit: the same
move as a jitted identity with out_shardings, XLA's collective-permute); the source array is made
and made ready once, before timing. One JSON line: the median and minimum of --reps, in ms.
The host platform is split into 4 devices with XLA_FLAGS before jax is imported. JAX is a
benchmark tool here, never a dependency of dtensor.
"""
import argparse
import json
import os
import statistics
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=9)
A = ap.parse_args()

SHAPE = (4096, 4096)
devices = jax.devices("cpu")
mesh2 = Mesh(np.array(devices[:2]), ("a",))
mesh22 = Mesh(np.array(devices[:4]).reshape(2, 2), ("a", "b"))
host = np.random.default_rng(1).standard_normal(SHAPE, dtype=np.float32)


def timed(source, target, how="device_put"):
    move = (lambda x: jax.device_put(x, target)) if how == "device_put" else jax.jit(lambda x: x, out_shardings=target)
    times = []
    for _ in range(A.reps + 1):  # the first is warm-up (compiles any transfer program)
        t0 = time.perf_counter()
        out = move(source)
        out.block_until_ready()
        times.append(time.perf_counter() - t0)
        del out
    times = times[1:]
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}


replicated = jax.device_put(host, NamedSharding(mesh2, P()))
replicated.block_until_ready()
s0s1 = jax.device_put(host, NamedSharding(mesh22, P("a", "b")))
s0s1.block_until_ready()
result = {
    "jax": jax.__version__,
    "devices": len(devices),
    "R_to_S0": timed(replicated, NamedSharding(mesh2, P("a"))),
    "R_to_S1": timed(replicated, NamedSharding(mesh2, P(None, "a"))),
    "S0S1_to_S1S0": timed(s0s1, NamedSharding(mesh22, P("b", "a"))),
    "S0S1_to_S1S0_jit": timed(s0s1, NamedSharding(mesh22, P("b", "a")), "jit"),
}
print(json.dumps(result))
