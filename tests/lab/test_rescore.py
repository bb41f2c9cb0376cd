"""`muonlab eval RUN`: a run's final weights and checkpoints scored again in a process of their own
equal what the run recorded, bit for bit on the machine that trained it; weights that are not the
run's are told apart."""

from __future__ import annotations

import json

import pytest
import torch

from muonlab.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "4", "--eval-every", "2", "--eval-every-tokens", "128",
                 "--checkpoint-every", "2",
                 "--checkpoint-keep", "3", "--runs-dir", str(runs), "--json"]) == 0
    (path,) = [p for p in runs.iterdir() if p.is_dir()]
    return path


def test_the_final_weights_score_what_the_run_recorded(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert out["equal"] is True and out["step"] is None
    assert out["scores"]["val_bpb"] == summary["val_bpb"] and out["scores"]["holdout_bpb"] == summary["holdout_bpb"]
    assert set(out["recorded"]) >= {"val_bpb", "val_ce", "holdout_bpb", "holdout_ce"}


def test_a_checkpoint_scores_the_periodic_evaluation_of_its_step(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--step", "2", "--splits", "val", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    line = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][1]  # the 2nd step's
    assert out["equal"] is True and out["scores"]["val_bpb"] == line["val_bpb"]
    assert out["scores"]["val_bpb"] != json.loads((run_dir / "summary.json").read_text())["val_bpb"]


def test_weights_that_are_not_the_runs_are_not_equal(run_dir, tmp_path, capsys):
    other = tmp_path / run_dir.name
    other.mkdir()
    for name in ("config.json", "summary.json", "metrics.jsonl"):
        (other / name).write_bytes((run_dir / name).read_bytes())
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    weights["lm_head.weight"] = weights["lm_head.weight"] * 1.01
    torch.save(weights, other / "model.pt")
    capsys.readouterr()
    assert main(["eval", str(other), "--splits", "val"]) == 1
    assert "NOT equal to the record" in capsys.readouterr().out
