"""A researcher's own comparison without Python: experiment files (TOML), ad-hoc arms from the
command line, a dry run of a sweep, and a report of exactly an experiment's runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from muonlab.arms import ARMS, define_arm, resolve_config
from muonlab.cli import main
from muonlab.config import RunConfig, protocol_of
from muonlab.errors import UsageError
from muonlab.lab.experiment import load_experiment

pytestmark = pytest.mark.usefixtures("forget_plugins")  # conftest.py

POWER = textwrap.dedent('''
    """A plug-in conditioner with one option: sign(G) |G|^p before Polar Express."""
    from dataclasses import dataclass

    from muonlab.optim.extensions import PrePolar, option, register_prepolar


    @dataclass(frozen=True)
    class Power(PrePolar):
        p: float = option(0.5, "the power of |G|")

        def condition(self, G, inputs, ctx):
            return G.sign() * G.abs().pow(self.p)


    register_prepolar("power", Power, paper="test plug-in", tests=("tests/lab/test_experiment_files.py",), replace=True)
''')


@pytest.fixture(autouse=True)
def _forget_defined_arms():
    """Arms defined by a test (define_arm registers them for the process) do not outlive it."""
    before = dict(ARMS)
    yield
    ARMS.clear()
    ARMS.update(before)


def write_study(tmp_path: Path, extra: str = "", seeds: str = "[1, 2]", top: str = "") -> Path:
    (tmp_path / "power.py").write_text(POWER)
    path = tmp_path / "study.toml"
    path.write_text(f"""{top}
preset = "cpu-tiny"
seeds = {seeds}
plugins = ["power.py"]

[settings]
"train.num_steps" = 3
"record.runs_dir" = "{tmp_path / 'runs'}"

[arms.baseline]

[arms.hbieq25]
"optim.prepolar.kind" = "hbieq"
"optim.prepolar.tau" = 25

