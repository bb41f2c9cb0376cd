"""`report --at-step N` / `--at-tokens T`: each run read at its last periodic evaluation at or before
the point (the ledger line's `evals`, or an older line's metrics.jsonl), never at its final value."""

from __future__ import annotations

import json

import pytest

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.lab.report import build_report
from muonlab.lab.report.loading import Point
from muonlab.record.ledger import append_record
from muonlab.record.rundir import periodic_evals


def line(arm: str, seed: int, evals: list[tuple[int, float]], final: float) -> dict:
    cfg = resolve_config(arm, "cpu-tiny", {"seed": seed})
    per_step = cfg.train.total_batch_size
    return {"run_id": f"{arm}-{seed}", "arm": arm, "seed": seed, "status": "ok", "config_hash": cfg.config_hash(),
            "protocol": cfg.protocol_id(), "config": cfg.to_dict(), "metrics": {"val_bpb": final},
            "evals": [{"step": s, "tokens": s * per_step, "val_bpb": v} for s, v in evals]}


@pytest.fixture
def ledger(tmp_path):
    path = tmp_path / "ledger.jsonl"
    for seed, base in ((1, 2.0), (2, 2.1), (3, 1.9)):
        append_record(path, line("baseline", seed, [(10, base), (20, base - 0.5)], base - 0.9))
        append_record(path, line("adamw_only", seed, [(10, base + 0.1), (20, base - 0.3)], base - 0.95))
    return path


def means(report) -> dict[str, float]:
    (study,) = report["studies"]
    return {arm: round(v["mean"], 9) for arm, v in study["arms"].items()}


def test_the_last_evaluation_at_or_before_the_point_is_compared(ledger):
    assert means(build_report(ledger, at=Point(step=20))) == {"baseline": 1.5, "adamw_only": 1.7}
    assert means(build_report(ledger, at=Point(step=19))) == {"baseline": 2.0, "adamw_only": 2.1}
    assert means(build_report(ledger)) == {"baseline": 1.1, "adamw_only": 1.05}  # the final values
    per_step = resolve_config("baseline", "cpu-tiny").train.total_batch_size
    report = build_report(ledger, at=Point(tokens=20 * per_step))
    assert means(report) == {"baseline": 1.5, "adamw_only": 1.7}
    assert report["compared_at"]["tokens"] == 20 * per_step


def test_a_run_without_an_evaluation_before_the_point_is_left_out_and_named(ledger):
    append_record(ledger, line("baseline", 4, [(30, 0.1)], 0.0))
    report = build_report(ledger, at=Point(step=20))
    assert means(report)["baseline"] == 1.5
    assert any("baseline-4" in w and "no periodic evaluation" in w for w in report["warnings"])


def test_only_val_metrics_and_one_point(ledger, capsys):
    assert main(["report", "--ledger", str(ledger), "--at-step", "20", "--metric", "holdout_bpb"]) == 2
    assert "val split only" in capsys.readouterr().err
    assert main(["report", "--ledger", str(ledger), "--at-step", "20", "--at-tokens", "5k"]) == 2
    assert main(["report", "--ledger", str(ledger), "--at-tokens", "lots"]) == 2


def test_a_run_records_its_periodic_evaluations_in_its_ledger_line(tmp_path):
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "4", "--eval-every", "2", "--runs-dir",
                 str(tmp_path), "--json"]) == 0
    (rec,) = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["step"] for e in rec["evals"]] == [2, 4]
    assert rec["evals"] == periodic_evals(tmp_path / rec["run_id"] / "metrics.jsonl", 512)
    # an older line without `evals` is read from its run directory's metrics.jsonl
    del rec["evals"]
    older = tmp_path / "older.jsonl"
    append_record(older, rec)
    report = build_report(older, at=Point(step=3), single_seed=())
    assert report["studies"][0]["arms"]["baseline"]["mean"] == pytest.approx(
        periodic_evals(tmp_path / rec["run_id"] / "metrics.jsonl", 512)[0]["val_bpb"])
