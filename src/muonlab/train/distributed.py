"""The process group of a multi-process run launched by `torchrun` (PyTorch's own engine).

`torchrun --nproc_per_node=N -m muonlab train ...` sets RANK, WORLD_SIZE and LOCAL_RANK;
this module joins the group (NCCL on CUDA, gloo on CPU), pins each rank to its GPU and gives
the few collectives the training loop and evaluation need. A torchrun world of one joins a
group too and takes the N-rank code path (collectives, sharded optimizer state, gathered
checkpoints) on one GPU: the acceptance check runs NCCL that way. Without those variables
everything here is a no-op and the run is the single-process code path.
Multi-node runs use torchrun's rendezvous (`--nnodes`, `--rdzv-endpoint`); nothing here
depends on the number of nodes.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from muonlab.errors import UsageError
from muonlab.optim import collectives


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # the joined group's ("nccl", "gloo"); None: a single process

    @property
    def active(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.active:
            collectives.all_reduce(tensor, op=op)
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        collectives.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        if not self.active:
            return obj
        box = [obj]
        collectives.broadcast_object_list(box, src=0)
        return box[0]


def launched_as_rank() -> bool:
    """This process is one rank of a world torchrun (or a SLURM task through torchrun's variables) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def exit_rank(code: int) -> NoReturn:
    """End a rank once its command returned: its output flushed, its logs closed, then out without the
    interpreter's finalization. A rank's run has recorded, written and left its group by then (shutdown); what
    finalization would still do is tear down the threads the libraries started (gloo's, a store's, the
    tokenizer's), and a thread torn down inside C++ code aborts the process ("terminate called without an active
    exception", exit -6: seen once in a suite run on a two-rank gloo run that had ended ok)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            pass
    logging.shutdown()
    os._exit(code)


def init_from_env(device: torch.device, timeout_s: float = 1800) -> tuple[Dist, torch.device]:
    """Join the torchrun process group if there is one; return it and this rank's device."""
    if not launched_as_rank():  # not launched by torchrun
        return Dist(), device
    world = int(os.environ["WORLD_SIZE"])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise UsageError(f"distributed training supports CUDA (NCCL) and CPU (gloo), not {device.type}")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    return Dist(rank=rank, world_size=world, local_rank=local_rank, backend=backend), device


def shutdown(ctx: Dist) -> None:
    """Leave the group while the interpreter is whole: whatever still holds a collective's work or tensors
    (a traceback, a reference cycle) is freed first, the ranks leave together, and the group is destroyed
    before exit. Gloo's worker threads releasing such objects during interpreter finalization is a known way to
    abort a rank (pytorch/pytorch#179291); whether it caused the -6 abort seen once in the suite is not confirmed."""
    if ctx.active and dist.is_initialized():
        gc.collect()
        try:
            collectives.barrier()  # leave together: a peer tearing down early can abort gloo's threads
        except Exception:  # a failed peer: tear down regardless
            pass
        dist.destroy_process_group()
        gc.collect()
