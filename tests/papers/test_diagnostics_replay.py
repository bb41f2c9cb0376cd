"""Seed 003's actual-state Muon replay ("Actual-state Muon replay") on a cpu-tiny checkpoint."""

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from muonlab.cli import main
from muonlab.papers.seed003.diagnostics import replay as R
from muonlab.diagnostics.runs import load_run
from muonlab.errors import UsageError
from muonlab.model.gpt import GPT


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    cache = tmp_path_factory.mktemp("replay_cache")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "4", "--cache-dir", str(cache),
                     "--quiet", "true", "--json"]) == 0
    (config,) = (cache / "runs").glob("*/config.json")  # --cache-dir is saved: later tests find the data
    return config.parent


@pytest.fixture(scope="module")
def result(run_dir):
    return R.run_replay(run_dir)


def _state(loaded):
    tensors = {f"model.{k}": v.detach().clone() for k, v in loaded.model.state_dict().items()}
    for i, st in enumerate(loaded.optimizer.state.values()):
        tensors.update({f"opt.{i}.{k}": v.clone() for k, v in st.items() if isinstance(v, torch.Tensor)})
    return tensors


def test_replay_leaves_weights_and_optimizer_state_bitwise_unchanged(run_dir):
    loaded = load_run(run_dir)
    before = _state(loaded)
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in loaded.optimizer.param_groups]
    out = R.replay_loaded(loaded, R.capture_batches(loaded))
    after = _state(loaded)
    assert before.keys() == after.keys() and len(before) > 20
    for key in before:
        assert torch.equal(before[key], after[key]), key
    assert groups_before == [{k: v for k, v in g.items() if k != "params"} for g in loaded.optimizer.param_groups]
    assert all(p.grad is None for p in loaded.model.parameters())
    assert loaded.model.points.residual_add is None  # the ordinary rule is back (no rule hook wired)
    assert out["weights_unchanged"] and out["losses_bitwise_equal"]


def test_batches_are_the_checkpoints_next_step(run_dir):
    loaded = load_run(run_dir)
    batches = R.capture_batches(loaded)
    assert len(batches) == loaded.cfg.train.accum_steps_per_rank(1) == 2
    x, y = loaded.pending_batch()
    assert torch.equal(batches[0][0], x) and torch.equal(batches[0][1], y)
    assert torch.equal(batches[0][0][:, 1:], batches[0][1][:, :-1])  # targets are the inputs shifted
    three = R.capture_batches(loaded, micro_batches=3)
    assert len(three) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(batches, three))


def test_branch_tangent_changes_gradient_and_direction_with_exact_controls(result):
    assert result["losses_bitwise_equal"] is True and result["weights_unchanged"] is True
    assert result["step"] == 4 and result["micro_batches"] == 2 and result["tokens"] == 2 * 4 * 64
    assert result["muon_matrices"] == 13
    # CPU is deterministic: the ordinary repeat (the nondeterminism floor) is exactly zero
    assert result["repeat_gradient_rel_change"] == 0.0 and result["repeat_direction_rel_change"] == 0.0
    assert 1e-3 < result["gradient_rel_change"] < 1.0
    assert 1e-3 < result["direction_rel_change"] < 2.0
    ratio = result["direction_rel_change"] / result["gradient_rel_change"]
    assert result["direction_gradient_ratio"] == pytest.approx(ratio)
    for name in ("both", "momentum", "variance"):
        assert 0 < result[f"reset_{name}"] < 2 and math.isfinite(result[f"reset_{name}_vs_mature"])
    # resetting the moments changes the proposal: the fresh direction is far from the mature one
    assert result["reset_both"] != result["direction_rel_change"]
    assert result["reset_both_vs_mature"] > 0.05 and result["reset_momentum_vs_mature"] > 0.05


def test_ordinary_against_ordinary_is_zero(run_dir):
    out = R.run_replay(run_dir, rule="ordinary")
    assert out["gradient_rel_change"] == 0.0 and out["direction_rel_change"] == 0.0
    assert out["reset_both"] == out["reset_momentum"] == out["reset_variance"] == 0.0
    assert out["direction_gradient_ratio"] is None
    with pytest.raises(UsageError, match="--rule"):
        R.run_replay(run_dir, rule="nope")
    with pytest.raises(UsageError, match="--micro-batches"):
        R.run_replay(run_dir, micro_batches=0)


