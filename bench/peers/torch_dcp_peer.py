"""Peer: PyTorch Distributed Checkpoint (torch.distributed.checkpoint) saving and loading the
same GPT training state as `bench_checkpoint --gpt`: dtensor's nn::GPT shapes (token and position
embeddings, pre-norm blocks with q/k/v/o and a 4x MLP, final LayerNorm, tied head), FSDP2
(`fully_shard` per block, then the root) on 2 ranks over gloo, AdamW after one step, then
dcp.save / dcp.load of {"model": ..., "optim": ...} through torch.distributed.checkpoint.state_dict
(get_state_dict / set_state_dict), as TorchTitan checkpoints.

Run: python torch_dcp_peer.py [--dim 768] [--layers 6] [--vocab 8192] [--rounds 3] [--dir /tmp]
Prints one JSON line (rank 0): save and load ms (median over rounds, slowest rank), bytes on disk.
Before each load the checkpoint's files are dropped from the page cache (posix_fadvise), as
bench_checkpoint does."""
import argparse, json, os, shutil, statistics, tempfile, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

ap = argparse.ArgumentParser()
ap.add_argument("--dim", type=int, default=768)
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--vocab", type=int, default=8192)
ap.add_argument("--heads", type=int, default=12)
ap.add_argument("--seq", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--dir", default="/tmp")
ap.add_argument("--port", type=int, default=29533)
A = ap.parse_args()
V, D, L, H, T = A.vocab, A.dim, A.layers, A.heads, A.seq


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.q, s.k, s.v, s.o = (nn.Linear(D, D) for _ in range(4))
        s.fc1, s.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(s, x):
        b, t, _ = x.shape
        h = s.ln1(x)
        q, k, v = (m(h).view(b, t, -1, D // H).transpose(1, 2) for m in (s.q, s.k, s.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + s.o(a)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.ln = nn.LayerNorm(D)

    def forward(s, ids):
        x = s.tok(ids) + s.pos(torch.arange(ids.shape[1]))
        for blk in s.blocks:
            x = blk(x)
        return s.ln(x) @ s.tok.weight.t()


def drop_cache(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def run(rank, world, out_dir, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(A.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = GPT()
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.zeros(1, 16, dtype=torch.long)
    F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    opt.step()
    saves, loads = [], []
    for r in range(A.rounds):
        path = os.path.join(out_dir, f"round{r}")
        dist.barrier()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        saves.append(t.item())
        if rank == 0:
            drop_cache(path)
        dist.barrier()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        loads.append(t.item())
    if rank == 0:
        path = os.path.join(out_dir, "round0")
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        params = sum(p.numel() for p in model.parameters())  # shards: the global count below
        with open(result_path, "w") as f:
            json.dump({"peer": "torch.distributed.checkpoint", "torch": torch.__version__,
                       "save_ms": 1e3 * statistics.median(saves), "load_ms": 1e3 * statistics.median(loads),
                       "save_best_ms": 1e3 * min(saves), "load_best_ms": 1e3 * min(loads), "bytes": size}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    out = tempfile.mkdtemp(dir=A.dir, prefix="torch_dcp_peer_")
    result = os.path.join(out, "result.json")
    try:
        mp.spawn(run, args=(2, out, result), nprocs=2)
        print(open(result).read())
    finally:
        shutil.rmtree(out, ignore_errors=True)
