"""Periodic evaluation (`--eval-every N`): the val split scored after every N-th step into
metrics.jsonl, without touching training, and drawn per arm by `muonlab report`."""

from __future__ import annotations

import json

import torch

from muonlab.arms import resolve_config
from muonlab.lab.report import build_report
from muonlab.lab.report.loading import load_curve
from muonlab.record.ledger import read_records
from muonlab.train import run_training


def _train(runs, arm="baseline", seed=1, **settings):
    cfg = resolve_config(arm, "cpu-tiny", {"seed": seed, "quiet": True, "runs_dir": str(runs), **settings})
    result = run_training(cfg, log=lambda _: None)
    rows = [json.loads(line) for line in open(f"{result.run_dir}/metrics.jsonl")]
    return result, rows


def test_every_nth_step_scores_val_and_the_last_equals_the_final_evaluation(tmp_path):
    result, rows = _train(tmp_path / "runs", eval_every=4)  # cpu-tiny: 12 steps
    scored = [(r["step"], r["val_bpb"], r["val_ce"]) for r in rows if "val_bpb" in r]
    assert [s for s, _, _ in scored] == [3, 7, 11]  # after 4, 8 and 12 optimizer steps
    # the same weights and the same (first eval_tokens) val tokens as the run's final evaluation
    assert scored[-1][1] == result.summary["val_bpb"]
    assert scored[0][1] > scored[-1][1]  # it trained
    assert all(r.keys() >= {"loss", "lrm"} for r in rows) and len(rows) == 12


def test_periodic_evaluation_does_not_change_training(tmp_path):
    plain, _ = _train(tmp_path / "a")
    scored, rows = _train(tmp_path / "b", eval_every=3, eval_every_tokens=128)
    a = torch.load(f"{plain.run_dir}/model.pt", weights_only=True)
    b = torch.load(f"{scored.run_dir}/model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sum("val_bpb" in r for r in rows) == 4


def test_report_draws_validation_curves_per_arm(tmp_path):
    runs = tmp_path / "runs"
    for arm in ("baseline", "adamw_only"):
        for seed in (1, 2):
            _train(runs, arm=arm, seed=seed, eval_every=6, eval_every_tokens=128)
    out = tmp_path / "report"
    report = build_report(runs / "ledger.jsonl", out_dir=out)
    (study,) = report["studies"]
    assert study["validation_curves"] == {"baseline": 2, "adamw_only": 2}
    png = study["plots"]["val_curves"]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    record = next(iter(read_records(runs / "ledger.jsonl")))
    curve, note = load_curve(record, runs, "val_bpb")
    assert curve.steps == [6, 12] and note is None  # steps done; lines without val_bpb are not unreadable lines
