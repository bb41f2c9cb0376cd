"""A finished run is never lost (issue 32 item 4): a ledger that cannot be appended to is refused before a run
trains; when the append still fails at the end, the run directory keeps its line and `muonlab ledger recover`
appends it, once. Ledger lines are strict JSON: a non-finite number is the string float() reads back, named."""

from __future__ import annotations

import json
import math

from muonlab.cli import main
from muonlab.errors import MuonlabError
from muonlab.record import ledger



def test_a_line_the_ledger_refused_is_kept_and_recovered_once(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    real = ledger.append_record
    calls = []

    def full_disk_once(path, record):
        calls.append(record["run_id"])
        if len(calls) == 1:
            raise MuonlabError(f"could not append to the ledger {path}: [Errno 28] No space left on device")
        return real(path, record)

    monkeypatch.setattr(ledger, "append_record", full_disk_once)
    argv = ["train", "--preset", "cpu-tiny", "--num-steps", "2", "--quiet", "--runs-dir", str(runs)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "muonlab ledger recover" in err and err.count("\n") == 1
    (run,) = [d for d in runs.iterdir() if d.is_dir()]
    kept = json.loads((run / ledger.PENDING).read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert kept["status"] == "ok" and summary["status"] == "ok" and "No space left" in summary["ledger_error"]
    assert not (runs / "ledger.jsonl").exists() or not (runs / "ledger.jsonl").read_text().strip()

    assert main(["ledger", "recover", str(runs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["appended"] == [kept["run_id"]]
    lines = [json.loads(x) for x in (runs / "ledger.jsonl").read_text().splitlines()]
    assert [r["run_id"] for r in lines] == [kept["run_id"]] and lines[0]["metrics"] == kept["metrics"]
    assert not (run / ledger.PENDING).exists() and (run / "ledger_line.recovered.json").exists()
    assert main(["ledger", "recover", str(runs)]) == 0  # once: nothing is appended twice
    assert "nothing to recover" in capsys.readouterr().out
    assert len((runs / "ledger.jsonl").read_text().splitlines()) == 1
    assert main(["report", "--ledger", str(runs / "ledger.jsonl"), "--json"]) == 0


def test_a_ledger_that_cannot_take_the_line_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "runs" / "ledger.jsonl").mkdir(parents=True)  # in the way: a folder where the file goes
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--runs-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "is a directory" in err and err.count("\n") == 1
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["ledger.jsonl"]  # no run directory was made


def test_ledger_lines_are_strict_json(tmp_path):
    record = {"run_id": "r", "status": "diverged", "metrics": {"loss": math.nan, "steps": [1.0, math.inf]}}
    ledger.append_record(tmp_path / "ledger.jsonl", record)
    text = (tmp_path / "ledger.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    line = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # refuses NaN tokens
    assert line["metrics"] == {"loss": "nan", "steps": [1.0, "inf"]}
    assert line["non_finite"] == ["metrics.loss=nan", "metrics.steps[1]=inf"]


def test_a_config_with_an_infinite_cap_reads_back_from_its_ledger_line(tmp_path):
    """K.7's c = inf arms: the line's config reads back as the config that ran (same hash, cap inf)."""
    from muonlab.arms import resolve_config
    from muonlab.config import RunConfig, protocol_of

    cfg = resolve_config("k7_cinf_s0p5", "tied-cpu")
    assert math.isinf(cfg.optim.cap)
    ledger.append_record(tmp_path / "ledger.jsonl", {"run_id": "r", "status": "ok", "config": cfg.to_dict()})
    line = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert sorted(line["non_finite"]) == ["config.layers[1].values.optim.cap=inf", "config.optim.cap=inf"]
    back = RunConfig.from_dict(line["config"])
    assert math.isinf(back.optim.cap) and back.config_hash() == cfg.config_hash()
    assert protocol_of(line["config"]) == cfg.protocol_id()  # the resolution layers read back too
