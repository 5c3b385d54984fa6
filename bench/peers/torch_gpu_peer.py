"""Peer: PyTorch on one NVIDIA GPU, the same-run figures dtensor's gpu_bench is compared with (issue 14).
Run: python torch_gpu_peer.py [--json FILE] [--no-compile] [--steps 10] [--warmup 3] [--budget 240]
       [--vocab 32768 --dim 1024 --layers 24 --heads 16 --seq 1024 --batch 8] [--mm 8192]
       [--attn-batch 8 --attn-heads 16 --attn-seq 2048 --attn-dim 128]
scripts/gpu-check.sh runs it after gpu_bench and appends what it prints (a Markdown section:
a few lines, then | what | median ms | TFLOP/s or tokens/s | notes |) to its summary; --json FILE
also writes one JSON object with every figure (rewritten after each section, so a run cut short
keeps what it finished). Rows are printed as their sections finish.
What it measures (every section in its own try/except: a failure, e.g. out of memory, is a row
"failed: <reason>" and the others still run):
  1. torch.matmul, BF16, 8192 x 8192 x 8192: median ms of 10 runs after 2 warm-ups (CUDA events).
  2. F.scaled_dot_product_attention, causal, BF16, B 8, H 16, T 2048, D 128, q/k/v requiring grad:
     forward + out.backward(grad), median of 10 after 2 warm-ups (CUDA events), with the backend
     the dispatcher picks; then forward alone (grad enabled, as in training) and forward+backward
     pinned to each fused backend (flash, cuDNN, memory-efficient) where it is available.
  3. One GPT training step, the model of torch_train_peer.py (= dtensor's nn::GPT): token + position
     embeddings, pre-norm blocks (LayerNorm with bias, eps 1e-5; q/k/v/o Linear with bias; causal
     SDPA; MLP d -> 4d -> d with bias and tanh-GELU), final LayerNorm, LM head tied to the token
     embedding, mean cross-entropy, no dropout; BF16 autocast with FP32 master weights, AdamW
     (lr 3e-3, wd 0.01, fused=True where available). Sizes vocab 32768, d 1024, 24 layers, 16 heads,
     seq 1024, batch 8 (about 337M parameters). Wall clock with torch.cuda.synchronize around each
     step, median of 10 after 3 warm-ups; eager, then torch.compile(model) (its warm-up steps, which
     compile, are not timed; --no-compile skips it, and so does the script itself when more than
     --compile-skip-after seconds, default budget - 90 = 150 s, have passed since it started).
Budget: --budget seconds in all (default 240, gpu-check's timeout): at budget - 10 s an alarm
interrupts the running section (reported as failed) and what is left is skipped; the GPT sections
measure fewer steps when the warm-ups show that 10 would not fit.
Formulas:
  matmul FLOP = 2*M*N*K.
  causal attention FLOP: forward = 2*2*B*H*T*T*D*0.5 (QK^T and PV, half the scores), backward = 2.5 x
    forward, forward+backward = 3.5 x forward.
  GPT FLOP/step = (6*N + 12*L*T*D) * B*T, N = parameter count without the position embedding (the tied
    head counted once); 12*L*T*D is attention's score and value matmuls (PaLM, appendix B);
    MFU = FLOP/step / (step seconds * 989e12), the H200's dense BF16 peak (--peak-tflops).
Without torch, or where torch.cuda.is_available() is false, it prints one line and exits 0. Exit
status 1 when a section failed, else 0.
Hidden CPU smoke test: --device cpu --tiny (vocab 256, d 64, 2 layers, 2 heads, seq 32, batch 2,
matmul 256, attention B1 H2 T64 D16, FP32 instead of BF16, wall clock instead of CUDA events)."""
import argparse, gc, json, os, signal, statistics, sys, time, traceback

T_START = time.monotonic()