def test_direction_equals_what_the_optimizer_step_does(run_dir):
    a, b = load_run(run_dir), load_run(run_dir)
    batches = R.capture_batches(a)
    _, grads = R.accumulate(a, batches, "ordinary")
    dirs = R.directions(a.optimizer, grads)
    for x, y in batches:  # the training loop's accumulation on an independent copy
        (b.model(x, y) / len(batches)).backward()
    groups = R.muon_groups(b.optimizer)
    assert len(groups) == len(grads) == 4
    assert any(g["params"][0].shape[0] > g["params"][0].shape[1] for g in groups)  # a shape factor of 2
    for group, g in zip(groups, grads):
        assert torch.equal(torch.stack([p.grad for p in group["params"]]), g)
        group["lr"], group["weight_decay"] = 1.0, 0.0  # unit base LR, wd 0; momentum/beta2 untouched
    for group in b.optimizer.param_groups:
        if group["kind"] == "adamw":
            group["lr"] = 0.0
    before = [torch.stack(g["params"]).detach().clone() for g in groups]
    b.optimizer.step()
    for group, p0, d in zip(groups, before, dirs):
        p1 = torch.stack(group["params"]).detach().double()
        # the step rounds p0 - d once in fp32: |(p0 - p1) - d| <= half an ulp of p1 <= 2^-24 |p1|
        err = ((p0.double() - p1) - d.double()).abs()
        assert bool((err <= 2.0 ** -24 * p1.abs() + 2.0 ** -149).all()), float(err.max())
        assert float(d.abs().max()) > 0
    reset = R.directions(a.optimizer, grads, R.RESETS["both"])
    assert R.pooled_rel_change(reset, dirs) > 0.05


def test_pooled_relative_change_is_over_the_concatenation():
    b = [torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 0.0, 0.0]])]
    a = [torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 0.0, 5.0]])]
    assert R.pooled_rel_change(a, b) == 1.0  # ||(0,0,0,0,5)|| / ||(3,4,0,0,0)||
    assert R.pooled_rel_change(b, b) == 0.0


def test_guards_raise_on_a_changed_forward_or_weights(run_dir, monkeypatch):
    forward = GPT.forward

    def shifted(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        return loss + 1e-4 if self.points.residual_add is not None else loss  # a rule other than ordinary

    loaded = load_run(run_dir)
    batches = R.capture_batches(loaded)
    monkeypatch.setattr(GPT, "forward", shifted)
    with pytest.raises(R.ReplayInvariantError, match="forward losses"):
        R.replay_loaded(loaded, batches)

    def writes(self, *args, **kwargs):
        if self.points.residual_add is not None:
            with torch.no_grad():
                self.transformer.h[0].attn.c_q.weight.mul_(1.0 + 2.0 ** -20)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", writes)
    with pytest.raises(R.ReplayInvariantError, match="weights"):
        R.replay_loaded(loaded, batches)


def test_table_lists_ours_and_the_papers(result):
    table = R.format_replay_table(result)
    assert "14.186% / 13.453%" in table and "12.176% / 12.348%" in table and "22.014%" in table
    assert f"{100 * result['direction_rel_change']:.3f}%" in table
    assert "0.858 / 0.918" in table and "changes little" in table
    assert Path(result["checkpoint"]).is_file()


# --------------------------------------------------------------- device and precision (issue 16)
def test_trained_precision_resolves_auto_on_the_training_device():
    assert R.trained_precision("auto", "auto", ("torch", "python", "cuda")) == "bf16"  # a CUDA RNG: trained there
    assert R.trained_precision("auto", "auto", ("torch", "python")) == "fp32"
    assert R.trained_precision("auto", "cuda", ()) == "bf16" and R.trained_precision("auto", "cpu", ("cuda",)) == "fp32"
    assert R.trained_precision("fp32", "auto", ("cuda",)) == "fp32" and R.trained_precision("bf16", "cpu", ()) == "bf16"


def test_default_precision_is_the_runs_own(run_dir, tmp_path):
    assert R.recorded_precision(run_dir) == "fp32"  # cpu-tiny trains at fp32
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--precision", "bf16", "--cache-dir",
                     str(tmp_path), "--quiet", "true", "--json"]) == 0
    (config,) = (tmp_path / "runs").glob("*/config.json")
    out = R.run_replay(config.parent)
    assert (out["precision"], out["precision_source"], out["device"]) == ("bf16", "the run's", "cpu")
    assert out["losses_bitwise_equal"] and out["weights_unchanged"] and out["gradient_rel_change"] > 0
    assert out["deterministic"] and out["repeat_direction_rel_change"] == 0.0  # CPU: the floor is exactly 0
    assert "on cpu at bf16 (the run's precision)" in R.format_replay_table(out)


