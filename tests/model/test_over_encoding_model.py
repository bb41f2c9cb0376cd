"""Seed 002 in the GPT: Over-Encoding, moment-free group, routing, arms' parameter counts."""

import copy

import pytest
import torch
from support.models import live_baseline as _live_baseline, small
from support.ranks import run_ranks

from muonlab.arms import ARMS, resolve_config
from muonlab.model import GPT, find_variant
from muonlab.optim import DistMuonAdamW, MuonAdamW
from muonlab.train.build import model_config


def _live(seed=0, **kw):
    return _live_baseline(seed, **kw)


def _like(base, **kw):
    model = GPT(small(**kw))
    model.init_weights()
    model.float()
    _, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected
    return model


IDX = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("variant", [dict(oe_m=101), dict(oe_m=101, routing="sepden"),
                                     dict(oe_m=101, routing="sepden", routing_out=True),
                                     dict(oe_m=101, routing="shden", routing_out=True),
                                     dict(routing="shden", routing_eps=2.0 ** -23)], ids=str)
def test_neutral_init_reproduces_the_fused_forward_bitwise(variant):
    base = _live()
    assert torch.equal(_like(base, **variant)(IDX), base(IDX))


def test_over_encoding_changes_the_forward_once_trained():
    base = _live()
    model = _like(base, oe_m=101)
    with torch.no_grad():
        for table in model.oe.tables:
            table.weight.normal_(0, 0.5)
    assert not torch.equal(model(IDX), base(IDX))


def test_shared_denominator_cancels_w():
    """a x0 + b a_w with b = -a leaves a e / s_{w+e}: w cancels up to rounding (seed 002 §2.1 Tier 3)."""
    model = _live(oe_m=101, routing="shden", routing_eps=2.0 ** -23)
    with torch.no_grad():
        for table in model.oe.tables:
            table.weight.normal_(0, 0.5)
    w = model.transformer.wte(IDX).double()
    e = model.oe(IDX).double()
    x0 = torch.nn.functional.rms_norm((w + e).float(), (64,)).double()
    a_w = find_variant(model, "routing").anchor(w.float(), e.float()).double()
    s = ((w + e).square().mean(-1, keepdim=True) + 2.0 ** -23).sqrt()
    a = 0.7
    torch.testing.assert_close(a * x0 - a * a_w, a * e / s, rtol=0, atol=1e-5)
    sep = _live(oe_m=101, routing="sepden")
    with torch.no_grad():
        for t_sep, t in zip(sep.oe.tables, model.oe.tables):
            t_sep.weight.copy_(t.weight)
    sep_a_w = find_variant(sep, "routing").anchor(w.float(), e.float()).double()
    assert (a * x0 - a * sep_a_w - a * e / s).abs().max() > 1e-2  # separate denominators cannot cancel w


def test_moment_free_group_counts_and_updates_only_visited_rows():
    model = _live(oe_m=101)
    opt = model.setup_optimizer()
    group = next(g for g in opt.param_groups if g["kind"] == "oe_mfree")
    assert group["params"] == list(model.oe.parameters()) and group["weight_decay"] == 0.0
    assert group["lr"] == pytest.approx(0.2 * (64 / 768) ** -0.5)  # embedding_lr x (d/768)^-1/2
    before = [t.weight.detach().clone() for t in model.oe.tables]
    batches = [IDX, IDX.flip(0)]
    for x in batches:  # two micro-steps: counts accumulate, loss / 2
        model.oe.count_(x)
        (model(x, x.roll(-1, 1)) / 2).backward()
    visited = [c > 0 for c in model.oe.counts()]
    expected_visits = sum(len(torch.cat([h.flatten() for h in model.oe.ids(x)[:1]])) for x in batches)
    assert int(model.oe.counts()[0].sum()) == expected_visits
    opt.step()
    for t, b, hit in zip(model.oe.tables, before, visited):
        assert torch.equal(t.weight[~hit], b[~hit])  # unvisited rows untouched
        assert (t.weight[hit] != b[hit]).any()
    assert all(int(c.count_nonzero()) == 0 for c in model.oe.counts())  # counts zeroed by the step
    assert not any(opt.state[p] for p in model.oe.parameters())  # no moments: counts are the only state


@pytest.mark.parametrize("arm,d6,d8", [
    ("00_dense_native", 26_345_772, 50_332_176), ("01_dense_opt", 26_345_772, 50_332_176),
    ("02_dense_joint", 26_346_924, 50_334_224), ("10_oe_native", 84_275_244, 127_571_472),
    ("11_oe_opt", 84_275_244, 127_571_472), ("12_oe_joint", 84_276_396, 127_573_520),
    ("12m_oe_masked_qk", 84_276_396, 127_573_520), ("12d_oe_decoupled_x0", 84_276_402, 127_573_528),
    ("12do_oe_decoupled_x0_out", 84_276_404, 127_573_530), ("12do_shared_denom", 84_276_404, 127_573_530),
    ("12d_bf16_shared_denom", 84_276_402, 127_573_528),
])
def test_arm_parameter_counts_match_spec_002(arm, d6, d8):
    """Seed 002 §3 item 1: params = backbone (result.json) + OE tables, at depth 6 and depth 8."""
    for name, want in (("gpu-d6", d6), ("gpu-d8", d8)):
        cfg = resolve_config(arm, name)
        with torch.device("meta"):
            model = GPT(model_config(cfg, vocab_size=8192))
        counts = model.num_scaling_params()
        assert counts.get("total_with_oe", counts["total"]) == want, name
        assert sum(p.numel() for p in model.parameters()) == want


