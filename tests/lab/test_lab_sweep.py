"""The lab's arms, sweeps (resume, executors) and TSV export. Interrupted sweeps and concurrent
ledger writers: tests/lab/test_fault_sweep_interrupt.py, tests/record/test_fault_ledger_lock.py."""

import json
from pathlib import Path

import pytest
import torch

from muonlab.arms import ARMS, get_arm, resolve_config
from muonlab.cli import main
from muonlab.errors import UsageError
from muonlab.lab.sweep import parse_seeds
from muonlab.record.ledger import append_record, read_records, read_records_tolerant
from muonlab.record.results_tsv import results_tsv

pytestmark = pytest.mark.spread  # each test a unit of work of its own (support.budget.work_unit)

SWEEP = ["sweep", "--preset", "cpu-tiny", "--num-steps", "4", "--arms", "baseline,adamw_only", "--seeds", "1"]


def ledger_of(tmp_path) -> Path:
    return Path(tmp_path) / "cache" / "runs" / "ledger.jsonl"


def test_registry_and_cli(capsys):
    assert {"baseline", "adamw_only"} <= set(ARMS)
    assert main(["arms", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["adamw_only"]["overrides"] == {"optim.matrix_optimizer": "adamw"}
    cfg = resolve_config("adamw_only", "cpu-tiny", {"seed": 3})
    assert cfg.arm == "adamw_only" and cfg.optim.matrix_optimizer == "adamw" and cfg.seed == 3
    assert resolve_config("baseline", "cpu-tiny").config_hash() != cfg.config_hash()
    with pytest.raises(UsageError, match="unknown arm"):
        get_arm("nope")
    assert main(SWEEP[:3] + ["--arms", "nope", "--seeds", "1"]) == 2


def test_adamw_only_puts_matrices_on_adamw():
    from muonlab.device import Runtime
    from muonlab.train.build import build_model, build_optimizer

    cfg = resolve_config("adamw_only", "cpu-tiny", {"optim.adamw_matrix_lr": 0.001})
    model = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    opt = build_optimizer(model, cfg, compile_step=False)
    assert all(g["kind"] == "adamw" for g in opt.param_groups)
    matrix = [id(p) for p in model.transformer.h.parameters()]
    (group,) = [g for g in opt.param_groups if [id(p) for p in g["params"]] == matrix]  # in module order
    assert group["lr"] == group["initial_lr"] == 0.001 and group["weight_decay"] == 0.0


def test_parse_seeds():
    assert parse_seeds("41, 42,47") == [41, 42, 47]
    for bad in ("", "a,b", "1,1"):
        with pytest.raises(UsageError):
            parse_seeds(bad)


def test_sweep_runs_and_resumes(tmp_path, capsys):
    assert main(SWEEP + ["--json"]) == 0
    first = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["arm"], r["seed"], r["action"], r["status"]) for r in first] == [
        ("baseline", 1, "ran", "ok"), ("adamw_only", 1, "ran", "ok")]
    records = list(read_records(ledger_of(tmp_path)))
    assert len(records) == 2 and {r["status"] for r in records} == {"ok"}
    # the same sweep again does nothing; a new seed runs only the new (arm, seed)s
    assert main(SWEEP[:-1] + ["1,2", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)["runs"]
    assert [r["action"] for r in second] == ["skipped-ok", "ran"] * 2
    assert len(list(read_records(ledger_of(tmp_path)))) == 4
    # TSV export in upstream's columns
    tsv = results_tsv(read_records(ledger_of(tmp_path))).splitlines()
    assert tsv[0].split("\t") == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(tsv) == 5 and tsv[1].split("\t")[3] == "keep"
    # the report, through the CLI, shows exactly the ledger's numbers
    out_dir = tmp_path / "report"
    assert main(["report", "--ledger", str(ledger_of(tmp_path)), "--out", str(out_dir), "--json",
                 "--tsv", str(tmp_path / "results.tsv")]) == 0
    (report,) = json.loads(capsys.readouterr().out)["studies"]  # both arms ran under one protocol
    assert {r["protocol"] for r in read_records(ledger_of(tmp_path))} == {report["protocol"]}
    ledger_vals = {(r["arm"], r["seed"]): r["metrics"]["val_bpb"] for r in read_records(ledger_of(tmp_path))}
    markdown = (out_dir / "report.md").read_text()
    for (arm, seed), value in ledger_vals.items():
        arm_json = report["arms"][arm]
        assert arm_json["values"][arm_json["seeds"].index(seed)] == value
        assert f"{value:.6f}" in markdown  # every seed is shown
    contrast = report["contrasts"]["adamw_only"]
    deltas = [ledger_vals[("adamw_only", s)] - ledger_vals[("baseline", s)] for s in (1, 2)]
    assert contrast["n"] == 2 and abs(contrast["mean_delta"] - sum(deltas) / 2) < 1e-12
    assert len(contrast["ci95"]) == 2 and contrast["decision"] in ("improves", "inconclusive", "worse")
    for name in ("report.md", "report.json", "loss_curves.png", "paired_deltas.png", "forest.png"):
        assert (out_dir / name).stat().st_size > 0
    assert (out_dir / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "results.tsv").read_text().splitlines()[0].startswith("commit\t")


def test_failed_runs_are_retried_only_when_asked(tmp_path, capsys):
    args = ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1", "--max-loss", "0.5"]
    assert main(args) == 1  # diverges at step 0
    err = capsys.readouterr().err.strip().splitlines()
    # the reason is said, not left in the run's log: the ledger line's error, in one line
    assert err[-1].startswith("error: 1 of 1 run(s) did not end ok; baseline seed 1: ") and "loss" in err[-1], err
    assert main(args + ["--json"]) == 1
    out, err = capsys.readouterr()
    assert "(an earlier run; --retry-failed runs it again)" in err
    (run,) = json.loads(out)["runs"]
    assert run["action"] == "skipped-failed" and run["status"] == "diverged"
    records = list(read_records(ledger_of(tmp_path)))
    assert [r["status"] for r in records] == ["diverged"]  # skipped, not repeated
    assert main(args + ["--retry-failed"]) == 1
    assert [r["status"] for r in read_records(ledger_of(tmp_path))] == ["diverged", "diverged"]


def test_slurm_executor_through_submitit_local(tmp_path, capsys):
    args = ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "4",
            "--executor", "slurm", "--slurm", "cluster=local", "--json"]
    assert main(args) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["status"] for r in runs] == ["ok"]
    assert [r["seed"] for r in read_records(ledger_of(tmp_path))] == [4]


