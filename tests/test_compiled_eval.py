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
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

PRESETS = ["cpu-tiny", "tied-moe-cpu", "hf-cpu", "imagegpt-cpu", "reuse-cpu", "t5-cpu"]


@pytest.fixture
def eager_backend(monkeypatch):
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: real_compile(fn, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _scores(capsys, preset: str, compile_on: str) -> dict:
    assert main(["train", "--preset", preset, "--num-steps", "2", "--compile", compile_on, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    # the scores (perplexity is exp of the loss: it only magnifies the same difference)
    return {k: v for k, v in summary.items()
            if k.startswith(("val_", "holdout_")) and k.endswith(("_bpb", "_ce", "_loss")) and isinstance(v, float)}


@pytest.mark.parametrize("preset", PRESETS)
def test_a_compiled_run_scores_on_the_compiled_model(preset, capsys, monkeypatch, eager_backend):
    family = get_family(preset_values(preset).family)
    real_evaluate = family.evaluate or evaluate_splits
    seen = []

    def spy(model, *args, **kwargs):
        seen.append(type(model).__name__)
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setitem(FAMILIES, family.name, dataclasses.replace(family, evaluate=spy))
    compiled = _scores(capsys, preset, "on")
    assert seen == ["OptimizedModule"]
    eager = _scores(capsys, preset, "off")
    assert len(seen) == 2 and seen[1] != "OptimizedModule"
    assert compiled.keys() == eager.keys() and compiled
    # the same operations, but the tied MoE's compiled dispatch is dense (every expert on every
    # token, weighted), another summation order than the eager sparse one, for 2 steps and the eval
    rel = 1e-4 if "moe" in preset else 1e-5
    for key, value in eager.items():
        assert compiled[key] == pytest.approx(value, rel=rel, abs=1e-6), key


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