def test_every_seed002_arm_resolves_with_the_papers_seeds():
    arms = [a for a in ARMS.values() if a.paper == "seed 002"]
    assert len(arms) >= 22
    for arm in arms:
        assert arm.seeds in ((41, 42, 47), (42,)), arm.name
        resolve_config(arm.name, "cpu-tiny")


# ---------------------------------------------------------------- distributed

def _oe_setup():
    g = torch.Generator().manual_seed(4)
    tables = [torch.nn.Parameter((torch.randn(rows, 8, generator=g) * 0.1).bfloat16()) for rows in (13, 17)]
    return tables


def _rank_inputs(tables, rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    grads = [(torch.randint(-8, 9, t.shape, generator=g).float() / 16).bfloat16() for t in tables]
    counts = [torch.randint(0, 3, (t.shape[0],), generator=g).float() for t in tables]
    return grads, counts


def _oe_worker(rank, world, steps):
    tables = _oe_setup()
    counts = [torch.zeros(t.shape[0]) for t in tables]
    opt = DistMuonAdamW([dict(kind="oe_mfree", params=tables, lr=0.3)])
    opt.attach_visit_counts(tables, counts)
    for step in range(steps):
        grads, visits = _rank_inputs(tables, rank, step)
        for t, g, c, v in zip(tables, grads, counts, visits):
            t.grad = g
            c.copy_(v)
        opt.step()
    return [t.detach().clone() for t in tables]


def test_distributed_moment_free_equals_one_process(tmp_path):
    """Gradients averaged and visit counts summed over ranks: the same update as one process."""
    steps = 2
    results = run_ranks(_oe_worker, 2, tmp_path / "ranks", steps)
    tables = _oe_setup()
    counts = [torch.zeros(t.shape[0]) for t in tables]
    opt = MuonAdamW([dict(kind="oe_mfree", params=tables, lr=0.3)])
    opt.attach_visit_counts(tables, counts)
    for step in range(steps):
        (g0, v0), (g1, v1) = _rank_inputs(tables, 0, step), _rank_inputs(tables, 1, step)
        for t, a, b, c, va, vb in zip(tables, g0, g1, counts, v0, v1):
            t.grad = (a + b) / 2  # exact: dyadic values
            c.copy_(va + vb)
        opt.step()
    for res in results:
        for got, want in zip(res, tables):
            assert torch.equal(got, want)
    assert copy.deepcopy(opt.state_dict())["state"] == {}


# One arm per mechanism of seed 002's OE arms (every registered arm also trains to its golden
# bits in fp32, tests/arms/test_arm_checksums.py): OE alone, joint with master32, table whitening, native
# (bf16) state, the shared denominator in fp32 and bf16, and two step-0 controls.
SEED002_BF16_ARMS = ["10_oe_native", "12_oe_joint", "3b_oe_table_neumann_joint", "4a_12_oe_joint_bf16state",
                     "12do_shared_denom", "12d_bf16_shared_denom", "12do_nostep0_all", "12do_mom_only_nodisp"]


@pytest.mark.parametrize("arm", SEED002_BF16_ARMS)
def test_seed002_arm_trains_on_cpu_preset(arm, capsys):
    """Seed-002 arms through the CLI on cpu-tiny in bf16 (so master32 has bf16 tables to act on)."""
    assert ARMS[arm].paper == "seed 002"
    import json

    from muonlab.cli import main
    argv = ["train", "--preset", "cpu-tiny", "--arm", arm, "--num-steps", "2", "--precision", "bf16", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok"
    assert ("oe_params_M" in out["summary"]) == ("model.oe.m" in ARMS[arm].overrides)


def test_oe_run_resumes_bitwise_from_a_checkpoint(tmp_path, capsys):
    """OE tables, routing scalars, table-Neumann counters and q_tau all survive a checkpoint:
    resuming from the step-4 checkpoint reproduces the uninterrupted run's final weights."""
    import json
    import shutil

    from muonlab.cli import main
    from muonlab.train.checkpoint import list_checkpoints
    argv = ["train", "--preset", "cpu-tiny", "--arm", "12do_oe_decoupled_x0_out", "--table-whiten", "neumann",
            "--oe-m", "1009", "--num-steps", "8", "--checkpoint-every", "4", "--checkpoint-keep", "3",
            "--run-name", "full", "--json"]
    assert main(argv) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    final = torch.load(f"{run_dir}/model.pt", weights_only=True)
    copy_dir = tmp_path / "copy"
    shutil.copytree(run_dir, copy_dir)
    for ckpt in list_checkpoints(copy_dir):  # keep only the step-4 checkpoint
        if "000004" not in ckpt.name:
            ckpt.unlink()
            ckpt.with_suffix(".json").unlink()
    (copy_dir / "model.pt").unlink()
    assert main(["train", "--resume", str(copy_dir), "--json"]) == 0
    capsys.readouterr()
    resumed = torch.load(copy_dir / "model.pt", weights_only=True)
    assert final.keys() == resumed.keys() and any(k.startswith("oe.") for k in final)
    for name in final:
        assert torch.equal(final[name], resumed[name]), name
