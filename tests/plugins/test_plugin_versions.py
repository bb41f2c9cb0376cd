"""A run knows the plug-in code it ran: the source of each plug-in that acts on a run is part of its config
hash, an edited plug-in makes its earlier runs another arm version (a sweep runs it again, a report keeps the
versions apart), `eval` and `--resume` refuse a run whose plug-in changed, and no plug-in takes a built-in's
name."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from muonlab import plugins
from muonlab.arms import ARMS, resolve_config
from muonlab.cli import main
from muonlab.errors import UsageError
from muonlab.lab import plugin_methods
from muonlab.lab.report.versions import split_versions
from muonlab.optim import extensions
from muonlab.optim.extensions import PrePolar, register_prepolar

pytestmark = pytest.mark.usefixtures("forget_plugins")  # conftest.py

MIX = textwrap.dedent('''
    """A plug-in conditioner: G mixed with a scaled sign(G)."""
    from dataclasses import dataclass

    from muonlab.optim.extensions import PrePolar, option, register_prepolar


    @dataclass(frozen=True)
    class Mix(PrePolar):
        mix: float = option(0.5, "weight of the sign term")

        def condition(self, G, inputs, ctx):
            return (1 - self.mix) * G + self.mix * G.sign() * G.abs().mean()


    register_prepolar("mixv", Mix, paper="test plug-in", tests=("tests/plugins/test_plugin_versions.py",), replace=True)
''')


@pytest.fixture(autouse=True)
def _forget_defined_arms():
    before = dict(ARMS)
    yield
    ARMS.clear()
    ARMS.update(before)


def _edit(path: Path) -> None:
    """The researcher edits the conditioner; the next command is a new process (here: the plug-in forgotten)."""
    path.write_text(path.read_text().replace("G.abs().mean()", "G.abs().amax()"))
    plugins.forget(str(path))
    plugin_methods._METHODS.pop(str(path), None)
    extensions.unregister_prepolar("mixv")


def _study(tmp_path: Path) -> tuple[Path, Path]:
    plugin = tmp_path / "mine.py"
    plugin.write_text(MIX)
    study = tmp_path / "study.toml"
    study.write_text(f"""
preset = "cpu-tiny"
seeds = [1]
plugins = ["{plugin}"]

[settings]
"train.num_steps" = 2
"record.runs_dir" = "{tmp_path / 'runs'}"

[arms.baseline]

[arms.mix75]
"optim.prepolar.kind" = "mixv"
"optim.prepolar.mix" = 0.75
""")
    return plugin, study


def _plan(study: Path, capsys) -> dict[str, str]:
    assert main(["sweep", "--experiment", str(study), "--dry-run", "--json"]) == 0
    return {p["arm"]: p["action"] for p in json.loads(capsys.readouterr().out)["runs"]}


def test_an_edited_plugin_runs_again_and_the_report_keeps_the_two_versions_apart(tmp_path, capsys):
    plugin, study = _study(tmp_path)
    assert main(["sweep", "--experiment", str(study), "--json"]) == 0
    capsys.readouterr()
    assert _plan(study, capsys) == {"baseline": "done (ok)", "mix75": "done (ok)"}
    _edit(plugin)
    # the arm that selects the plug-in is another version now; the baseline beside it is untouched
    assert _plan(study, capsys) == {"baseline": "done (ok)", "mix75": "run"}
    assert main(["sweep", "--experiment", str(study), "--json"]) == 0
    assert [(r["arm"], r["action"]) for r in json.loads(capsys.readouterr().out)["runs"]] == [
        ("baseline", "skipped-ok"), ("mix75", "ran")]
    lines = [json.loads(x) for x in (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()]
    mix = [r for r in lines if r["arm"] == "mix75"]
    assert len({r["config_hash"] for r in mix}) == 2 and len({r["protocol"] for r in lines}) == 1
    assert "plugin_code" not in next(r for r in lines if r["arm"] == "baseline")["config"]
    assert main(["report", "--experiment", str(study), "--json"]) == 0  # the file's own ledger
    report = json.loads(capsys.readouterr().out)
    arms = sorted(report["studies"][0]["arms"])
    assert arms[0] == "baseline" and len(arms) == 3 and all(a.startswith("mix75@") for a in arms[1:])
    assert any("2 versions of its plug-in source" in n for n in report["notes"])
    md = (tmp_path / "runs" / "report" / "report.md").read_text()
    assert md.startswith(f"# Experiment report: study ({study})")  # titled by the experiment, not the ledger


def test_eval_and_resume_refuse_a_run_whose_plugin_changed(tmp_path, capsys):
    plugin = tmp_path / "mine.py"
    plugin.write_text(MIX)
    runs = tmp_path / "runs"
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--runs-dir", str(runs), "--plugin",
                 str(plugin), "--prepolar", "mixv", "--json"]) == 0
    run_dir = next(p for p in runs.iterdir() if p.is_dir())
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert list(saved["plugin_code"]) == [str(plugin)]
    _edit(plugin)
    capsys.readouterr()
    # as a run stopped by a signal says (a finished one is refused for that first: nothing to resume)
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted", "run_id": run_dir.name}))
    for argv in (["eval", str(run_dir)], ["train", "--resume", str(run_dir)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"plug-in {plugin} changed since this run was configured" in err and err.count("\n") == 1


def test_a_baseline_loading_a_plugin_keeps_its_hash_and_the_selecting_arm_follows_the_source(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(MIX)
    spec = {"record.plugins": str(plugin)}
    plugins.load_plugins(str(plugin))
    plain = resolve_config("baseline", "cpu-tiny", {}).config_hash()
    assert resolve_config("baseline", "cpu-tiny", spec).config_hash() == plain
    first = resolve_config("baseline", "cpu-tiny", {**spec, "optim.prepolar.kind": "mixv"}).config_hash()
    _edit(plugin)
    plugins.load_plugins(str(plugin))
    second = resolve_config("baseline", "cpu-tiny", {**spec, "optim.prepolar.kind": "mixv"}).config_hash()
    assert len({plain, first, second}) == 3
    assert resolve_config("baseline", "cpu-tiny", spec).config_hash() == plain


def test_a_process_that_imported_a_plugin_refuses_its_changed_source(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(MIX)
    plugins.load_plugins(str(plugin))
    plugin.write_text(MIX.replace("0.5", "0.25"))
    with pytest.raises(UsageError, match="changed since this process imported it"):
        plugins.source_digests(str(plugin))


def test_a_plugin_never_takes_a_built_in_name():
    @dataclass(frozen=True)
    class Sign(PrePolar):
        def condition(self, G, inputs, ctx):
            return G.sign()

    with pytest.raises(ValueError, match="'zeta' is built in"):
        register_prepolar("zeta", Sign, paper="a plug-in", replace=True)
    assert extensions.prepolars()["zeta"] is not Sign


def test_split_versions_renames_only_an_arm_of_several_versions():
    def rec(arm, code):
        return {"arm": arm, "config": {"plugin_code": code} if code else {}}

    records = [rec("baseline", None), rec("mix", {"a.py": "1"}), rec("mix", {"a.py": "2"}), rec("one", {"b.py": "3"})]
    out, overrides, notes = split_versions(records, {"mix": {"optim.prepolar.kind"}})
    names = [r["arm"] for r in out]
    assert names[0] == "baseline" and names[3] == "one"
    assert names[1] != names[2] and all(n.startswith("mix@") and len(n) == 12 for n in names[1:3])
    assert overrides[names[1]] == overrides[names[2]] == {"optim.prepolar.kind"}
    assert len(notes) == 1 and "'mix' ran 2 versions" in notes[0]
