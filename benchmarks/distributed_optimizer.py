"""DistMuonAdamW on CPU/gloo: one optimizer step over W ranks vs the single-process step.

Shapes: the Muon matrices (transformer.h) of the seed papers' depth-8 model, GPT(GPTConfig(
sequence_len=2048, vocab_size=8192, n_layer=8, n_head=4, n_kv_head=4, n_embd=512)), one
Muon group per shape as `setup_optimizer` makes them. Only those matrices are allocated (the
model is built on the meta device to read the shapes).

Both contenders run in the same W spawned gloo processes, interleaved step by step so that
machine noise hits both alike: "1 rank" is MuonAdamW (DistMuonAdamW's world-size-1 path) on
rank 0 while the other ranks wait at a barrier; "W ranks" is DistMuonAdamW over all ranks
(reduce-scatter, 1/W of the orthogonalisation per rank, all-gather), timed as the slowest
rank. Every rank uses one thread (torch.set_num_threads(1)) in both cases, so on a 2-core
machine the split is fair: W ranks may use W cores, one rank one core. Ratio below 1.0 means
the distributed step is faster. Absolute times on shared machines are noise; read the ratio.

    python benchmarks/distributed_optimizer.py [--world 2] [--repeats 3] [--warmup 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved  # noqa: E402

from muonlab.model import GPT, GPTConfig  # noqa: E402
from muonlab.optim import DistMuonAdamW, MuonAdamW  # noqa: E402

D8 = dict(sequence_len=2048, vocab_size=8192, n_layer=8, n_head=4, n_kv_head=4, n_embd=512)


def matrix_shapes() -> list[tuple[int, int]]:
    with torch.device("meta"):  # shapes only, no memory
        model = GPT(GPTConfig(**D8))
    return [tuple(p.shape) for p in model.transformer.h.parameters()]


def muon_groups(shapes, seed: int, grad_seed: int):
    """One Muon group per shape (as setup_optimizer), with fixed parameters and gradients."""
    g = torch.Generator().manual_seed(seed)
    gg = torch.Generator().manual_seed(grad_seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02)
        p.grad = torch.randn(shape, generator=gg)  # the optimizer never modifies p.grad
        params.append(p)
    return [dict(kind="muon", params=[p for p in params if tuple(p.shape) == s], lr=0.02, momentum=0.95,
                 ns_steps=5, beta2=0.95, weight_decay=0.2) for s in sorted(set(shapes))]


def _rank_main(rank, world, port, repeats, warmup, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    shapes = matrix_shapes()
    # same parameters on every rank, a different local gradient per rank
    dist_opt = DistMuonAdamW(muon_groups(shapes, seed=0, grad_seed=1 + rank))
    single = MuonAdamW(muon_groups(shapes, seed=0, grad_seed=1)) if rank == 0 else None

    def one_rank():
        dist.barrier()
        t0 = time.perf_counter()
        if single is not None:
            single.step()
        elapsed = time.perf_counter() - t0
        dist.barrier()
        return {"opt": elapsed}

    def all_ranks():
        dist.barrier()
        t0 = time.perf_counter()
        dist_opt.step()
        elapsed = torch.tensor(time.perf_counter() - t0, dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank does
        return {"opt": elapsed.item()}

    times = interleaved({"1 rank": one_rank, f"{world} ranks": all_ranks}, repeats=repeats, warmup=warmup)
    if rank == 0:
        n_params = sum(torch.Size(s).numel() for s in shapes)
        Path(out_path).write_text(json.dumps({
            "world_size": world, "threads_per_rank": 1, "backend": "gloo",
            "shapes": {f"{r}x{c}": n for (r, c), n in sorted(Counter(shapes).items())},
            "muon_params_M": n_params / 1e6,
            "seconds_1_rank": times["1 rank"]["opt"], f"seconds_{world}_ranks": times[f"{world} ranks"]["opt"],
            "ratio": times[f"{world} ranks"]["opt"] / times["1 rank"]["opt"],
            "repeats": repeats, "warmup": warmup,
        }))
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are killed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = Path(tempfile.gettempdir()) / f"muonlab_dist_bench_{port}.json"  # the platform's temp dir
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, args.world, port, args.repeats, args.warmup, str(out_path)))
             for r in range(args.world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    if any(p.is_alive() for p in procs) or any(p.exitcode for p in procs) or not out_path.exists():
        for p in procs:
            if p.is_alive():
                p.kill()
        sys.exit(f"benchmark failed: exit codes {[p.exitcode for p in procs]}")
    result = json.loads(out_path.read_text())
    out_path.unlink()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    W = result["world_size"]
    shapes = ", ".join(f"{n} x {s}" for s, n in result["shapes"].items())
    print(f"Muon step, depth-8 matrices ({shapes}; {result['muon_params_M']:.1f}M params)")
    print(f"gloo on CPU, 1 thread per rank in both cases; median of {result['repeats']} interleaved steps")
    print(f"  1 rank  (MuonAdamW):          {result['seconds_1_rank']:.3f} s")
    print(f"  {W} ranks (DistMuonAdamW):      {result[f'seconds_{W}_ranks']:.3f} s  (slowest rank)")
    print(f"  ratio {W}-rank / 1-rank:         {result['ratio']:.3f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