def test_tolerant_reader_reports_line_numbers(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append_record(path, {"run_id": "a", "status": "ok"})
    with open(path, "a") as f:
        f.write('{"run_id": "torn", "sta\n')
    append_record(path, {"run_id": "b", "status": "failed"})
    records, problems = read_records_tolerant(path)
    assert [r["run_id"] for r in records] == ["a", "b"]
    assert len(problems) == 1 and problems[0].startswith("line 2:")
    with pytest.raises(ValueError):
        append_record(path, {"run_id": "c", "status": "weird"})


def test_metric_sinks_mirror_steps(tmp_path, monkeypatch):
    """Sinks are optional: a fake TensorBoard writer receives every step and the summary."""
    import importlib.util
    import types

    import muonlab.record.sinks as sinks

    seen = []

    class FakeWriter:
        def __init__(self, log_dir):
            seen.append(("dir", log_dir))

        def add_text(self, *a):
            pass

        def add_scalar(self, tag, value, step):
            seen.append((tag, step))

        def add_hparams(self, hparams, metrics, run_name=None):
            seen.append(("hparams", "hparam/val_bpb" in metrics))

        def close(self):
            seen.append(("closed",))

    fake = types.SimpleNamespace(SummaryWriter=FakeWriter)
    monkeypatch.setattr(sinks, "_import", lambda module, hint: fake)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tensorboard" else real_find_spec(name, *a))
    assert main(["train", "--preset", "cpu-tiny", "--sinks", "tensorboard", "--num-steps", "3"]) == 0
    assert {step for tag, *rest in seen if tag == "train/loss" for step in rest} == {0, 1, 2}
    assert ("summary/val_bpb", 0) in seen and ("hparams", True) in seen and seen[-1] == ("closed",)


def test_missing_sink_package_is_a_usage_error(tmp_path, monkeypatch, capsys):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert main(["train", "--preset", "cpu-tiny", "--sinks", "wandb"]) == 2
    assert "muonlab[sinks]" in capsys.readouterr().err
    assert not ledger_of(tmp_path).exists()
