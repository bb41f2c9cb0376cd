"""runtime.collectives = always: a torchrun world of one runs the N-rank optimizer step (its reduce_scatter,
all_gather and all_reduce), so the GPU check exercises the collectives on NCCL with one GPU. Here on gloo, in
this process: bit for bit the single-process step, for DistMuonAdamW and DistAFMuon, state included."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from muonlab.arms import resolve_config
from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _trained(preset: str, arm: str, distributed: bool, steps: int = 3):
    cfg = resolve_config(arm, preset, {"runtime.collectives": "always"})
    runtime = Runtime(torch.device("cpu"), "fp32")
    torch.manual_seed(0)
    model = build_model(cfg, cfg.data.vocab_size, runtime)
    optimizer = build_optimizer(model, cfg, compile_step=False, distributed=distributed)
    g = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=g) * 0.1 for p in model.parameters()] for _ in range(steps)]
    for step in range(steps):
        for p, grad in zip(model.parameters(), grads[step]):
            p.grad = grad.clone()
        if not distributed and cfg.train.grad_clip:  # the loop clips for one process; DistAFMuon clips itself
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state = optimizer.full_state_dict() if distributed else optimizer.state_dict()
    return model, optimizer, state


def _same_state(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("preset, arm, kind", [("cpu-tiny", "baseline", "DistMuonAdamW"),
                                               ("tied-cpu", "t1_afmuon", "DistAFMuon")])
def test_a_world_of_one_runs_the_collective_step_bit_for_bit(world_of_one, monkeypatch, preset, arm, kind):
    calls = []
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "reduce_scatter"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    one, _, one_state = _trained(preset, arm, distributed=False)
    assert not calls
    many, optimizer, many_state = _trained(preset, arm, distributed=True)
    assert type(optimizer).__name__ == kind and optimizer.always_collective
    assert calls, "the N-rank step ran no collective"
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), many.parameters()))
    assert _same_state(one_state["state"], many_state["state"])