# name: (default, --tiny, help)
SIZES = {
    "vocab": (32768, 256, "GPT vocabulary"),
    "dim": (1024, 64, "GPT model width d"),
    "layers": (24, 2, "GPT blocks L"),
    "heads": (16, 2, "GPT attention heads"),
    "seq": (1024, 32, "GPT sequence length T"),
    "batch": (8, 2, "GPT batch B"),
    "mm": (8192, 256, "matmul size (M = N = K)"),
    "attn_batch": (8, 1, "attention B"),
    "attn_heads": (16, 2, "attention H"),
    "attn_seq": (2048, 64, "attention T"),
    "attn_dim": (128, 16, "attention head dim D"),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--json", metavar="FILE", help="also write every figure as one JSON object")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile GPT step")
    ap.add_argument("--steps", type=int, default=10, help="measured GPT steps")
    ap.add_argument("--warmup", type=int, default=3, help="GPT warm-up steps (not timed)")
    ap.add_argument("--iters", type=int, default=10, help="measured matmul / attention runs")
    ap.add_argument("--kernel-warmup", type=int, default=2, help="matmul / attention warm-up runs")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the whole script")
    ap.add_argument("--compile-skip-after", type=float, default=None,
                    help="skip torch.compile when this many seconds have passed (default budget - 90)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak for the MFU")
    for name, (full, _, hlp) in SIZES.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=f"{hlp} (default {full})")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    for name, (full, tiny, _) in SIZES.items():
        if getattr(a, name) is None:
            setattr(a, name, tiny if a.tiny else full)
    if a.dtype is None:
        a.dtype = "fp32" if a.tiny else "bf16"
    if a.compile_skip_after is None:
        a.compile_skip_after = a.budget - 90.0
    return a


A = parse_args()

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # not installed, or broken: the GPU check must not fail because of the peer
    print(f"PyTorch is not available ({type(e).__name__}: {e}): no PyTorch peer figures", flush=True)
    sys.exit(0)

if A.device.startswith("cuda") and not torch.cuda.is_available():
    print(f"PyTorch {torch.__version__} is installed but torch.cuda.is_available() is false "
          f"(CUDA build: {torch.version.cuda or 'none'}): no PyTorch peer figures", flush=True)
    sys.exit(0)

DEV = torch.device(A.device)
ON_GPU = DEV.type == "cuda"
DT = torch.bfloat16 if A.dtype == "bf16" else torch.float32
DT_NAME = "BF16" if DT == torch.bfloat16 else "FP32"


class BudgetExceeded(Exception):
    pass


def _alarm(signum, frame):
    raise BudgetExceeded(f"budget of {A.budget:.0f} s reached after {elapsed():.0f} s")


def elapsed():
    return time.monotonic() - T_START


def time_left():
    return A.budget - 10.0 - elapsed()


def sync():
    if ON_GPU:
        torch.cuda.synchronize(DEV)


def one_line(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()[:200].replace("|", "/")


def stats(ms):
    return dict(median_ms=statistics.median(ms), min_ms=min(ms), mean_ms=statistics.fmean(ms), runs=len(ms))


def time_runs(fn, before=None):
    """A.kernel_warmup untimed calls of fn, then A.iters timed ones (CUDA events on the GPU, wall clock
    on the CPU); before() runs ahead of every call, outside the timed region."""
    for _ in range(A.kernel_warmup):
        if before:
            before()
        fn()
    sync()
    if ON_GPU:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(A.iters)]
        for start, end in ev:
            if before:
                before()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(DEV)
        return [start.elapsed_time(end) for start, end in ev]
    ms = []
    for _ in range(A.iters):
        if before:
            before()
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


TIMING = "CUDA events" if ON_GPU else "wall clock"


# ---- 1. matmul --------------------------------------------------------------------------------

