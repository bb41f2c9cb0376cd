"""docs/extending.md's conditioner example, run as the page gives it: its Python block saved as the
file it names, each of its `muonlab` command lines run (a few steps, --json). The two values of
the plug-in's option train to different weights, and `muonlab methods` lists its flag."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from muonlab.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def _example(title: str, tmp_path, monkeypatch) -> list[list[str]]:
    """The section's Python block saved as the file it names; its bash block's command lines."""
    section = _section(title)
    (code,) = _blocks(section, "python")
    filename = code.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / filename).write_text(code)
    monkeypatch.chdir(tmp_path)  # the commands name the file as the page does
    return [shlex.split(line.split("#")[0]) for line in _blocks(section, "bash")[0].splitlines() if line.strip()]


@pytest.fixture
def conditioner_example(tmp_path, monkeypatch, forget_plugins):
    return _example("A pre-polar conditioner (optimizer side)", tmp_path, monkeypatch)


def test_the_conditioner_example_runs_as_written(conditioner_example, capsys):
    trains = [argv for argv in conditioner_example if argv[1] == "train"]
    methods = [argv for argv in conditioner_example if argv[1] == "methods"]
    assert len(trains) == 2 and len(methods) == 1
    weights = []
    for argv in trains:
        assert main([*argv[1:], "--num-steps", "3", "--json"]) == 0, argv
        run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
        weights.append(torch.load(run_dir / "model.pt", weights_only=True)["transformer.h.0.attn.c_q.weight"])
    assert not torch.equal(*weights)  # the option acted
    assert main([*methods[0][1:], "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    name = trains[0][trains[0].index("--prepolar") + 1]
    assert [s["flag"] for s in listed[name]["settings"]] == ["--prepolar-p"]


def test_the_model_variant_example_runs_as_written(tmp_path, monkeypatch, forget_plugins, capsys):
    commands = _example("A model variant (model side)", tmp_path, monkeypatch)
    assert len(commands) == 2 and all(argv[1] == "train" for argv in commands)
    betas = []
    for argv in commands:  # with its option at the default, then set by its flag
        assert main([*argv[1:], "--num-steps", "3", "--json"]) == 0, argv
        run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
        betas.append(torch.load(run_dir / "model.pt", weights_only=True)["branch_beta"])
    assert betas[0].abs().sum() > 0 and not torch.equal(*betas)  # it trained, and the option acted
