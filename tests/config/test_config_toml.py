"""One config format in and out: the TOML `muonlab config` prints is a config `train --config` and `config
--config` take (bit for bit the same hash), and `config --experiment F --arm A` shows an experiment file's arm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muonlab.cli import main

pytestmark = pytest.mark.usefixtures("forget_plugins")  # conftest.py


def _config(capsys, *argv) -> dict:
    assert main(["config", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_printed_toml_is_a_config_that_resolves_to_the_same_hash_and_trains(tmp_path, capsys):
    flags = ["--preset", "cpu-tiny", "--num-steps", "2", "--prepolar", "hbieq", "--prepolar-tau", "10",
             "--runs-dir", str(tmp_path / "runs")]
    assert main(["config", *flags]) == 0
    toml = tmp_path / "c.toml"
    toml.write_text(capsys.readouterr().out)
    assert '= "none"' in toml.read_text()  # settings at none travel as the string "none"
    printed = _config(capsys, *flags)
    again = _config(capsys, "--config", str(toml))
    assert again["config_hash"] == printed["config_hash"]
    assert again["config"]["optim"]["prepolar"]["tau"] == 10.0 and again["config"]["data"]["path"] is None
    assert main(["train", "--config", str(toml), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["status"] == "ok" and run["summary"]["num_steps"] == 2
    assert json.loads((Path(run["run_dir"]) / "config.json").read_text())["config_hash"] == printed["config_hash"]


def test_a_file_that_is_neither_json_nor_toml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "c.toml"
    bad.write_text("this is = = not toml")
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a TOML config" in err and err.count("\n") == 1


def test_config_shows_an_experiment_files_arm_as_its_sweep_runs_it(tmp_path, capsys):
    study = tmp_path / "study.toml"
    study.write_text(f"""
preset = "cpu-tiny"
seeds = [1]

[settings]
"train.num_steps" = 3
"record.runs_dir" = "{tmp_path / 'runs'}"

[arms.baseline]

[arms.hbieq10]
"optim.prepolar.kind" = "hbieq"
"optim.prepolar.tau" = 10
""")
    shown = _config(capsys, "--experiment", str(study), "--arm", "hbieq10", "--seed", "1")
    assert shown["config"]["optim"]["prepolar"]["tau"] == 10.0 and shown["config"]["train"]["num_steps"] == 3
    assert shown["origins"]["optim.prepolar.tau"] == "arm"
    assert main(["sweep", "--experiment", str(study), "--dry-run", "--json"]) == 0
    planned = {r["arm"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert shown["config_hash"] == planned["hbieq10"]["config_hash"]
    assert shown["protocol"] == planned["hbieq10"]["protocol"]
    assert main(["config", "--experiment", str(study), "--arm", "other"]) == 2
    assert "not an arm of" in capsys.readouterr().err
    assert main(["config", "--experiment", str(study), "--arm", "baseline", "--preset", "gpu-d6"]) == 2
    assert "drop --preset" in capsys.readouterr().err
