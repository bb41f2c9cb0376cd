"""The run configuration (issue 12 item 4): nested sections owned by their components, dotted
overrides, settings that do not act refused (never dropped, never hashed), bookkeeping left out
of the hash by construction, and configs of the older flat format still readable."""

from __future__ import annotations

import dataclasses
import json

import pytest

from muonlab.arms import ARMS, resolve_config
from muonlab.cli import main
from muonlab.config import (RunConfig, apply_overrides, build_config, flag_table, from_legacy,
                            load_config_file, preset)
from muonlab.errors import UsageError
from muonlab.optim import PrePolar, extensions, register_prepolar
from muonlab.settings import leaves

# each of these trained and exited 0 before, with the setting silently ignored (issue 12)
REFUSED = [
    (["--preset", "tied-cpu", "--prepolar", "hbieq"], "does not act on model family tied"),
    (["--preset", "tied-cpu", "--n-embd", "128"], "does not act on model family tied"),
    (["--preset", "tied-cpu", "--arm", "t1_sign", "--af-cap", "2"], "sign fixes af_cap = 1"),
    (["--preset", "tied-cpu", "--arm", "t1_hybrid", "--af-scale", "0.5"], "puts the tied table on AdamW"),
    (["--preset", "tied-cpu", "--optimizer", "adamw", "--af-matrix-lr", "0.02"], "trains every tensor with AdamW"),
    (["--preset", "cpu-tiny", "--prepolar", "zeta", "--prepolar-tau", "25"], "only hbieq reads it"),
    (["--preset", "cpu-tiny", "--whiten-tau", "25"], "the method is off"),
    (["--preset", "cpu-tiny", "--arm", "adamw_only", "--matrix-lr", "0.05"], "no matrix is on Muon"),
    (["--preset", "cpu-tiny", "--optimizer", "sign"], "does not act on model family autoresearch"),
    (["--preset", "cpu-tiny", "--routing", "sepden", "--routing-eps", "1e-5"], "only the shared-denominator"),
    (["--preset", "cpu-tiny", "--source", "synthetic", "--path", "x"], "the data source is synthetic"),
]