def test_bf16_replay_of_an_fp32_run_runs_under_cpu_autocast(run_dir, result, monkeypatch):
    seen = []
    real_load = R.load_run

    def load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        seen.append(kwargs)
        probe = lambda module, inputs: seen.append(torch.is_autocast_enabled(loaded.runtime.device.type))
        loaded.model.transformer.h[0].attn.c_q.register_forward_pre_hook(probe)
        return loaded

    monkeypatch.setattr(R, "load_run", load)
    out = R.run_replay(run_dir, precision="bf16")
    assert seen[0] == {"device": "cpu", "precision": "bf16"}
    assert seen[1:] and all(x is True for x in seen[1:])  # every forward under autocast on the device's type
    assert (out["precision"], out["precision_source"]) == ("bf16", "given")
    assert out["losses_bitwise_equal"] and out["weights_unchanged"]
    assert out["losses"] != result["losses"]  # bf16 matmuls: not the fp32 replay's numbers
    assert 0 < out["gradient_rel_change"] < 1 and out["deterministic"]


def test_batches_are_moved_to_the_replay_device(run_dir):
    from muonlab.device import Runtime

    loaded = load_run(run_dir)
    loaded.runtime = Runtime(torch.device("meta"), "fp32")  # any device but the checkpoint's (CPU)
    for x, y in R.capture_batches(loaded):
        assert x.device.type == y.device.type == "meta"


def test_cli_passes_device_and_precision(run_dir, capsys):
    assert main(["diagnose", "replay", "--run", str(run_dir), "--precision", "bf16", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["precision"], out["device"], out["precision_source"]) == ("bf16", "cpu", "given")
    assert main(["diagnose", "replay", "--run", str(run_dir), "--precision", "fp16"]) == 2
    if not torch.cuda.is_available():
        assert main(["diagnose", "replay", "--run", str(run_dir), "--device", "cuda"]) == 2


def test_a_nondeterministic_floor_is_reported_as_measured(run_dir, monkeypatch):
    """As on a GPU in bf16 (seed 003: 2.04%): the ordinary repeat's change is reported, not zeroed."""
    real, calls = R.accumulate, []

    def noisy(loaded, batches, rule):
        losses, grads = real(loaded, batches, rule)
        calls.append(rule)
        if len(calls) == 3:  # the repeat: as if the backward's atomics summed in another order
            grads = [g * (1 + 1e-3 * torch.randn_like(g)) for g in grads]
        return losses, grads

    monkeypatch.setattr(R, "accumulate", noisy)
    out = R.run_replay(run_dir)
    assert calls == ["ordinary", "branch_tangent", "ordinary"]
    assert out["repeat_gradient_rel_change"] > 0 and out["repeat_direction_rel_change"] > 0
    assert out["deterministic"] is False
    table = R.format_replay_table(out)
    assert "nondeterministic" in table and f"{100 * out['repeat_direction_rel_change']:.3f}%" in table


def test_replay_on_cuda_in_bf16(run_dir, monkeypatch, cuda):
    """On the GPU the ordinary repeat may be nonzero (the floor); it is reported, whatever it is."""
    before, devices = torch.get_float32_matmul_precision(), []
    real_step = R.muon_step

    def step(grads, params, *args):
        devices.append((grads.device.type, params.device.type, args[0].device.type, args[1].device.type))
        return real_step(grads, params, *args)

    monkeypatch.setattr(R, "muon_step", step)
    out = R.run_replay(run_dir, device="cuda", precision="bf16")
    assert out["device"].startswith("cuda") and out["precision"] == "bf16"
    assert devices and all(d == ("cuda",) * 4 for d in devices)  # gradients, parameters and both moments
    assert out["losses_bitwise_equal"] and out["weights_unchanged"]
    assert 0 < out["gradient_rel_change"] < 1 and math.isfinite(out["repeat_direction_rel_change"])
    assert out["deterministic"] == (out["repeat_direction_rel_change"] == 0 == out["repeat_gradient_rel_change"])
    assert torch.get_float32_matmul_precision() == before  # set to "high" for the replay only


def test_a_run_of_another_family_is_refused_in_one_line(tmp_path, capsys):
    """The residual rules act at the autoresearch GPT's residual additions: a tied run has none."""
    from muonlab.arms import resolve_config

    (tmp_path / "config.json").write_text(json.dumps({"config": resolve_config("baseline", "tied-cpu", {}).to_dict()}))
    assert main(["diagnose", "replay", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "family 'tied'" in err and err.count("\n") == 1
    assert main(["diagnose", "replay", "--run", str(tmp_path / "nowhere")]) == 2
