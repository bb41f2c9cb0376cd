"""Periodic evaluation had afterwards: `muonlab eval RUN --every N` scores the checkpoints a run kept, records
them where `report --at-step` reads them, and says what to run where none was kept. Steps are steps done."""

from __future__ import annotations

import json
from pathlib import Path

from muonlab.cli import main


STUDY = ["--preset", "cpu-tiny", "--num-steps", "6", "--checkpoint-every", "2", "--checkpoint-keep", "5", "--json"]


def _train(runs: Path, capsys, *argv) -> Path:
    assert main(["train", *STUDY, "--runs-dir", str(runs), *argv]) == 0
    return Path(json.loads(capsys.readouterr().out)["run_dir"])


def test_eval_every_gives_report_at_step_what_periodic_evaluation_would_have(tmp_path, capsys):
    # the truth: the same run, evaluating every 2 steps as it trains (a ledger of its own)
    evaluated = _train(tmp_path / "with", capsys, "--eval-every", "2", "--seed", "7")
    plain = _train(tmp_path / "without", capsys, "--seed", "7")
    ledger = str(tmp_path / "without" / "ledger.jsonl")
    assert main(["report", "--ledger", ledger, "--at-step", "4", "--json"]) == 1
    err = capsys.readouterr().err
    assert "none of the 1 ok run(s)" in err and "muonlab eval RUN --every N" in err and err.count("\n") == 1
    sweep = ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "7", "--num-steps", "6",
             "--checkpoint-every", "2", "--checkpoint-keep", "5", "--runs-dir", str(tmp_path / "without"),
             "--eval-every", "2", "--dry-run", "--json"]
    assert main(sweep) == 0  # asked for evaluations the done run lacks: it says so, and how to get them
    (action,) = [r["action"] for r in json.loads(capsys.readouterr().out)["runs"]]
    assert action.startswith("done (ok); without the evaluations every 2 steps") and f"eval {plain} --every 2" in action
    assert main(["eval", str(plain), "--every", "2", "--json"]) == 0
    scored = {e["step"]: e["scores"] for e in json.loads(capsys.readouterr().out)["evaluations"]}
    assert sorted(scored) == [2, 4]  # after 6 steps is the end: its final evaluation
    periodic = {json.loads(x)["step"] + 1: json.loads(x) for x in (evaluated / "metrics.jsonl").read_text().splitlines()
                if "val_bpb" in json.loads(x)}
    for step in (2, 4):  # scored afterwards as the run would have scored them, bit for bit on this machine
        assert scored[step]["val_bpb"] == periodic[step]["val_bpb"]
    for runs in ("with", "without"):
        assert main(["report", "--ledger", str(tmp_path / runs / "ledger.jsonl"), "--at-step", "5", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["studies"][0]["arms"]["baseline"]["mean"] == periodic[4]["val_bpb"]
    assert main(sweep) == 0
    assert [r["action"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["done (ok)"]
    assert main(["eval", str(plain), "--every", "2", "--json"]) == 0  # again: nothing recorded twice
    capsys.readouterr()
    assert len((plain / "evals.jsonl").read_text().splitlines()) == 2


def test_eval_every_without_kept_checkpoints_says_what_to_run(tmp_path, capsys):
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "3", "--runs-dir", str(tmp_path / "runs"),
                 "--json"]) == 0
    run = Path(json.loads(capsys.readouterr().out)["run_dir"])
    assert main(["eval", str(run), "--every", "2"]) == 2
    err = capsys.readouterr().err
    assert "kept no checkpoint after a multiple of 2 steps" in err and "--eval-every 2" in err
    assert err.count("\n") == 1 and not (run / "evals.jsonl").exists()
    assert main(["eval", str(run), "--every", "2", "--step", "3"]) == 2