@pytest.mark.parametrize("argv,reason", REFUSED)
def test_a_setting_that_does_not_act_is_a_usage_error(argv, reason, capsys):
    assert main(["train", *argv, "--num-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert reason in err and len(err.splitlines()) == 1


def test_sign_honours_its_scale_and_adamw_its_own_lr():
    sign = resolve_config("t1_sign", "tied-cpu", {"af_scale": 0.5})
    assert sign.optim.scale == 0.5  # acts: it reaches the tied group (below)
    from muonlab.device import Runtime
    from muonlab.train.build import build_model, build_optimizer
    import torch

    model = build_model(sign, 300, Runtime(torch.device("cpu"), "fp32"))
    tied = [g for g in build_optimizer(model, sign, False).param_groups if g.get("role") == "tied"]
    assert tied[0]["scale"] == 0.5 and tied[0]["cap"] == 1.0
    adamw = resolve_config("baseline", "tied-cpu", {"optimizer": "adamw"})
    opt = build_optimizer(build_model(adamw, 300, Runtime(torch.device("cpu"), "fp32")), adamw, False)
    assert {g["lr"] for g in opt.param_groups} == {6e-4}  # seed 004's AdamW pilot lr, not Muon's 0.02


def test_an_inert_setting_is_not_hashed():
    base = resolve_config("baseline", "cpu-tiny")
    # the preset may carry settings some arms switch off: adamw_only ignores the Muon momentum ramp
    a = resolve_config("adamw_only", "cpu-tiny")
    b = build_config([("preset", {**_preset("cpu-tiny"), "optim.muon_momentum_warmup_steps": 99}),
                      ("arm", ARMS["adamw_only"].overrides)])
    assert a.config_hash() == b.config_hash() != base.config_hash()
    assert "optim.muon_momentum_warmup_steps" not in a.hashed_values()


def test_bookkeeping_is_never_hashed_by_construction():
    cfg = resolve_config("baseline", "cpu-tiny")
    changed = apply_overrides(cfg, {"record.run_name": "x", "record.quiet": True, "record.checkpoint_every": 5,
                                    "data.cache_dir": "/elsewhere", "arm": "other"})
    assert changed.config_hash() == cfg.config_hash()
    assert not any(k.startswith("record.") for k in cfg.hashed_values())
    # ...while everything that can change a number does change it
    for key, value in [("seed", 7), ("optim.matrix_lr", 0.03), ("train.num_steps", 5), ("runtime.compile", "on"),
                       ("data.vocab_size", 301), ("model.depth", 3)]:
        assert apply_overrides(cfg, {key: value}).config_hash() != cfg.config_hash(), key


def _preset(name):
    from muonlab.config import all_presets

    return {k: v for k, v in all_presets()[name].items() if k != "family"}


def test_arms_override_dotted_keys_that_exist():
    for arm in ARMS.values():
        assert all("." in key or key in ("family", "seed") for key in arm.overrides), arm.name
    assert ARMS["exp44_hbieq_bf16"].overrides["optim.prepolar.kind"] == "hbieq"
    with pytest.raises(UsageError, match="not a setting"):
        build_config([("arm", {"optim.prepolar.tauu": 3})])


def test_flags_name_one_setting_each_and_keep_their_names():
    table = flag_table()
    for flag in ("depth", "matrix-lr", "prepolar-tau", "qk-scale", "source", "num-steps", "af-scale", "quiet"):
        assert flag in table
    assert table["prepolar-tau"] == "optim.prepolar.tau" and table["af-scale"] == "optim.scale"
    for family in ("autoresearch", "tied"):  # within a family a setting has one flag
        flags = [leaf.flag for leaf in leaves(RunConfig.for_family(family))]
        assert len(flags) == len(set(flags))
    # the same dotted key in two families keeps each family's flag: --matrix-lr is MuonAdamW's
    with pytest.raises(UsageError, match="--matrix-lr .* does not act on model family tied"):
        resolve_config("t1_afmuon", "tied-cpu", {"matrix_lr": 0.03})
    assert resolve_config("t1_afmuon", "tied-cpu", {"af_matrix_lr": 0.03}).optim.matrix_lr == 0.03


def test_resolved_config_is_saved_whole_and_loads_back(tmp_path):
    cfg = resolve_config("01_dense_opt", "cpu-tiny", {"seed": 3})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"config": cfg.to_dict()}))
    back = load_config_file(path)
    assert back.to_dict() == cfg.to_dict() and back.config_hash() == cfg.config_hash()


def test_older_flat_configs_still_load():
    old = {"depth": 3, "num_steps": 40, "matrix_lr": 0.03, "prepolar": "hbieq", "prepolar_tau": 25.0,
           "af_cap": 3.0, "optimizer": "muon_adamw", "model_family": "autoresearch", "arm": "x", "seed": 5,
           "quiet": True, "data": {"source": "synthetic", "vocab_size": 300, "cache_dir": "/c"}}
    cfg = RunConfig.from_dict(old)
    assert (cfg.model.depth, cfg.train.num_steps, cfg.optim.matrix_lr, cfg.optim.prepolar.tau) == (3, 40, 0.03, 25.0)
    assert cfg.seed == 5 and cfg.data.source == "synthetic" and cfg.record.quiet
    tied = from_legacy({"model_family": "tied", "optimizer": "sign", "af_cap": 3.0, "af_scale": 0.5})
    assert tied.optim.kind == "sign" and tied.optim.cap is None and tied.optim.scale is None  # as format 1 ran it


def test_every_leaf_has_a_description():
    for family in ("autoresearch", "tied"):
        missing = [leaf.key for leaf in leaves(RunConfig.for_family(family)) if not leaf.help]
        assert not missing


