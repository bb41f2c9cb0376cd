"""A method is one unit: the frozen dataclass that is its run-config section is the configuration
its implementation reads (model variants: VariantConfig; optimizer add-ons keyed in the groups:
GroupSection). These tests hold the machinery to that: a frozen section is set through its dotted
key without being mutated, the section a run resolves is the object the model is built from, and
an add-on's group keys are its flags."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from muonlab.arms import resolve_config
from muonlab.config import flag_table
from muonlab.errors import UsageError
from muonlab.families.autoresearch import gpt_config
from muonlab.model import GPT
from muonlab.model.extensions import REGISTRY, VariantConfig, is_builtin
from muonlab.model.variants.qk_scale import QKScaleConfig
from muonlab.optim import MuonAdamW, extensions
from muonlab.optim.addons.moment_free import TableNeumann
from muonlab.optim.addons.neumann_whitening import NeumannWhitening
from muonlab.optim.addons.polar_precision import PolarPrecision
from muonlab.settings import Section, set_dotted, setting

GROUP_SECTIONS = (PolarPrecision, NeumannWhitening, TableNeumann)


def test_a_frozen_section_is_replaced_by_an_updated_copy_not_mutated():
    cfg = resolve_config("baseline", "cpu-tiny")
    before = cfg.model.qk
    set_dotted(cfg, "model.qk.kind", "pair_tied_stopexp")
    set_dotted(cfg, "model.qk.freeze_planes", 4)
    assert before.kind == "none" and before.freeze_planes == 0  # the old object is untouched
    assert cfg.model.qk == QKScaleConfig(kind="pair_tied_stopexp", freeze_planes=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.qk.kind = "none"


def test_a_frozen_section_inside_a_frozen_section_is_replaced_up_the_chain():
    @dataclasses.dataclass(frozen=True)
    class Inner(Section):
        x: int = setting(1, "x")

    @dataclasses.dataclass(frozen=True)
    class Middle(Section):
        inner: Inner = setting(factory=Inner)

    @dataclasses.dataclass
    class Root(Section):
        middle: Middle = setting(factory=Middle)

    root = Root()
    set_dotted(root, "middle.inner.x", "7")
    assert root.middle.inner.x == 7
    with pytest.raises(UsageError, match="expects int"):
        set_dotted(root, "middle.inner.x", "seven")
    assert root.middle.inner.x == 7


@pytest.mark.parametrize("key, value", [("qk_scale", "pair_tied_stopexp"), ("oe_m", 64), ("routing", "shden"),
                                        ("presub_gains", "weight_fused"), ("radius_gate", "state"),
                                        ("residual_rule", "branch_tangent"), ("rope", "lerope_adapted")])
def test_the_resolved_section_is_the_config_the_model_variant_reads(key, value):
    cfg = resolve_config("baseline", "cpu-tiny", {key: value})
    sections = [s for s in vars(cfg.model).values() if isinstance(s, VariantConfig) and s.is_on()]
    assert len(sections) == 1
    model = GPT(gpt_config(cfg, vocab_size=cfg.data.vocab_size))
    built = [v for v in model.variants if v.cfg is sections[0]]
    assert len(built) == 1, "the variant must read the very section the run resolved"


def test_every_builtin_variant_config_is_its_own_section():
    for name, info in REGISTRY.items():
        if not is_builtin(info) or name in ("checkpoint_blocks", "chunked_loss"):  # the memory path's two
            continue
        assert issubclass(info.config, VariantConfig), name
        assert info.config.__dataclass_params__.frozen, name
        assert info.config.METHOD.selector in {f.name for f in dataclasses.fields(info.config)}, name


def test_a_variant_config_made_in_code_is_checked_against_its_settings():
    cfg = resolve_config("baseline", "cpu-tiny")
    with pytest.raises(ValueError, match="qk_scale is off"):
        GPT(gpt_config(cfg, vocab_size=64).__class__(**{**vars(gpt_config(cfg, vocab_size=64)),
                                                         "variants": (QKScaleConfig(),)}))
    base = vars(gpt_config(cfg, vocab_size=64))
    with pytest.raises(ValueError, match="kind must be one of"):
        GPT(gpt_config(cfg, vocab_size=64).__class__(**{**base, "variants": (QKScaleConfig(kind="pair_tied"),)}))
    with pytest.raises(ValueError, match="qk_lr_mult must be >= 0"):
        GPT(gpt_config(cfg, vocab_size=64).__class__(**{**base, "variants": (
            QKScaleConfig(kind="head_temp", lr_mult=-1.0),)}))


@pytest.mark.parametrize("cls", GROUP_SECTIONS)
def test_an_addons_group_keys_are_its_settings_dotted_keys(cls):
    settings = set(flag_table().values())  # every setting's dotted key
    for field, key in cls.group_keys().items():
        assert f"optim.{key}" in settings and key.endswith("." + field), (cls.__name__, field, key)


@pytest.mark.parametrize("cls", GROUP_SECTIONS)
def test_an_addon_reads_back_from_a_group_what_it_wrote(cls):
    fields = dataclasses.fields(cls)
    changed = {}
    for f in fields:  # a value other than the default for every setting the type allows
        choices = [c for c in getattr(f.type, "__args__", ()) if c != f.default]
        if choices:
            changed[f.name] = choices[-1]
        elif isinstance(f.default, bool):
            changed[f.name] = not f.default
        elif isinstance(f.default, (int, float)):
            changed[f.name] = type(f.default)(f.default + 2)
    made = dataclasses.replace(cls(), **changed)
    group = made.group_options()
    assert set(group) == {cls.group_keys()[name] for name in changed}
    assert cls.from_group(group) == made
    assert cls.from_group({}) == cls() and cls().group_options() == {}


def test_an_addon_refuses_a_bad_group_value_naming_its_key():
    with pytest.raises(ValueError, match=r"polar\.dtype must be one of bf16, fp32"):
        PolarPrecision.from_group({"polar.dtype": "fp16"})
    with pytest.raises(ValueError, match=r"whiten\.terms"):
        NeumannWhitening.from_group({"whiten.kind": "neumann", "whiten.terms": 0})
    p = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"polar\.post_dtype"):
        MuonAdamW([{"kind": "muon", "params": [p], "lr": 0.02, "momentum": 0.95, "ns_steps": 5, "beta2": 0.95,
                    "weight_decay": 0.0, "polar.post_dtype": "fp8"}])


def test_a_method_wired_in_place_has_one_record():
    """The polar precision, the AdamW whitening and master state and the moment-free kind are plain calls
    (muon_variant, method_points): `muonlab methods` lists each from its section's METHOD, and no second
    record of it is kept beside the extension point (two records had drifted: master32's paper section)."""
    from muonlab.lab.methods import method_catalog

    listed = {e["name"]: e for e in method_catalog()}
    for name, module in (("polar_precision", "polar_precision"), ("neumann_whitening", "neumann_whitening"),
                         ("master32", "master32"), ("table_neumann", "moment_free")):
        assert listed[name]["module"] == f"muonlab.optim.addons.{module}"
        assert listed[name]["paper"].startswith("seed 00") and listed[name]["tests"]
    assert [name for name in dir(extensions) if name.startswith("register_")] == ["register_prepolar"]
    assert [r.name for r in extensions.records()] == list(extensions.prepolars())


def test_every_method_has_one_record_of_one_type():
    """Issue 45 item 4: a conditioner's, a variant's and a section's record are one type (MethodInfo); a
    built-in variant's registry record is its config's METHOD itself, not a copy."""
    from muonlab.settings import MethodInfo

    assert all(isinstance(r, MethodInfo) for r in extensions.records())
    for name, info in REGISTRY.items():
        assert isinstance(info.record, MethodInfo), name
        method = getattr(info.config, "METHOD", None)
        assert method is None or info.record is method, name