[arms.power25]
base = "baseline"
optim.prepolar.kind = "power"
optim.prepolar.p = 0.25
{extra}""")
    return path


def test_a_file_arm_is_an_arm_in_the_baselines_protocol(tmp_path):
    study = load_experiment(write_study(tmp_path))
    assert study.arms == ("baseline", "hbieq25", "power25") and study.seeds == (1, 2) and study.baseline == "baseline"
    assert ARMS["hbieq25"].overrides == {"optim.prepolar.kind": "hbieq", "optim.prepolar.tau": 25.0}
    assert ARMS["power25"].overrides == {"optim.prepolar.kind": "power", "optim.prepolar.p": 0.25}
    base = resolve_config("baseline", study.preset, study.settings)
    for arm in ("hbieq25", "power25"):
        cfg = resolve_config(arm, study.preset, study.settings)
        assert cfg.protocol_id() == base.protocol_id() and cfg.config_hash() != base.config_hash()
    assert resolve_config("power25", "cpu-tiny", study.settings).record.plugins == str(tmp_path / "power.py")


@pytest.mark.parametrize("top, extra, message", [
    ("", '[arms.bad]\n"optim.prepolar.tau" = "x"', "expects float"),
    ("", '[arms.bad]\nbase = "nope"\n"depth" = 3', "unknown arm 'nope'"),
    ("", '[arms.exp05_gains_qk_linear]\n"depth" = 3', "already defined with other overrides"),
    ("", 'colour = "red"', "arms.power25: unknown setting 'colour'"),
    ('colour = "red"', "", "unknown key 'colour'"),
])
def test_a_bad_experiment_file_is_one_line_naming_the_file(tmp_path, top, extra, message):
    path = write_study(tmp_path, extra, top=top)
    with pytest.raises(UsageError, match=message) as info:
        load_experiment(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_dry_run_lists_every_run_and_writes_nothing(tmp_path, capsys):
    path = write_study(tmp_path)
    assert main(["sweep", "--experiment", str(path), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["runs"]
    assert [(p["arm"], p["seed"]) for p in plan] == [(a, s) for a in ("baseline", "hbieq25", "power25") for s in (1, 2)]
    assert {p["action"] for p in plan} == {"run"} and len({p["protocol"] for p in plan}) == 1
    assert len({p["config_hash"] for p in plan}) == 6
    assert not (tmp_path / "runs").exists()


def test_an_experiment_sweeps_resumes_and_reports_exactly_its_runs(tmp_path, capsys):
    path = write_study(tmp_path, seeds="[1]")
    assert main(["sweep", "--experiment", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["arm"], r["status"]) for r in runs] == [("baseline", "ok"), ("hbieq25", "ok"), ("power25", "ok")]
    ledger = tmp_path / "runs" / "ledger.jsonl"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    for rec in lines:  # each line holds what its protocol is a function of
        assert protocol_of(rec["config"]) == rec["protocol"]
    # a run of another protocol in the same ledger is not the experiment's
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--runs-dir", str(tmp_path / "runs"),
                 "--seed", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["sweep", "--experiment", str(path), "--dry-run", "--json"]) == 0
    assert {p["action"] for p in json.loads(capsys.readouterr().out)["runs"]} == {"done (ok)"}
    assert main(["report", "--experiment", str(path), "--ledger", str(ledger), "--json",
                 "--single-seed", "hbieq25:baseline@1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["studies"]) == 1
    assert sorted(report["studies"][0]["arms"]) == ["baseline", "hbieq25", "power25"]
    assert report["studies"][0]["counts"]["records"] == 3  # not the fourth line, of another protocol


def test_arm_name_records_the_method_settings_as_the_arm_and_refuses_a_reused_name(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    common = ["--preset", "cpu-tiny", "--num-steps", "2", "--runs-dir", runs, "--json"]
    assert main(["train", "--arm-name", "hb25", "--prepolar", "hbieq", "--prepolar-tau", "25", *common]) == 0
    assert main(["train", *common]) == 0
    capsys.readouterr()
    lines = [json.loads(line) for line in (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in lines] == ["hb25", "baseline"]
    assert lines[0]["protocol"] == lines[1]["protocol"]  # num_steps, runs_dir: the protocol's, not the arm's
    arm_layer = next(x["values"] for x in lines[0]["config"]["layers"] if x["origin"] == "arm")
    assert arm_layer == {"optim.prepolar.kind": "hbieq", "optim.prepolar.tau": 25.0}
    ARMS.pop("hb25")  # another process: the ledger alone knows the name
    assert main(["train", "--arm-name", "hb25", "--prepolar", "hbieq", "--prepolar-tau", "30", *common]) == 2
    assert "recorded in" in capsys.readouterr().err
    assert main(["train", "--arm-name", "hb25", "--prepolar", "hbieq", "--prepolar-tau", "25.0", *common]) == 0
    assert len((tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()) == 3  # the same arm again


def test_define_arm_compares_values_by_their_settings_types():
    define_arm("t25", {"prepolar": "hbieq", "prepolar_tau": "25"})
    assert define_arm("t25", {"optim.prepolar.kind": "hbieq", "optim.prepolar.tau": 25}).name == "t25"
    with pytest.raises(UsageError, match="already defined"):
        define_arm("t25", {"prepolar": "hbieq"})
    with pytest.raises(UsageError, match="names files"):
        define_arm("a/b", {"prepolar": "hbieq"})


def test_a_saved_config_records_its_layers_and_its_protocol_is_a_function_of_them():
    cfg = resolve_config("exp11_weight_fused_d6", "cpu-tiny", {"seed": 3, "num_steps": 4})
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert [x["origin"] for x in saved["layers"]] == ["preset", "arm", "implied", "command line"]
    # the arm's depth 6 defines its protocol: the baseline's at depth 6
    assert protocol_of(saved) == cfg.protocol_id() == resolve_config("baseline", "cpu-tiny", {"num_steps": 4,
                                                                                               "depth": 6}).protocol_id()
    assert RunConfig.from_dict(saved).to_dict() == saved
    assert protocol_of({k: v for k, v in saved.items() if k != "layers"}) is None