def test_train_help_shows_the_effective_default_choices_and_groups(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--preset", "cpu-demo", "--arm", "exp44_hbieq_bf16", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--depth INT" in out
    assert "(default: 2; model.depth)" in out  # cpu-demo's depth, not the dataclass's 8
    assert "(default: stdlib; data.source)" in out
    assert "(default: hbieq; optim.prepolar.kind)" in out  # the arm's
    assert "{standard|lerope_shared|lerope_adapted}" in out
    assert "--no-quiet" in out and "optim.prepolar (autoresearch family):" in out
    assert "--tied-preset" not in out  # another family's flags are accepted but not shown


def test_booleans_take_no_value_or_true_false(tmp_path):
    from muonlab.cli import _resolve_config, build_parser

    for argv, want in ((["--checkpoint-blocks"], True), (["--checkpoint-blocks", "false"], False),
                       (["--no-checkpoint-blocks"], False), (["--checkpoint-blocks", "true"], True)):
        args = build_parser(["train"]).parse_args(["train", "--preset", "cpu-tiny", *argv])
        assert _resolve_config(args).model.memory.checkpoint_blocks is want


def test_diagnose_tools_have_only_their_own_options(capsys):
    assert main(["diagnose", "conditioning", "--run", "x"]) == 2
    assert "unknown option --run" in capsys.readouterr().err
    assert main(["diagnose", "geometry"]) == 2  # needs its run
    assert "--run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "argument parsing only" not in capsys.readouterr().out


def test_presets_are_dotted_and_resolve():
    from muonlab.config import all_presets

    for name, values in all_presets().items():
        assert all("." in k or k == "family" for k in values), name
        preset(name)


@pytest.mark.parametrize("name", ["cpu-tiny", "cpu-demo", "tied-cpu"])
def test_the_cpu_presets_stay_on_the_cpu_where_there_is_a_gpu(name, monkeypatch):
    """Their numbers (bitwise checks) and world sizes (2 gloo ranks) must not follow a machine's GPUs."""
    import torch

    from muonlab.device import detect_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert detect_device(preset(name).runtime.device) == torch.device("cpu")
    assert apply_overrides(preset(name), {"device": "cuda"}).runtime.device == "cuda"  # still a choice
    assert preset("gpu-d8").runtime.device == "auto"


def test_the_method_catalogue_points_at_real_modules_tests_and_arms(capsys):
    import importlib
    from pathlib import Path

    assert main(["methods", "--json"]) == 0
    catalog = json.loads(capsys.readouterr().out)["methods"]
    names = {m["name"] for m in catalog}
    assert {"presub_gains", "qk_scale", "lerope", "residual_rule", "radius_gate", "over_encoding", "routing",
            "hbieq", "zeta", "turbo_aol", "muon2f", "polar_precision", "neumann_whitening", "master32",
            "table_neumann", "af_muon"} <= names
    root = Path(__file__).resolve().parents[2]
    for m in catalog:
        for module in m["module"].split("; "):
            importlib.import_module(module)
        assert m["tests"] and all((root / t).is_file() for t in m["tests"]), m["name"]
        assert all(a in ARMS for a in m["arms"])
    hbieq = next(m for m in catalog if m["name"] == "hbieq")
    assert "exp44_hbieq_bf16" in hbieq["arms"] and "exp58_zeta_bf16" not in hbieq["arms"]


def test_the_run_asks_its_family_for_data_and_evaluation(monkeypatch, capsys):
    """Families behind one interface: the run prepares data and scores the model through the family."""
    import dataclasses

    from muonlab.eval import EvalResult
    from muonlab.families import FAMILIES, get_family

    family = get_family("autoresearch")
    calls = []

    def data(cfg, log=print):
        calls.append("data")
        return family.prepare_data(cfg, log=log)

    def evaluate(model, data, cfg, runtime, dist):
        calls.append("evaluate")
        return {split: EvalResult(bpb=0.125, ce=1.0, ppl=2.718, nats=1.0, bytes=8, tokens=1) for split in ("val", "holdout")}

    monkeypatch.setitem(FAMILIES, "autoresearch", dataclasses.replace(family, prepare_data=data, evaluate=evaluate))
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert calls == ["data", "evaluate"] and out["summary"]["val_bpb"] == out["summary"]["holdout_bpb"] == 0.125


def test_help_builds_the_config_it_shows_and_no_other_familys(monkeypatch, capsys):
    """Every family's flags parse (another family's are refused by name at resolution), read from
    the section classes: --help builds only the config whose defaults it shows."""
    from muonlab.config import RunConfig, family_leaves
    from muonlab.families import all_families
    from muonlab.settings import leaves

    for name in all_families():  # the classes give exactly what a built config holds
        assert [(l.key, l.flag, l.help) for l in family_leaves(name)] == \
            [(l.key, l.flag, l.help) for l in leaves(RunConfig.for_family(name))]
    built = []
    real = RunConfig.for_family.__func__

    monkeypatch.setattr(RunConfig, "for_family", classmethod(lambda cls, name: built.append(name) or real(cls, name)))
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--preset", "tied-cpu", "--help"])
    assert exit_.value.code == 0 and "--af-cap" in capsys.readouterr().out
    assert set(built) == {"tied"}


def test_the_family_setting_names_every_registered_family_and_the_run_config_takes_its_sections_from_it():
    from muonlab.config import DEFAULT_FAMILY
    from muonlab.families import all_families, get_family

    family = next(l for l in leaves(RunConfig) if l.key == "family")
    assert all(name in family.help for name in all_families())
    cfg = RunConfig()
    assert type(cfg.model) is get_family(DEFAULT_FAMILY).model_config
    assert type(cfg.optim) is get_family(DEFAULT_FAMILY).optim_config


def test_a_setting_is_named_on_the_command_line_by_its_dotted_key_and_its_flat_flag_alike(capsys):
    """--model.qk.kind is --qk-scale, --optim.prepolar.tau is --prepolar-tau, a boolean's dotted key takes
    true|false: the same resolved config either way; --help lists the dotted key with its alias."""
    from muonlab.cli import _resolve_config, build_parser

    def resolved(*argv):
        argv = ["train", "--preset", "cpu-tiny", *argv]
        return _resolve_config(build_parser(argv, only="train").parse_args(argv))

    pairs = [(("--model.qk.kind", "pair_tied_linear"), ("--qk-scale", "pair_tied_linear")),
             (("--prepolar", "hbieq", "--optim.prepolar.tau", "25"), ("--prepolar", "hbieq", "--prepolar-tau", "25")),
             (("--model.memory.checkpoint_blocks", "true"), ("--checkpoint-blocks", "true")),
             (("--train.num_steps", "7"), ("--num-steps", "7"))]
    for dotted, flat in pairs:
        a, b = resolved(*dotted), resolved(*flat)
        assert a.to_dict() == b.to_dict() and a.config_hash() == b.config_hash(), dotted
    assert resolved("--model.qk.kind", "head_temp").model.qk.kind == "head_temp"
    with pytest.raises(SystemExit):
        main(["train", "--preset", "cpu-tiny", "--help"])
    out = capsys.readouterr().out
    assert "--model.qk.kind STR, --qk-scale STR" in out and "--optim.prepolar.tau FLOAT, --prepolar-tau FLOAT" in out
    assert main(["train", "--preset", "cpu-tiny", "--model.qk.knd", "x"]) == 2
    assert "did you mean --model.qk.kind" in capsys.readouterr().err


HOOKS = ("variant_configs", "param_group_keys", "needs_param_names", "step_hooks", "check_with")


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_a_section_offers_the_method_hooks_only_through_the_typed_protocol():
    """A family calls the five hooks on MethodSections only: a plain Section defining one would be skipped
    silently, so none does; every method section of the run config is one."""
    from muonlab import families
    from muonlab.config import RunConfig
    from muonlab.settings import MethodSection, Section, method_sections

    families.all_families()  # every family's sections are imported
    stray = [f"{c.__module__}.{c.__qualname__}.{h}" for c in _all_subclasses(Section)
             if not issubclass(c, MethodSection) for h in HOOKS if h in vars(c)]
    assert stray == []
    cfg = RunConfig()
    found = {type(s).__name__ for s in method_sections(cfg.optim)} | {type(s).__name__ for s in method_sections(cfg.model)}
    assert {"MuonAdamWConfig", "PolarPrecision", "NeumannWhitening", "TableNeumann", "MemorySettings"} <= found


@dataclasses.dataclass(frozen=True)
class _ScaledSign(PrePolar):
    """sign(G) * scale: a plug-in conditioner written as a dataclass user writes it."""

    scale: float = 0.5
    """the sign's scale"""

    def condition(self, G, inputs, ctx):
        return G.sign() * self.scale


@dataclasses.dataclass(frozen=True)
class _GainConfig:
    lr_mult: float = 0.1
    """its learning-rate multiple"""


def test_no_section_class_is_made_at_run_time_when_plugins_register():
    """Issue 45 item 1: a plug-in's settings join a section class written in the source (the pre-polar
    section, the plug-in variants' section), so every section of the run config is a class an IDE, a type
    checker and pickle find by name, the same class before and after a registration."""
    import importlib
    import pickle

    from muonlab.model import REGISTRY, ModelVariant, register_variant
    from muonlab.settings import sections

    before = {prefix: type(s) for prefix, s in sections(RunConfig.for_family("autoresearch"))}
    register_prepolar("test_scaled_sign", _ScaledSign, paper="none (test plug-in)")
    register_variant("test_gain", _GainConfig, paper="(test)", section="-")(type("Gain", (ModelVariant,), {}))
    try:
        cfg = resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "test_scaled_sign",
                                                      "optim.prepolar.scale": 0.25,
                                                      "model.extra_variants": "test_gain",
                                                      "model.plugin_variants.test_gain.lr_mult": 0.2})
        assert cfg.optim.prepolar.conditioner() == _ScaledSign(scale=0.25)
        assert cfg.model.plugin_config("test_gain") == _GainConfig(lr_mult=0.2)
        for prefix, section in sections(cfg):
            cls = type(section)
            found = importlib.import_module(cls.__module__)
            for part in cls.__qualname__.split("."):
                found = getattr(found, part, None)
            assert found is cls, f"{prefix or 'the root'}: {cls.__qualname__} is not in {cls.__module__}"
            assert before.get(prefix, cls) is cls
        assert pickle.loads(pickle.dumps(cfg)) == cfg
        assert RunConfig.from_dict(cfg.to_dict()).config_hash() == cfg.config_hash()
    finally:
        extensions.unregister_prepolar("test_scaled_sign")
        del REGISTRY["test_gain"]


