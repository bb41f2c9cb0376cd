"""DistAFMuon (seed 004 issue 15 item 6): AF-Muon and its baselines across ranks, with gradient clipping
on the averaged gradient. Two gloo processes on CPU against one process: bit for bit."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from muonlab.cli import main
from muonlab.optim.af_muon import build_optimizer
from muonlab.optim.af_muon_distributed import DistAFMuon
from muonlab.families.tied.model import build_tied_model
from support.ranks import run_ranks  # tests/ is on sys.path
from support.torchrun import ended_cleanly, run_muonlab


def _model():
    torch.manual_seed(0)
    model = build_tied_model("tied-tiny")
    model.init_weights()
    return model


def _grads(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * 0.3 for n, p in model.named_parameters()}


def _steps(preset: str, opt_of, grads_of, steps: int = 3):
    """Model and optimizer after `steps` steps; grads_of(step) -> {name: gradient}."""
    model = _model()
    opt = opt_of(model, preset)
    for step in range(steps):
        for n, p in model.named_parameters():
            p.grad = grads_of(step)[n].clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


PRESETS = ("afmuon", "hybrid", "sign")


def _rank_steps(rank: int, world: int) -> dict:
    """This rank's model and optimizer after three steps of each preset (run_ranks: the group is joined
    and left around it)."""
    def dist_opt(model, p):
        base = build_optimizer(model, p)
        return DistAFMuon(base.param_groups, max_grad_norm=1.0, clip_params=model.parameters())
    results = {}
    for preset in PRESETS:
        model, opt = _steps(preset, dist_opt, lambda step: _grads(model_ref, 100 * step + rank))
        full = opt.full_state_dict()
        fresh = dist_opt(_model(), preset)  # a fresh optimizer loads the full layout and gives it back whole
        fresh.load_state_dict(full)
        results[preset] = {"params": {n: p.detach() for n, p in model.named_parameters()}, "state": full,
                           "again": fresh.full_state_dict(), "grad_norm": opt.last_grad_norm}
    return results


model_ref = _model()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Three steps of each preset on 2 gloo ranks (support.ranks: forked from a server that imported torch
    once, and a rank aborted by gloo's teardown after its result was saved does not fail the start), rank
    0's results, each rank fed its own gradients."""
    return run_ranks(_rank_steps, 2, tmp_path_factory.mktemp("dist"))[0]


@pytest.mark.parametrize("preset", PRESETS)
def test_two_ranks_step_as_one_process_fed_the_mean_gradient(two_ranks, preset):
    got = two_ranks[preset]

    norms = []

    def clipped_single(model, p):
        opt = build_optimizer(model, p)
        inner = opt.step

        def step():  # the single process clips the mean gradient, then steps
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            inner()
        opt.step = step
        return opt
    mean = lambda step: {n: (g0 + g1) / 2 for (n, g0), g1 in  # noqa: E731
                         zip(_grads(model_ref, 100 * step).items(), _grads(model_ref, 100 * step + 1).values())}
    model, opt = _steps(preset, clipped_single, mean)
    for n, p in model.named_parameters():
        assert torch.equal(got["params"][n], p.detach()), n
    assert torch.equal(got["grad_norm"], norms[-1])  # the logged norm: the mean gradient's, before the clip
    want = opt.state_dict()
    for state in (got["state"], got["again"]):  # the gathered layout is the one-process layout
        assert state["state"].keys() == want["state"].keys()
        for i, st in want["state"].items():
            for key, value in st.items():
                other = state["state"][i][key]
                assert torch.equal(other, value) if torch.is_tensor(value) else other == value, (i, key)


def _train(tmp_path, name, nproc, arm, capsys):
    """The run on `nproc` gloo ranks under torchrun, or in this process (one thread: the worker's, as the ranks')."""
    argv = ["train", "--preset", "tied-cpu", "--arm", arm, "--num-steps", "6", "--run-name", name, "--json"]
    if nproc == 1:
        assert main(argv) == 0
        out = capsys.readouterr().out
    else:
        env = dict(os.environ, MUONLAB_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
        out = ended_cleanly(run_muonlab(argv, env, nproc)).stdout
    return json.loads(out), tmp_path / "cache" / "runs" / name


def test_torchrun_af_muon_run_equals_the_one_process_run(tmp_path, capsys):
    """`torchrun --nproc_per_node 2 -m muonlab train --preset tied-cpu` (gloo; grad clip 1.0, one micro-batch
    per rank) gives the 1-process run's weights, checkpointed state and val loss bit for bit; its checkpoint is
    refused by one process."""
    single, s_dir = _train(tmp_path, "single", 1, "t1_afmuon", capsys)
    double, d_dir = _train(tmp_path, "double", 2, "t1_afmuon", capsys)
    assert double["summary"]["val_ce"] == single["summary"]["val_ce"]
    ws, wd = (torch.load(d / "model.pt", weights_only=True) for d in (s_dir, d_dir))
    assert all(torch.equal(ws[k], wd[k]) for k in ws)
    cs, cd = (torch.load(sorted(glob.glob(str(d / "checkpoints" / "*.pt")))[-1], weights_only=True)["optimizer"]
              for d in (s_dir, d_dir))
    assert cs["state"].keys() == cd["state"].keys()
    assert all(torch.equal(v, cd["state"][i][k]) for i, st in cs["state"].items() for k, v in st.items())
    # a checkpoint written by 2 ranks is refused by 1 process with a clear message (the run as if stopped before
    # its summary: a finished one is refused first, for having nothing to resume)
    (d_dir / "summary.json").unlink()
    assert main(["train", "--resume", str(d_dir)]) == 2
    assert "same number" in capsys.readouterr().err


def test_torchs_adamw_is_refused_under_torchrun():
    """t1_adamw is torch's AdamW: it cannot average across ranks, so a distributed build refuses it."""
    from muonlab.arms import resolve_config
    from muonlab.errors import UsageError
    from muonlab.families.tied import build_optimizer as family_optimizer

    cfg = resolve_config("t1_adamw", "tied-cpu", {})
    with pytest.raises(UsageError, match="optimizer adamw .torch's AdamW. runs in one process; under torchrun"):
        family_optimizer(_model(), cfg, compile_step=False, distributed=True)
