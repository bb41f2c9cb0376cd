"""torch.distributed collectives on the device their backend communicates on.

NCCL reads CUDA tensors only, gloo CPU ones (muonlab pairs NCCL with CUDA runs and gloo with CPU runs:
train/distributed.py). Every collective muonlab calls goes through this module: small tensors made for
a collective (has-gradient flags, step counters) come from `comm_tensor`, which makes them on
`comm_device(group)`, and each collective refuses a tensor on another device with a one-line error that
names the fix, instead of NCCL failing at a run's first step.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

# the device type each backend reads; a backend registered with torch.distributed: the first it declares
_BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}

# torch 2.13 renamed the tensor collectives; keep the old names working on older torch
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def comm_device(group=None) -> torch.device:
    """The device `group`'s backend communicates on (this rank's current GPU for NCCL)."""
    backend = str(dist.get_backend(group))
    kind = _BACKEND_DEVICE.get(backend) or next(iter(dist.Backend.backend_capability.get(backend, ["cpu"])))
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def comm_tensor(values: Sequence[Any], dtype: torch.dtype, group=None) -> torch.Tensor:
    """A small tensor of `values` for a collective, made on the group's communication device."""
    return torch.tensor(list(values), dtype=dtype, device=comm_device(group))


def _check(tensors: Sequence[torch.Tensor], group) -> None:
    device = comm_device(group)
    for t in tensors:
        if t.device != device:
            raise RuntimeError(f"a {dist.get_backend(group)} collective got a tensor on {t.device}, but the group "
                               f"communicates on {device}: make it there (muonlab.optim.collectives.comm_tensor)")


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    _check((tensor,), group)
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Sum `input` over the ranks and keep this rank's slice of the first dimension in `output`."""
    _check((output, input), group)
    return _reduce_scatter(output, input, group=group, async_op=async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Every rank's `input`, concatenated in rank order along the first dimension, into `output`."""
    _check((output, input), group)
    return _all_gather(output, input, group=group, async_op=async_op)


def all_gather_object(out: list, obj: Any, group=None) -> None:
    dist.all_gather_object(out, obj, group=group)  # pickled; torch moves the bytes to the group's device


def broadcast_object_list(box: list, src: int = 0, group=None) -> None:
    dist.broadcast_object_list(box, src=src, group=group)


def barrier(group=None) -> None:
    dist.barrier(group=group)