def test_a_methods_group_key_is_its_dotted_key_below_optim():
    """What an optimizer group holds for a method (and a checkpoint records) is the setting's dotted key below
    `optim.` (docs/design.md): every GroupSection of the run config, which sits where its NAMESPACE says, and the
    pre-polar section's kind, scope and every registered conditioner's options (as group_options emits them)."""
    from muonlab.optim.extensions import GroupSection
    from muonlab.settings import sections, set_dotted

    cfg = preset("cpu-tiny")
    checked = {}
    for prefix, section in sections(cfg):
        if isinstance(section, GroupSection):
            assert prefix == f"optim.{type(section).NAMESPACE}.", (prefix, type(section).NAMESPACE)
            checked.update({f"{prefix}{name}": key for name, key in type(section).group_keys().items()})
    assert set(checked) <= {leaf.key for leaf in leaves(cfg)}  # every GroupSection field is a setting
    for cls in extensions.prepolars().values():  # field by field (group_defaults keeps the fields' order)
        checked.update({f"optim.prepolar.{f.name}": key for f, key in zip(dataclasses.fields(cls), cls.group_defaults(),
                                                                          strict=True)})
    for key, value in (("kind", "hbieq"), ("scope", "rect_only"), ("tau", 25.0)):
        set_dotted(cfg, f"optim.prepolar.{key}", value)
    emitted = cfg.optim.prepolar.group_options()
    assert emitted == {"prepolar.kind": "hbieq", "prepolar.scope": "rect_only", "prepolar.tau": 25.0}, emitted
    assert {"optim.polar.dtype", "optim.polar.post_dtype", "optim.whiten.kind", "optim.table_whiten.kind",
            "optim.prepolar.tau"} <= set(checked)
    for dotted, key in checked.items():
        assert f"optim.{key}" == dotted, (dotted, key)
