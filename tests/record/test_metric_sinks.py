"""The optional metric sinks (stubbed: the suite needs neither package): wandb groups a run by its arm,
tags it (model family, seed, preset, protocol) and resumes a run of the same id; TensorBoard gets the
settings as hyperparameters with the final figures."""

from __future__ import annotations

import importlib.machinery
import sys
import types

from muonlab.cli import main


class FakeWandbRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.summary, self.finished = kwargs, [], {}, False

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


class FakeWriter:
    instances: list = []

    def __init__(self, log_dir):
        self.log_dir, self.scalars, self.hparams, self.texts = log_dir, [], None, []
        FakeWriter.instances.append(self)

    def add_text(self, tag, text):
        self.texts.append(tag)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def add_hparams(self, hparams, metrics, run_name=None):
        self.hparams = (hparams, metrics, run_name)

    def close(self):
        pass


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    return module


def test_wandb_and_tensorboard_get_the_runs_group_tags_and_hyperparameters(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setitem(sys.modules, "wandb", _module("wandb", init=lambda **kw: runs.append(FakeWandbRun(**kw))
                                                      or runs[-1]))
    monkeypatch.setitem(sys.modules, "tensorboard", _module("tensorboard"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", _module("torch.utils.tensorboard",
                                                                       SummaryWriter=FakeWriter))
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--arm", "adamw_only", "--seed", "3",
                 "--sinks", "wandb,tensorboard", "--runs-dir", str(tmp_path), "--json"]) == 0
    (run,) = runs
    kw = run.kwargs
    assert kw["group"] == "adamw_only" and kw["resume"] == "allow" and kw["id"] == kw["name"]
    assert "family:autoresearch" in kw["tags"] and "seed:3" in kw["tags"] and "preset:cpu-tiny" in kw["tags"]
    assert any(t.startswith("protocol:") and len(t) == len("protocol:") + 16 for t in kw["tags"])
    assert [step for step, _ in run.logged] == [0, 1] and run.finished and "val_bpb" in run.summary
    writer = FakeWriter.instances[-1]
    hparams, metrics, run_name = writer.hparams
    assert hparams["optim.matrix_optimizer"] == "adamw" and hparams["model.depth"] == 2 and hparams["seed"] == 3
    assert metrics["hparam/val_bpb"] == run.summary["val_bpb"] and run_name == "."
