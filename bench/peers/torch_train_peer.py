"""Peer: GPT training step time with PyTorch on CPU (gloo): single process, DDP, FSDP2 and TP.
Run: python torch_train_peer.py MODE [WORLD] [--steps 20] [--warmup 3] [--precision bf16]   (MODE in single, ddp, fsdp, tp)
(A copy of shared/peers/torch_train_peer.py with --precision: bf16 runs forward and loss under
torch.autocast("cpu", torch.bfloat16) with FP32 master weights, as dtensor's --precision bf16.)
Model = dtensor's nn::GPT as examples/train_gpt builds it (src/nn/gpt.cpp, layers.cpp):
  token + position embeddings, pre-norm blocks (LayerNorm with bias, eps 1e-5; q/k/v/out Linear with bias;
  causal SDPA; MLP dim -> 4*dim -> dim with bias and tanh-GELU), final LayerNorm, LM head tied to the
  token embedding, mean cross-entropy, AdamW (lr 3e-3, wd 0.01), no dropout, no grad clipping.
Sizes: vocab 256, d 256, 4 layers, 4 heads, seq 128, global batch 8, fp32.
One JSON line (rank 0): ms/step (mean over measured steps, and per-step median/min), tokens/s,
peak RSS per rank (MiB, getrusage) and RSS growth over the pre-model baseline."""
import argparse, json, math, os, random, resource, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["single", "ddp", "fsdp", "tp"])
ap.add_argument("world", type=int, nargs="?", default=2)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--dim", type=int, default=256)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--attn", choices=["sdpa", "manual"], default="sdpa")
ap.add_argument("--port", type=int, default=0)
ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
ap.add_argument("--memtrack", type=int, default=1, help="one extra, untimed step under MemTracker for the tensor-level peak")
A = ap.parse_args()
V, D, L, H, T, B = A.vocab, A.dim, A.layers, A.heads, A.seq, A.batch


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.q, s.k, s.v, s.o = (nn.Linear(D, D) for _ in range(4))
        s.fc1, s.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(s, x):
        b, t, _ = x.shape
        h = s.ln1(x)
        # -1 heads: under TP each rank holds H / world heads
        q = s.q(h).view(b, t, -1, D // H).transpose(1, 2)
        k = s.k(h).view(b, t, -1, D // H).transpose(1, 2)
        v = s.v(h).view(b, t, -1, D // H).transpose(1, 2)
        if A.attn == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            a = att @ v
        a = a.transpose(1, 2).reshape(b, t, -1)
        x = x + s.o(a)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.ln = nn.LayerNorm(D)
        s.head = nn.Linear(D, V, bias=False)
        s.head.weight = s.tok.weight  # tied, as dtensor's GPTConfig::tie_weights (default true)
        for m in s.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        return s.head(s.ln(x))


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(rank, world, mode, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, int(os.environ.get("PEER_CORES", "2")) // world))
    torch.manual_seed(0)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    rss0 = rss_mib()
    model = GPT()
    nparams = sum(p.numel() for p in model.parameters())
    local_b = B // world
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "tp":
        from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            parallelize_module(blk, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                                           "o": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        local_b = B  # every TP rank sees the whole batch
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(rank if mode in ("ddp", "fsdp") else 0)

    def step():
        idx = torch.randint(0, V, (local_b, T + 1), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=A.precision == "bf16"):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, V), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    for _ in range(A.warmup):
        step()
    if world > 1:
        dist.barrier()
    per = []
    t_all = time.perf_counter()
    for _ in range(A.steps):
        t = time.perf_counter()
        loss = step()
        per.append(time.perf_counter() - t)
    if world > 1:
        dist.barrier()
    dt = (time.perf_counter() - t_all) / A.steps
    rss = [rss_mib()]
    drss = [rss[0] - rss0]
    if world > 1:
        both = [None] * world
        dist.all_gather_object(both, (rss[0], drss[0], dt))
        rss = [x[0] for x in both]
        drss = [x[1] for x in both]
        dt = max(x[2] for x in both)
    # tensor-level peak (params + grads + optimizer state + activations), one extra untimed step
    mt_peak = None
    if A.memtrack:
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
            mt = MemTracker()
            mt.track_external(model, opt)
            with mt:
                step()
            snap = mt.get_tracker_snapshot("peak")
            mt_peak = sum(d.get("Total", 0) for d in snap.values()) / 2**20
        except Exception as e:  # report, do not fail the timing
            mt_peak = f"failed: {type(e).__name__}: {e}"[:200]
    if world > 1:
        allp = [None] * world
        dist.all_gather_object(allp, mt_peak)
        mt_peak = allp
    else:
        mt_peak = [mt_peak]
    if rank == 0:
        s = sorted(per)
        print(json.dumps(dict(lib="torch", version=torch.__version__, mode=mode, world=world, params=nparams,
                              attn=A.attn, precision=A.precision, threads=torch.get_num_threads(), steps=A.steps, warmup=A.warmup, ms_per_step=dt * 1e3,
                              step_ms_median=s[len(s) // 2] * 1e3, step_ms_min=s[0] * 1e3,
                              tokens_per_s=B * T / dt, peak_rss_mib=rss, rss_growth_mib=drss, memtracker_peak_mib=mt_peak, last_loss=loss)),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    world = 1 if A.mode == "single" else A.world
    if not A.port:
        A.port = random.randint(20000, 40000)
    if world == 1:
        run(0, 1, A.mode, A.port)
    else:
        mp.spawn(run, args=(world, A.mode, A.port), nprocs=world)
