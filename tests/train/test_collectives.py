"""Collectives on the communication device: every torch.distributed collective in muonlab goes through
muonlab.optim.collectives, whose tensors are made on the group's device (NCCL: the current GPU) and
whose collectives refuse a tensor elsewhere with a one-line error. The 2-rank gloo runs of both
distributed optimizers (tests/optim/test_optim_distributed.py, tests/optim/test_af_muon_distributed.py) run through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import muonlab
from muonlab.optim import collectives

# what torch.distributed calls collectives (a call to any of them outside the helper is a defect)
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_object", "broadcast",
               "broadcast_object_list", "barrier", "all_to_all", "all_to_all_single", "gather", "scatter",
               "reduce", "send", "recv", "isend", "irecv", "monitored_barrier"}
HELPER = Path(collectives.__file__).resolve()


def _distributed_calls(path: Path) -> list[str]:
    """`dist.X(...)`, `torch.distributed.X(...)` and `getattr(dist, "X")` uses of a collective X in a file."""
    tree = ast.parse(path.read_text())
    aliases = {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in COLLECTIVES and ast.unparse(node.value) in aliases:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) >= 2 \
                and ast.unparse(node.args[0]) in aliases and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in COLLECTIVES:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_collective_in_muonlab_goes_through_the_helper():
    root = Path(muonlab.__file__).resolve().parent
    outside = [call for path in sorted(root.rglob("*.py")) if path.resolve() != HELPER
               for call in _distributed_calls(path)]
    assert not outside, outside
    assert _distributed_calls(HELPER), "the scan finds the helper's own calls"  # it can see a call


def _as_nccl(monkeypatch):
    """This process seen as an NCCL rank on GPU 0 (nothing is created on a GPU)."""
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    reached = []
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        monkeypatch.setattr(dist, name, lambda *a, **k: reached.append(a))
    monkeypatch.setattr(collectives, "_all_gather", lambda *a, **k: reached.append(a))
    monkeypatch.setattr(collectives, "_reduce_scatter", lambda *a, **k: reached.append(a))
    return reached


def test_an_nccl_group_communicates_on_the_current_gpu_and_a_gloo_group_on_the_cpu(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert collectives.comm_device() == torch.device("cpu")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collectives.comm_device() == torch.device("cuda", 3)


@pytest.mark.parametrize("call", ["all_reduce", "all_gather", "reduce_scatter"])
def test_a_cpu_tensor_handed_to_an_nccl_collective_is_refused_before_nccl_sees_it(call, monkeypatch):
    """Today's DistAFMuon defect in one line: has-gradient flags made on the CPU (torch.tensor without a
    device) handed to an NCCL all_reduce. The helper refuses it with the fix instead of a crash in NCCL."""
    reached = _as_nccl(monkeypatch)
    flags = torch.tensor([1.0, 0.0])
    args = (flags,) if call == "all_reduce" else (torch.empty(4), flags)
    with pytest.raises(RuntimeError, match=r"got a tensor on cpu, but the group communicates on cuda:0.*comm_tensor"):
        getattr(collectives, call)(*args)
    assert reached == []