def bench_matmul():
    n = A.mm
    g = torch.Generator(device=DEV).manual_seed(0)
    a = torch.randn(n, n, device=DEV, dtype=DT, generator=g)
    b = torch.randn(n, n, device=DEV, dtype=DT, generator=g)
    out = torch.empty(n, n, device=DEV, dtype=DT)
    r = stats(time_runs(lambda: torch.matmul(a, b, out=out)))
    flop = 2.0 * n * n * n
    r.update(m=n, n=n, k=n, dtype=DT_NAME, flop=flop, tflops=flop / (r["median_ms"] * 1e-3) / 1e12)
    return r


# ---- 2. attention -----------------------------------------------------------------------------

def attn_flop():
    b, h, t, d = A.attn_batch, A.attn_heads, A.attn_seq, A.attn_dim
    fwd = 2.0 * 2.0 * b * h * t * t * d * 0.5
    return fwd, 2.5 * fwd


def attn_inputs():
    b, h, t, d = A.attn_batch, A.attn_heads, A.attn_seq, A.attn_dim
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v, dout = (torch.randn(b, h, t, d, device=DEV, dtype=DT, generator=g) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    return q, k, v, dout


def sdpa_choice(q, k, v):
    """The fused backend the dispatcher picks for these inputs (a private torch API: may be absent)."""
    try:
        from torch.nn.attention import SDPBackend
        i = int(torch._fused_sdp_choice(q, k, v, is_causal=True))
        return next((name.lower() for name, m in SDPBackend.__members__.items() if int(m) == i), str(i))
    except Exception:
        return "unknown"


def bench_attention(backend=None, backward=True):
    """Causal SDPA on fresh inputs; backend None = the dispatcher's choice, else pinned with sdpa_kernel."""
    import contextlib
    q, k, v, dout = attn_inputs()
    ctx = contextlib.nullcontext()
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                           "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend])

    def clear():
        q.grad = k.grad = v.grad = None

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            out.backward(dout)

    with ctx:
        r = stats(time_runs(run, before=clear if backward else None))
    fwd, bwd = attn_flop()
    flop = fwd + bwd if backward else fwd
    r.update(b=A.attn_batch, h=A.attn_heads, t=A.attn_seq, d=A.attn_dim, dtype=DT_NAME, causal=True,
             backward=backward, backend=backend or sdpa_choice(q, k, v), pinned=backend is not None,
             flop=flop, tflops=flop / (r["median_ms"] * 1e-3) / 1e12)
    return r


# ---- 3. GPT training step -----------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (lin(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for lin in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as dtensor's GPTConfig::tie_weights (default true)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def gpt_flop_per_token(n):
    return 6.0 * n + 12.0 * A.layers * A.seq * A.dim


def bench_gpt(compiled):
    V, T, B = A.vocab, A.seq, A.batch
    torch.manual_seed(0)
    if ON_GPU:
        torch.cuda.reset_peak_memory_stats(DEV)
    model = GPT(V, A.dim, A.layers, A.heads, T).to(DEV)
    params = sum(p.numel() for p in model.parameters())  # the tied weight once
    n = params - model.pos.weight.numel()
    r = dict(params=params, n_for_flops=n, flop_per_token=gpt_flop_per_token(n), tokens_per_step=B * T,
             vocab=V, dim=A.dim, layers=A.layers, heads=A.heads, seq=T, batch=B,
             precision="bf16 autocast, fp32 master" if DT == torch.bfloat16 else "fp32")
    hp = dict(lr=3e-3, weight_decay=0.01)
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **hp)
        r["adamw"] = "fused"
    except Exception as e:  # no fused kernel for this device / version
        opt = torch.optim.AdamW(model.parameters(), **hp)
        r["adamw"] = f"default ({one_line(e)})"
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator(device=DEV).manual_seed(0)

    def step():
        idx = torch.randint(0, V, (B, T + 1), device=DEV, generator=g)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=DT == torch.bfloat16):
            logits = fwd(idx[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, V), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def timed_step():
        sync()
        t = time.perf_counter()
        loss = step()
        sync()
        return (time.perf_counter() - t) * 1e3, loss

    warm = [timed_step()[0] for _ in range(A.warmup)]
    r["warmup_ms"] = warm
    if compiled and warm:
        r["first_step_s"] = warm[0] / 1e3  # includes compiling forward and backward
    per_step = warm[-1] if warm else timed_step()[0]
    fit = int((time_left() - 2.0) / (per_step / 1e3))
    steps = min(A.steps, fit)
    if steps < 1:
        raise BudgetExceeded(f"no time left to measure after the warm-ups ({elapsed():.0f} s passed)")
    ms, losses = zip(*(timed_step() for _ in range(steps)))
    r.update(stats(list(ms)))
    r["steps_asked"] = A.steps
    s = r["median_ms"] * 1e-3
    r["tokens_per_s"] = B * T / s
    r["tflops"] = r["flop_per_token"] * B * T / s / 1e12
    r["mfu"] = r["tflops"] / A.peak_tflops
    r["last_loss"] = float(losses[-1])
    if ON_GPU:
        r["peak_mem_gib"] = torch.cuda.max_memory_allocated(DEV) / 2**30
    return r


# ---- driver -------------------------------------------------------------------------------------

RESULTS = {}
FAILED = []


def write_json():
    if not A.json:
        return
    tmp = A.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULTS, f, indent=1)
    os.replace(tmp, A.json)


