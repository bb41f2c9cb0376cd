"""Adding a method is one new file (issue 12 item 3): a plug-in outside the package registers a
pre-polar conditioner through the public registry and `muonlab train --plugin FILE` trains with
it, without any muonlab file edited; the run records the plug-in so it can be resumed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from muonlab.cli import main

from support.plugin_sources import CONDITIONER  # noqa: E402

pytestmark = pytest.mark.usefixtures("forget_plugins")  # conftest.py

POWER = textwrap.dedent('''
    """A plug-in conditioner with one option: sign(G) |G|^p before Polar Express."""
    from dataclasses import dataclass

    from muonlab.optim.extensions import PrePolar, option, register_prepolar


    @dataclass(frozen=True)
    class Power(PrePolar):
        p: float = option(0.5, "the power of |G| (1: the Nesterov tensor, 0: its sign)")

        def __post_init__(self):
            if self.p < 0:
                raise ValueError(f"prepolar_p must be >= 0, got {self.p}")

        def condition(self, G, inputs, ctx):
            return G.sign() * G.abs().pow(self.p)


    register_prepolar("plugin_power", Power, paper="test plug-in", tests=("tests/plugins/test_plugins.py",), replace=True)
''')


VARIANT = textwrap.dedent('''
    """A plug-in model variant: a learnable scale on every residual branch, 1 at init
    (y = u + (1 + beta) f), in its own AdamW group."""
    from dataclasses import dataclass

    import torch

    from muonlab.model import ModelVariant, register_variant
    from muonlab.settings import option


    @dataclass(frozen=True)
    class BranchScaleConfig:
        lr_mult: float = option(0.5, "beta's AdamW lr as a multiple of scalar_lr")


    @register_variant("plugin_branch_scale", BranchScaleConfig, paper="test plug-in", section="-",
                      tests=("tests/plugins/test_plugins.py",))
    class BranchScale(ModelVariant):
        param_names = ("branch_beta",)

        def create(self):
            self.model.branch_beta = torch.nn.Parameter(torch.empty(self.config.n_layer, 2))

        def init_weights(self):
            self.model.branch_beta.zero_()

        def param_groups(self, lrs):
            return [lrs.adamw([self.model.branch_beta], lrs.scalar_lr * self.cfg.lr_mult)]

        def branch(self, i, slot, u, f):
            return (1 + self.model.branch_beta[i, slot]) * f
''')


def test_a_plugin_model_variant_trains_from_the_command_line(tmp_path, capsys):
    plugin = tmp_path / "my_variant.py"
    plugin.write_text(VARIANT)
    out = _train(["--plugin", str(plugin), "--variant", "plugin_branch_scale"], capsys)
    w = torch.load(Path(out["run_dir"]) / "model.pt", weights_only=True)
    assert w["branch_beta"].shape == (2, 2) and w["branch_beta"].abs().sum() > 0  # it trained
    assert main(["methods", "--plugin", str(plugin), "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert listed["plugin_branch_scale"]["flag"] == "--variant plugin_branch_scale"
    assert main(["train", "--preset", "cpu-tiny", "--variant", "qk_scale", "--num-steps", "1"]) == 2
    assert "built-in variants have their own flags" in capsys.readouterr().err


def _train(argv, capsys) -> dict:
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "3", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plugin_conditioner_trains_from_the_command_line(tmp_path, capsys):
    plugin = tmp_path / "my_conditioner.py"
    plugin.write_text(CONDITIONER)
    out = _train(["--plugin", str(plugin), "--prepolar", "plugin_sign"], capsys)
    base = _train([], capsys)
    assert out["status"] == "ok"
    saved = json.loads((Path(out["run_dir"]) / "config.json").read_text())["config"]
    assert saved["optim"]["prepolar"]["kind"] == "plugin_sign" and saved["record"]["plugins"] == str(plugin)
    # it acted: the same seed and data as the baseline, other block matrices
    w = torch.load(Path(out["run_dir"]) / "model.pt", weights_only=True)
    w0 = torch.load(Path(base["run_dir"]) / "model.pt", weights_only=True)
    assert not torch.equal(w["transformer.h.0.attn.c_q.weight"], w0["transformer.h.0.attn.c_q.weight"])
    # and the catalogue lists it, with the module it came from
    assert main(["methods", "--plugin", str(plugin), "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert listed["plugin_sign"]["module"] == "muonlab_plugin_my_conditioner"


def test_without_the_plugin_its_name_is_a_usage_error(capsys):
    assert main(["train", "--preset", "cpu-tiny", "--prepolar", "not_registered_anywhere", "--num-steps", "1"]) == 2
    assert "prepolar must be one of" in capsys.readouterr().err


def test_a_missing_plugin_is_a_usage_error(tmp_path, capsys):
    assert main(["train", "--preset", "cpu-tiny", "--plugin", str(tmp_path / "nope.py")]) == 2
    assert "plug-in file not found" in capsys.readouterr().err


def test_a_plugin_option_is_a_flag_a_dotted_key_and_hashed(tmp_path, capsys):
    """--prepolar-p of a plug-in conditioner: two values train to different weights, each recorded
    and hashed; it is refused where it does not act, checked by the plug-in's own rule, listed
    by `muonlab methods`, and unknown without the plug-in."""
    plugin = tmp_path / "power.py"
    plugin.write_text(POWER)
    runs = {p: _train(["--plugin", str(plugin), "--prepolar", "plugin_power", "--prepolar-p", p], capsys)
            for p in ("0.25", "0.75")}
    saved = {p: json.loads((Path(out["run_dir"]) / "config.json").read_text()) for p, out in runs.items()}
    assert [s["config"]["optim"]["prepolar"]["p"] for s in saved.values()] == [0.25, 0.75]
    weights = [torch.load(Path(out["run_dir"]) / "model.pt", weights_only=True) for out in runs.values()]
    key = "transformer.h.0.attn.c_q.weight"
    assert not torch.equal(weights[0][key], weights[1][key])
    same = _train(["--plugin", str(plugin), "--prepolar", "plugin_power", "--prepolar-p", "0.25"], capsys)
    w_same = torch.load(Path(same["run_dir"]) / "model.pt", weights_only=True)
    assert torch.equal(w_same[key], weights[0][key])  # the option, not the run, made the difference
    # the dotted key of an arm or a config file sets the same setting
    from muonlab.arms import resolve_config

    cfg = resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "plugin_power", "optim.prepolar.p": 0.25})
    assert cfg.hashed_values()["optim.prepolar.p"] == 0.25
    other = resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "plugin_power", "optim.prepolar.p": 0.75})
    assert cfg.config_hash() != other.config_hash()
    base = ["train", "--preset", "cpu-tiny", "--num-steps", "1", "--plugin", str(plugin)]
    assert main([*base, "--prepolar", "hbieq", "--prepolar-p", "0.3"]) == 2
    assert "only plugin_power reads it (prepolar is hbieq)" in capsys.readouterr().err
    assert main([*base, "--prepolar", "plugin_power", "--prepolar-p", "-1"]) == 2
    assert "prepolar_p must be >= 0" in capsys.readouterr().err
    assert main(["methods", "--plugin", str(plugin), "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert listed["plugin_power"]["settings"] == [{"key": "optim.prepolar.p", "flag": "--prepolar-p", "default": 0.5,
                                                   "help": "the power of |G| (1: the Nesterov tensor, 0: its sign)"}]


def test_a_plugin_variant_option_is_a_flag_a_dotted_key_and_hashed(tmp_path, capsys):
    """--plugin-branch-scale-lr-mult of a plug-in model variant: two values give two AdamW learning
    rates for its parameter and other trained weights; refused while the variant is off; listed."""
    plugin = tmp_path / "my_variant.py"
    plugin.write_text(VARIANT)
    base = ["--plugin", str(plugin), "--variant", "plugin_branch_scale"]
    runs = [_train([*base, "--plugin-branch-scale-lr-mult", v], capsys) for v in ("0.1", "2.0")]
    saved = [json.loads((Path(r["run_dir"]) / "config.json").read_text())["config"] for r in runs]
    assert [s["model"]["plugin_variants"]["plugin_branch_scale"]["lr_mult"] for s in saved] == [0.1, 2.0]
    betas = [torch.load(Path(r["run_dir"]) / "model.pt", weights_only=True)["branch_beta"] for r in runs]
    assert not torch.equal(*betas)
    from muonlab.arms import resolve_config

    on = {"model.extra_variants": "plugin_branch_scale"}
    cfgs = [resolve_config("baseline", "cpu-tiny", {**on, "model.plugin_variants.plugin_branch_scale.lr_mult": v})
            for v in (0.1, 2.0)]
    assert cfgs[0].config_hash() != cfgs[1].config_hash()
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "1", "--plugin", str(plugin),
                 "--plugin-branch-scale-lr-mult", "2"]) == 2
    assert "the plug-in variant plugin_branch_scale is off" in capsys.readouterr().err
    assert main(["methods", "--plugin", str(plugin), "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert [s["flag"] for s in listed["plugin_branch_scale"]["settings"]] == ["--plugin-branch-scale-lr-mult"]


def test_a_plugin_whose_methods_the_run_does_not_select_is_refused(tmp_path, capsys):
    """Issue 32: --plugin F that registers a conditioner the run never selects would not act."""
    plugin = tmp_path / "unused_conditioner.py"
    plugin.write_text(CONDITIONER.replace("plugin_sign", "plugin_sign_unused"))
    runs = tmp_path / "runs"
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "1", "--plugin", str(plugin),
                 "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"--plugin {plugin} registers prepolar plugin_sign_unused" in err and "would not act" in err
    assert err.count("\n") == 1 and not runs.exists()
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "1", "--plugin", str(plugin), "--prepolar",
                 "plugin_sign_unused", "--runs-dir", str(runs), "--quiet"]) == 0  # selected: it acts


def test_a_sweep_with_a_plugin_no_arm_selects_is_refused(tmp_path, capsys):
    plugin = tmp_path / "sweep_conditioner.py"
    plugin.write_text(CONDITIONER.replace("plugin_sign", "plugin_sign_sweep"))
    runs = tmp_path / "runs"
    assert main(["sweep", "--preset", "cpu-tiny", "--arms", "baseline,adamw_only", "--seeds", "1", "--num-steps", "1",
                 "--plugin", str(plugin), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "no arm of this sweep selects any of them" in err and err.count("\n") == 1 and not runs.exists()


PLAIN = textwrap.dedent('''
    """A plug-in conditioner written as a dataclass user writes it: plain fields, a docstring each."""
    from dataclasses import dataclass

    from muonlab.optim.extensions import PrePolar, fixed, register_prepolar


    @dataclass(frozen=True)
    class PlainPower(PrePolar):
        p: float = 0.5
        """the power of |G| (1: the Nesterov tensor, 0: its sign)"""
        floor: float = fixed(0.0, "set in Python only")

        def condition(self, G, inputs, ctx):
            return G.sign() * G.abs().pow(self.p) + self.floor


    register_prepolar("plugin_plain_power", PlainPower, paper="test plug-in", tests=("tests/plugins/test_plugins.py",),
                      replace=True)
''')


def test_a_plugins_plain_field_is_a_setting_with_its_docstring_as_help(tmp_path, capsys):
    """`p: float = 0.5` is --prepolar-p (help: its docstring) and optim.prepolar.p, hashed; a field declared
    `fixed` is not a flag; a field no flag can carry is refused at registration in one line."""
    plugin = tmp_path / "plain_power.py"
    plugin.write_text(PLAIN)
    runs = {p: _train(["--plugin", str(plugin), "--prepolar", "plugin_plain_power", "--prepolar-p", p], capsys)
            for p in ("0.25", "0.5")}
    saved = {p: json.loads((Path(out["run_dir"]) / "config.json").read_text()) for p, out in runs.items()}
    assert [s["config"]["optim"]["prepolar"]["p"] for s in saved.values()] == [0.25, 0.5]
    assert saved["0.25"]["config_hash"] != saved["0.5"]["config_hash"]
    with pytest.raises(SystemExit):
        main(["train", "--plugin", str(plugin), "--preset", "cpu-tiny", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "plugin_plain_power: the power of |G| (1: the Nesterov tensor, 0: its sign)" in help_text
    assert main(["train", "--plugin", str(plugin), "--preset", "cpu-tiny", "--prepolar", "plugin_plain_power",
                 "--prepolar-floor", "1", "--num-steps", "1"]) == 2
    assert "unknown option --prepolar-floor" in capsys.readouterr().err
    bad = tmp_path / "bad_field.py"
    bad.write_text(PLAIN.replace("floor: float = fixed(0.0, \"set in Python only\")", "floor: list = None")
                   .replace("plugin_plain_power", "plugin_bad_field"))
    assert main(["train", "--plugin", str(bad), "--preset", "cpu-tiny", "--num-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "PlainPower.floor: a setting is an int, float, bool, str" in err and "fixed(default, why)" in err
    assert len(err.splitlines()) == 1


def test_a_plugin_that_registers_nothing_is_refused_unless_it_says_why(tmp_path, capsys, forget_plugins):
    """`--plugin json` or a stray file registers nothing and would not act: refused in one line; a plug-in that
    only patches muonlab declares REGISTERS_NOTHING and loads."""
    stray, patch = tmp_path / "stray.py", tmp_path / "patch.py"
    stray.write_text("X = 1\n")
    patch.write_text('REGISTERS_NOTHING = "it patches a lookup"\n')
    assert main(["config", "--preset", "cpu-tiny", "--plugin", str(stray)]) == 2
    err = capsys.readouterr().err.strip()
    assert "registers nothing" in err and "REGISTERS_NOTHING" in err and "\n" not in err
    assert main(["config", "--preset", "cpu-tiny", "--plugin", str(patch)]) == 0


def test_a_plugin_file_runs_its_own_source_and_leaves_no_bytecode_beside_it(tmp_path, monkeypatch):
    """A .py plug-in is executed from the bytes its digest reads: nothing is written into the user's folder, and
    a file edited within the same second at the same size runs its new code (an import would write a
    __pycache__ beside it, with bytecode writing on as by default, and then run that stale bytecode)."""
    import os
    import sys

    from muonlab import plugins

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # Python's default, whatever this environment says
    path = tmp_path / "edited.py"
    path.write_text("VALUE = 1\n")
    (first,) = (plugins._LOADED[item] for item in plugins.load_plugins(str(path)))
    stamp = path.stat().st_mtime_ns
    plugins.forget(str(path))
    path.write_text("VALUE = 2\n")  # the same size
    os.utime(path, ns=(stamp, stamp))  # and the same modification time
    (second,) = (plugins._LOADED[item] for item in plugins.load_plugins(str(path)))
    assert (first.VALUE, second.VALUE) == (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.py"]
    assert second.__file__ == str(path.resolve())
