"""Peer: the mixture-of-experts GPT step of bench/bench_moe.cpp in PyTorch on CPU, one process or
expert parallel over WORLD gloo processes (all_to_all_single with uneven splits, autograd through
torch.distributed.nn.functional).
Run: python torch_moe_peer.py [WORLD] [--steps 5]
Model: dtensor's models::GPT with moe_experts 8, top-2, dropless, expert hidden 256, tanh-GELU experts
without bias (nn::MoE), dim 128, 4 heads, 2 layers, vocab 256, seq 128, global batch 8, fp32; the
load-balancing loss (coefficient 0.01) as nn::MoE computes it. A step: forward, backward, the dense
weights' gradients all-reduced over the ranks (no optimizer), as bench_moe times it.
One JSON line (rank 0): ms/step (mean over measured steps) and tokens/s."""
import argparse, json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
import torch.multiprocessing as mp

ap = argparse.ArgumentParser()
ap.add_argument("world", type=int, nargs="?", default=1)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--port", type=int, default=29613)
A = ap.parse_args()
V, D, L, H, T, B, E, K, HID = 256, 128, 2, 4, 128, 8, 8, 2, 256


class MoE(nn.Module):
    def __init__(s, world, rank):
        super().__init__()
        s.world, s.rank, s.local = world, rank, E // world
        s.router = nn.Linear(D, E, bias=False)
        s.up = nn.Parameter(torch.randn(s.local, HID, D) * 0.02)
        s.down = nn.Parameter(torch.randn(s.local, D, HID) * 0.02)

    def experts(s, x, counts):
        out, o = [], 0
        for e, c in enumerate(counts):
            xe = x[o:o + c]
            out.append(F.gelu(xe @ s.up[e].t(), approximate="tanh") @ s.down[e].t())
            o += c
        return torch.cat(out) if out else x

    def forward(s, x):
        b, t, _ = x.shape
        x = x.reshape(-1, D)
        scores = s.router(x).softmax(-1)
        gates, ids = scores.topk(K, dim=-1)
        gates = gates / gates.sum(-1, keepdim=True)
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=E)
        xp = x[order // K]
        if s.world == 1:
            y = s.experts(xp, counts.tolist())
        else:
            everyone = [torch.empty_like(counts) for _ in range(s.world)]
            dist.all_gather(everyone, counts)
            allc = torch.stack(everyone)  # [world, E]
            mine = slice(s.rank * s.local, (s.rank + 1) * s.local)
            send = counts.view(s.world, s.local).sum(1).tolist()
            recv = allc[:, mine].sum(1).tolist()
            got = dfn.all_to_all_single(torch.empty(sum(recv), D), xp, recv, send)
            # by source rank then expert -> by expert then source rank
            blocks = allc[:, mine]  # [world, local]
            idx, starts = [], torch.cumsum(torch.tensor([0] + recv[:-1]), 0)
            for e in range(s.local):
                for r in range(s.world):
                    off = int(starts[r] + blocks[r, :e].sum())
                    idx.extend(range(off, off + int(blocks[r, e])))
            idx = torch.tensor(idx, dtype=torch.long)
            yg = s.experts(got[idx], blocks.sum(0).tolist())
            back = torch.empty_like(yg).index_copy(0, idx, yg)
            y = dfn.all_to_all_single(torch.empty(sum(send), D), back, send, recv)
        out = torch.zeros(flat.numel(), D).index_copy(0, order, y)
        out = (out.view(-1, K, D) * gates.unsqueeze(-1)).sum(1)
        frac = torch.bincount(flat, minlength=E).float()
        if s.world > 1:
            dist.all_reduce(frac)
        frac = frac / (B * T * K)
        aux = 0.01 * E * (scores * frac).sum() / (B * T)
        return out.view(b, t, D), aux


class Block(nn.Module):
    def __init__(s, world, rank):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.q, s.k, s.v, s.o = (nn.Linear(D, D) for _ in range(4))
        s.moe = MoE(world, rank)

    def forward(s, x):
        b, t, _ = x.shape
        h = s.ln1(x)
        q, k, v = (m(h).view(b, t, H, D // H).transpose(1, 2) for m in (s.q, s.k, s.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        x = x + s.o(a)
        y, aux = s.moe(s.ln2(x))
        return x + y, aux


class GPT(nn.Module):
    def __init__(s, world, rank):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(Block(world, rank) for _ in range(L))
        s.ln = nn.LayerNorm(D)

    def forward(s, ids, targets):
        x = s.tok(ids) + s.pos(torch.arange(ids.shape[1]))
        aux = 0
        for blk in s.blocks:
            x, a = blk(x)
            aux = aux + a
        logits = s.ln(x) @ s.tok.weight.t()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)) + aux


def run(rank, world):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(A.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(world, rank)
    dense = [p for n, p in model.named_parameters() if ".moe.up" not in n and ".moe.down" not in n]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, T), generator=g)
    rows = slice(rank * B // world, (rank + 1) * B // world)
    times = []
    for i in range(A.warmup + A.steps):
        t0 = time.perf_counter()
        loss = model(ids[rows], ids[rows].roll(-1, 1))
        loss.backward()
        if world > 1:
            for p in dense:
                dist.all_reduce(p.grad)
        model.zero_grad(set_to_none=True)
        if world > 1:
            dist.barrier()
        if i >= A.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = 1e3 * sum(times) / len(times)
        print(json.dumps({"peer": "torch", "world": world, "ms_per_step": ms, "tokens_per_s": B * T / ms * 1e3,
                          "torch": torch.__version__}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    if A.world == 1:
        run(0, 1)
    else:
        mp.spawn(run, args=(A.world,), nprocs=A.world)
