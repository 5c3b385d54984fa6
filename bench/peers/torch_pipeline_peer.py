"""Peer: pipeline-parallel GPT training with torch.distributed.pipelining on CPU (gloo), p = 2 processes.
Run: python torch_pipeline_peer.py {gpipe,1f1b} [--microbatches 4] [--steps 20] [--warmup 3]
Model = dtensor's nn::GPT as `train_gpt --tie-weights false` builds it (the model of
/work/shared/peers/torch_train_peer.py with an untied head): token + position embeddings,
pre-norm blocks (LayerNorm with bias; q/k/v/out Linear with bias; causal SDPA; MLP
dim -> 4*dim -> dim with tanh-GELU), final LayerNorm, LM head without bias; mean
cross-entropy; AdamW (lr 3e-3, wd 0.01), no clipping. Stage 0 holds the embeddings and
blocks [0, L/2), stage 1 the rest, the norm and the head (dtensor's balanced split of this
model). Sizes: vocab 256, dim 128, 8 layers, 4 heads, seq 64, global batch 16, fp32; one
thread per process (PEER_CORES=2 cores over 2 ranks).
One JSON line (rank 0): ms/step (mean over measured steps; per-step median and min, the
slower rank's), tokens/s, the last loss."""
import argparse, json, os, random, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp

ap = argparse.ArgumentParser()
ap.add_argument("schedule", choices=["gpipe", "1f1b"])
ap.add_argument("--microbatches", type=int, default=4)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--seq", type=int, default=64)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--port", type=int, default=0)
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
        q = s.q(h).view(b, t, H, D // H).transpose(1, 2)
        k = s.k(h).view(b, t, H, D // H).transpose(1, 2)
        v = s.v(h).view(b, t, H, D // H).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        x = x + s.o(a)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class First(nn.Module):
    def __init__(s, blocks):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(blocks)

    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        return x


class Last(nn.Module):
    def __init__(s, blocks):
        super().__init__()
        s.blocks = nn.ModuleList(blocks)
        s.ln = nn.LayerNorm(D)
        s.head = nn.Linear(D, V, bias=False)

    def forward(s, x):
        for b in s.blocks:
            x = b(x)
        return s.head(s.ln(x))


def init_weights(m):
    for x in m.modules():
        if isinstance(x, (nn.Linear, nn.Embedding)):
            nn.init.normal_(x.weight, std=0.02)
        if isinstance(x, nn.Linear) and x.bias is not None:
            nn.init.zeros_(x.bias)


def run(rank, world, port):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, int(os.environ.get("PEER_CORES", "2")) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    half = L // 2
    module = First([Block() for _ in range(half)]) if rank == 0 else Last([Block() for _ in range(L - half)])
    init_weights(module)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))

    kind = ScheduleGPipe if A.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=A.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)  # the same batches on both ranks
    loss = float("nan")

    def step():
        nonlocal loss
        idx = torch.randint(0, V, (B, T + 1), generator=g)
        if rank == 0:
            schedule.step(idx[:, :-1])
        else:
            losses = []
            schedule.step(target=idx[:, 1:], losses=losses)
            loss = float(sum(l.item() for l in losses) / len(losses))
        opt.step()
        opt.zero_grad()

    for _ in range(A.warmup):
        step()
    dist.barrier()
    per = []
    t_all = time.perf_counter()
    for _ in range(A.steps):
        t = time.perf_counter()
        step()
        per.append(time.perf_counter() - t)
    dist.barrier()
    dt = (time.perf_counter() - t_all) / A.steps
    both = [None] * world
    dist.all_gather_object(both, (dt, sorted(per), loss))
    if rank == 0:
        dt = max(x[0] for x in both)
        med = max(x[1][len(x[1]) // 2] for x in both)
        mn = max(x[1][0] for x in both)
        print(json.dumps(dict(lib="torch", version=torch.__version__, schedule=A.schedule, world=world,
                              microbatches=A.microbatches, steps=A.steps, warmup=A.warmup, ms_per_step=dt * 1e3,
                              step_ms_median=med * 1e3, step_ms_min=mn * 1e3, tokens_per_s=B * T / dt,
                              last_loss=both[1][2])), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if not A.port:
        A.port = random.randint(20000, 40000)
    mp.spawn(run, args=(2, A.port), nprocs=2)
