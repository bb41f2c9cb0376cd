"""Embedding-state precision (seed 002 §2.1 (Tier 1), §4.3 item 2): master32 vs native bf16 state."""

import copy

import pytest
import torch
from support.ranks import assert_state_equal, averaged_replay, dyadic_steps, run_ranks

from muonlab.config import preset
from muonlab.model import GPT
from muonlab.optim import DistMuonAdamW, MuonAdamW
from muonlab.train.build import model_config

MiB = 2**20


def _state_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("name,extra_mib", [("gpu-d6", 96.0), ("gpu-d8", 160.0)])
def test_master32_memory_matches_the_analysis(name, extra_mib):
    """+8 B per wte/value-embedding parameter: 96.0 MiB at depth 6, 160.0 MiB at depth 8 (seed 002 §2.1, §3 item 3)."""
    torch.manual_seed(0)
    model = GPT(model_config(preset(name), vocab_size=8192))
    model.init_weights()  # wte and value embeddings in bf16, as upstream
    tables = list(model.transformer.wte.parameters()) + list(model.value_embeds.parameters())
    sizes = {}
    for master32 in (False, True):
        opt = MuonAdamW([dict(kind="adamw", params=tables, lr=0.1, master32=master32)])
        for p in tables:
            p.grad = torch.full_like(p, 1e-3)
        opt.step()
        sizes[master32] = _state_bytes(opt)
        if master32:
            assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
        else:
            assert all(s["exp_avg"].dtype == torch.bfloat16 for s in opt.state.values())
    assert (sizes[True] - sizes[False]) / MiB == extra_mib


def _adamw_f64(p, g_seq, lr=0.05, b1=0.8, b2=0.95, eps=1e-10):
    m = torch.zeros_like(p); v = torch.zeros_like(p)  # noqa: E702
    for t, g in enumerate(g_seq, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1**t) * m / ((v / (1 - b2**t)).sqrt() + eps)
    return p


def test_master32_tracks_float64_adamw_better_than_bf16_state():
    torch.manual_seed(0)
    init = torch.randn(64, 32)
    grads = [torch.randn(64, 32) * 1e-2 for _ in range(20)]
    exact = _adamw_f64(init.double(), [g.double() for g in grads])
    errors = {}
    for master32 in (False, True):
        p = torch.nn.Parameter(init.bfloat16())
        opt = MuonAdamW([dict(kind="adamw", params=[p], lr=0.05, master32=master32)])
        for g in grads:
            p.grad = g.bfloat16()
            opt.step()
        errors[master32] = (p.double() - exact).norm().item() / (exact - init.double()).norm().item()
        if master32:  # the fp32 master itself follows float64 AdamW to fp32 precision (bf16 grads aside)
            master = opt.state[p]["master"].double()
            ref = _adamw_f64(init.bfloat16().double(), [g.bfloat16().double() for g in grads])
            assert (master - ref).norm() / (ref - init.double()).norm() < 1e-4
            assert torch.equal(p.detach(), opt.state[p]["master"].bfloat16())
    assert errors[True] < errors[False]


def test_master32_state_round_trip():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8, 4).bfloat16())
    opt = MuonAdamW([dict(kind="adamw", params=[p], lr=0.05, master32=True)])
    p.grad = torch.randn(8, 4).bfloat16()
    opt.step()
    saved = opt.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = MuonAdamW([dict(kind="adamw", params=[q], lr=0.05, master32=True)])
    opt2.load_state_dict(saved)
    assert opt2.state[q]["master"].dtype == torch.float32  # not cast down to the param's bf16
    g = torch.randn(8, 4).bfloat16()
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(p, q)


# ---------------------------------------------------------------- distributed (ZeRO-1)

def _dist_tables():
    g = torch.Generator().manual_seed(5)
    # 64 x 32: row-sharded at W=2 (its fp32 master too); 10 x 8: replicated
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).bfloat16()) for s in ((64, 32), (10, 8))]


def _dist_groups(ps):
    return [dict(kind="adamw", params=ps, lr=0.05, master32=True)]


def _dist_worker(rank, world, steps):
    ps = _dist_tables()
    opt = DistMuonAdamW(_dist_groups(ps))
    history = dyadic_steps(opt, ps, rank, steps)
    return {"history": history, "full": opt.full_state_dict(), "shard": copy.deepcopy(opt.state_dict())}


def test_distributed_master32_equals_one_process(tmp_path):
    steps = 3
    results = run_ranks(_dist_worker, 2, tmp_path / "ranks", steps)
    ps = _dist_tables()
    opt, ref = averaged_replay(ps, _dist_groups(ps), steps)
    for rank, res in enumerate(results):
        for step in range(steps):
            assert torch.equal(res["history"][step], ref[step]), (rank, step)
        assert_state_equal(res["full"], opt.state_dict())
        shard = res["shard"]["state"]
        assert shard[0]["master"].shape == (32, 32) and shard[0]["master"].dtype == torch.float32
        assert shard[1]["master"].shape == (10, 8)  # small table: replicated