def row(what, ms="", rate="", notes=""):
    print(f"| {what} | {ms} | {rate} | {notes} |", flush=True)


def fmt_ms(r):
    return f"{r['median_ms']:.3f}" if r["median_ms"] < 100 else f"{r['median_ms']:.1f}"


def section(key, what, fn, fmt, need_s=5.0, skip=None):
    """Runs fn() in its own try/except, stores its dict (or the error) under RESULTS[key], prints its row."""
    if skip is None and time_left() < need_s:
        skip = f"{elapsed():.0f} s of the {A.budget:.0f} s budget passed"
    if skip is not None:
        RESULTS[key] = dict(skipped=skip)
        row(what, "-", "-", f"skipped: {skip}")
    else:
        t0 = time.monotonic()
        try:
            r = fn()
            r["section_s"] = time.monotonic() - t0
            RESULTS[key] = r
            rate, notes = fmt(r)
            row(what, fmt_ms(r), rate, notes)
        except Exception as e:  # includes BudgetExceeded and out-of-memory
            print(f"[torch_gpu_peer] {key} failed:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            RESULTS[key] = dict(error=one_line(e), section_s=time.monotonic() - t0)
            FAILED.append(key)
            row(what, "-", "-", f"failed: {one_line(e)}")
        gc.collect()
        if ON_GPU:
            torch.cuda.empty_cache()
    write_json()


def fmt_kernel(r):
    return f"{r['tflops']:.4g} TFLOP/s", f"min {r['min_ms']:.3f} ms, {r['runs']} runs"


def fmt_attn(r):
    rate, notes = fmt_kernel(r)
    how = "pinned" if r["pinned"] else "dispatcher's choice"
    return rate, f"backend {r['backend']} ({how}); {notes}"


def fmt_gpt(r):
    notes = (f"MFU {100 * r['mfu']:.1f}% ({r['tflops']:.4g} TFLOP/s); {r['params'] / 1e6:.1f}M params; "
             f"{r['runs']} steps" + (f" (of {r['steps_asked']}: budget)" if r["runs"] < r["steps_asked"] else "")
             + f"; AdamW {r['adamw'].split(' ')[0]}; loss {r['last_loss']:.3f}")
    if "first_step_s" in r:
        notes += f"; first step (compiling) {r['first_step_s']:.1f} s"
    if "peak_mem_gib" in r:
        notes += f"; peak {r['peak_mem_gib']:.1f} GiB"
    return f"{r['tokens_per_s']:,.0f} tokens/s", notes


def main():
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, time_left()))
    name = torch.cuda.get_device_name(DEV) if ON_GPU else f"CPU ({torch.get_num_threads()} threads)"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    RESULTS["meta"] = dict(lib="torch", version=torch.__version__, cuda=torch.version.cuda, cudnn=cudnn,
                           device=name, dtype=DT_NAME, timing=TIMING, peak_tflops=A.peak_tflops,
                           budget_s=A.budget, tiny=A.tiny,
                           formulas=dict(matmul="2*M*N*K",
                                         attention_fwd="2*2*B*H*T*T*D*0.5 (causal)",
                                         attention_bwd="2.5 * attention_fwd",
                                         gpt_flop_per_step="(6*N + 12*L*T*D) * B*T, N = params without the position embedding",
                                         mfu="gpt_flop_per_step / (step_s * peak_tflops * 1e12)"))
    print(f"### PyTorch {torch.__version__} on {name}"
          + (f" (CUDA {torch.version.cuda}, cuDNN {cudnn})" if ON_GPU else ""))
    print("")
    print(f"- matmul and attention: median of {A.iters} runs after {A.kernel_warmup} warm-ups, {TIMING}; "
          f"GPT step: wall clock with {'torch.cuda.synchronize' if ON_GPU else 'nothing to synchronize'} "
          f"around each step, median of {A.steps} after {A.warmup} warm-ups")
    print("- FLOPs: matmul 2*M*N*K; causal attention forward 2*2*B*H*T*T*D*0.5, backward 2.5x forward; "
          "GPT step (6*N + 12*L*T*D) * B*T with N = parameters without the position embedding "
          f"(tied head once); MFU against {A.peak_tflops:g} TFLOP/s")
    print("")
    print("| what | median ms | TFLOP/s or tokens/s | notes |")
    print("|---|---:|---:|---|", flush=True)

    section("matmul", f"torch.matmul {DT_NAME} {A.mm}^3", bench_matmul, fmt_kernel)
    shape = f"B{A.attn_batch} H{A.attn_heads} T{A.attn_seq} D{A.attn_dim}"
    section("attention", f"SDPA causal fwd+bwd {DT_NAME} {shape}", bench_attention, fmt_attn)
    section("attention_fwd", f"SDPA causal fwd only {DT_NAME} {shape}",
            lambda: bench_attention(backward=False), fmt_attn)
    for be in ("flash", "cudnn", "efficient"):
        section(f"attention_{be}", f"SDPA causal fwd+bwd, {be}",
                lambda be=be: bench_attention(backend=be), fmt_attn)
    gpt = (f"GPT step L{A.layers} d{A.dim} H{A.heads} V{A.vocab}, B{A.batch} T{A.seq}, "
           f"{'BF16 autocast' if DT == torch.bfloat16 else 'FP32'}")
    section("gpt_eager", f"{gpt}, eager", lambda: bench_gpt(False), fmt_gpt, need_s=20.0)
    skip = None
    if A.no_compile:
        skip = "--no-compile"
    elif elapsed() > A.compile_skip_after:
        skip = f"{elapsed():.0f} s had passed (> {A.compile_skip_after:.0f} s)"
    section("gpt_compile", f"{gpt}, torch.compile", lambda: bench_gpt(True), fmt_gpt, need_s=20.0, skip=skip)

    signal.setitimer(signal.ITIMER_REAL, 0)
    RESULTS["meta"]["elapsed_s"] = elapsed()
    write_json()
    print("")
    print(f"peer: {elapsed():.0f} s" + (f"; failed: {', '.join(FAILED)}" if FAILED else ""), flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    try:
        rc = main()
    except BudgetExceeded as e:  # the alarm between two sections
        print(f"\npeer stopped: {e}", flush=True)
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: an interrupted torch.compile may leave compile workers that would hold up a normal exit
    os._exit(rc)
