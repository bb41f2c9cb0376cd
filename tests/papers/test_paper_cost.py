"""`muonlab paper run TABLE --preset P --dry-run` prices a table before it runs: each missing run's FLOPs
(the model's training FLOPs per token times its tokens, plus a forward pass over each evaluation) and the
GPU-hours at a stated MFU of a GPU's dense bf16 peak; runs already in the ledger are not priced."""

from __future__ import annotations

import json

import pytest
import torch

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.device import Runtime
from muonlab.train.build import build_model

H100_DENSE_BF16 = 989.5e12  # NVIDIA's H100 SXM: 1,979 TFLOP/s with sparsity, half of it dense


def _price(capsys, tmp_path, *extra):
    rc = main(["paper", "run", "004-t1-nanogpt", "--preset", "tied-cpu", "--dry-run", "--num-steps", "2",
               "--eval-every", "1", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
               "--json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_each_missing_run_is_priced_from_its_model_and_tokens(tmp_path, capsys):
    priced = _price(capsys, tmp_path, "--gpu", "H100", "--mfu", "0.5")
    assert len(priced["runs"]) == 9 and priced["done"] == 0 and priced["peak_flops"] == H100_DENSE_BF16
    cfg = resolve_config("t1_sign", "tied-cpu", {"num_steps": 2, "eval_every": 1})
    model = build_model(cfg, cfg.data.vocab_size, Runtime(torch.device("meta"), "fp32"))
    tokens = 2 * cfg.train.total_batch_size
    evaluated = cfg.train.eval_tokens * (2 + 2)  # evaluations after steps 1 and 2, then val and holdout
    want = model.estimate_flops() * (tokens + evaluated / 3)
    row = next(r for r in priced["runs"] if r["arm"] == "t1_sign")
    assert row["tokens"] == tokens and row["flops"] == pytest.approx(want, rel=1e-12)
    assert row["gpu_hours"] == pytest.approx(want / (0.5 * H100_DENSE_BF16) / 3600, rel=1e-12)
    assert priced["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in priced["runs"]), rel=1e-12)


def test_runs_already_done_are_not_priced(tmp_path, capsys):
    assert main(["train", "--preset", "tied-cpu", "--arm", "t1_sign", "--seed", "43", "--num-steps", "2",
                 "--eval-every", "1", "--quiet", "--runs-dir", str(tmp_path / "runs"),
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    capsys.readouterr()
    priced = _price(capsys, tmp_path)
    assert priced["done"] == 1 and len(priced["runs"]) == 8
    assert ("t1_sign", 43) not in {(r["arm"], r["seed"]) for r in priced["runs"]}
    assert priced["mfu"] == 0.4 and priced["gpu"] == "H100"  # the stated defaults: no GPU run to measure from
    assert priced["mfu_basis"].startswith("assumed: no run of preset tied-cpu on a H100")


@pytest.mark.parametrize("argv, says", [
    (["paper", "run", "004-t1-nanogpt", "--preset", "tied-cpu", "--dry-run", "--mfu", "0"], "argument --mfu: must be a finite number in (0, 1], got 0"),
    (["paper", "run", "004-t1-nanogpt", "--preset", "tied-cpu", "--dry-run", "--gpu", "Voodoo2"], "peak is known"),
    (["paper", "run", "004-t1-nanogpt", "--preset", "tied-cpu", "--mfu", "0.3"], "give --dry-run"),
    (["paper", "004-t1-nanogpt", "--dry-run"], "options of `muonlab paper run`"),
])
def test_pricing_refusals(tmp_path, capsys, argv, says):
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
