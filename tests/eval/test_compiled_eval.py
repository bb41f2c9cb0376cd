"""A compiled run scores its val and holdout splits on the compiled model, as upstream does
(its evaluate_bpb gets the torch.compile'd model), in every model family.

torch.compile runs here with dynamo's eager backend: dynamo traces the model, guards and
recompiles for real, and the traced graph runs the same operations, so the scores of a
compiled run equal an eager run's (within fp32 reordering) and the test needs no C++ compiler.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from muonlab.cli import main
from muonlab.config import preset as preset_values
from muonlab.families import FAMILIES, get_family
from muonlab.train.run import evaluate_splits

# torch's own compile stack calls its deprecated torch.jit.script_method; nothing here uses TorchScript
pytestmark = [pytest.mark.spread,
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

PRESETS = ["cpu-tiny", "tied-moe-cpu", "hf-cpu", "imagegpt-cpu", "reuse-cpu", "t5-cpu"]


@pytest.fixture
def eager_backend(monkeypatch):
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: real_compile(fn, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(capsys, preset: str, compile_on: str) -> None:
    assert main(["train", "--preset", preset, "--num-steps", "2", "--compile", compile_on, "--json"]) == 0
    capsys.readouterr()


def _scores(results) -> dict:
    """The scores of an evaluation (perplexity is exp of the loss: it only magnifies the same difference)."""
    metrics = {f"{split}_{k}": v for split, result in results.items() for k, v in result.metrics().items()}
    return {k: v for k, v in metrics.items() if k.endswith(("_bpb", "_ce", "_loss")) and isinstance(v, float)}


@pytest.mark.parametrize("preset", PRESETS)
def test_a_compiled_run_scores_on_the_compiled_model(preset, capsys, monkeypatch, eager_backend):
    """The compiled run's evaluation receives the compiled model, and scores the trained weights as
    the eager model scores the same weights. (Two runs are not compared: the trained weights of a
    compiled and an eager run differ by a bf16 ulp where AF-Muon's bf16 Newton-Schulz rounds
    slightly different gradients, 4e-4 after one hf-cpu step on an AVX-512 CPU.)"""
    family = get_family(preset_values(preset).family)
    real_evaluate = family.evaluate or evaluate_splits
    seen, pairs = [], []

    def spy(model, *args, **kwargs):
        seen.append(type(model).__name__)
        results = real_evaluate(model, *args, **kwargs)
        if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):  # the same weights, eager
            pairs.append((_scores(results), _scores(real_evaluate(model._orig_mod, *args, **kwargs))))
        return results

    monkeypatch.setitem(FAMILIES, family.name, dataclasses.replace(family, evaluate=spy))
    _run(capsys, preset, "on")
    assert seen == ["OptimizedModule"] and len(pairs) == 1
    _run(capsys, preset, "off")
    assert len(seen) == 2 and seen[1] != "OptimizedModule"
    compiled, eager = pairs[0]
    assert compiled.keys() == eager.keys() and compiled
    # the same weights through the same operations, up to fp32 summation order (the tied MoE's
    # compiled dispatch is dense, every expert on every token, weighted; the eager one sparse): seen
    # equal, or within 1e-9 relative
    for key, value in eager.items():
        assert compiled[key] == pytest.approx(value, rel=1e-6, abs=0), key


def test_the_eval_graph_is_compiled(capsys, monkeypatch):
    """The evaluation pass (no_grad, per-token losses) is a graph of its own: dynamo sees the
    model called without gradients, which an evaluation of the eager model never shows it."""
    real_compile = torch.compile
    grad_modes = []

    def backend(gm, example_inputs):
        grad_modes.append(torch.is_grad_enabled())
        return gm.forward

    def compile_model_only(fn=None, **kw):  # the optimizer's step stays eager: its frames are no_grad too
        return real_compile(fn, **{**kw, "backend": backend}) if isinstance(fn, torch.nn.Module) else fn

    monkeypatch.setattr(torch, "compile", compile_model_only)
    torch._dynamo.reset()
    try:
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--compile", "on", "--json"]) == 0
    finally:
        torch._dynamo.reset()
    assert Path(json.loads(capsys.readouterr().out)["run_dir"]).is_dir()
    assert True in grad_modes and False in grad_modes


def test_a_compiled_run_records_its_graph_count_per_step(tmp_path, capsys, eager_backend):
    """metrics.jsonl's compiled_graphs: what dynamo compiled so far, so a recompile after the first
    steps shows (the GPU acceptance check fails a run whose count still grows)."""
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "6", "--compile", "on", "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    counts = [json.loads(line)["compiled_graphs"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(counts) == 6 and counts[0] > 0 and counts == sorted(counts)
    assert len(set(counts[2:])) == 1  # no graph after the warm-up steps
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    assert all("compiled_graphs" not in json.loads(line)
               for line in (run_dir / "metrics.jsonl").read_text().splitlines())
