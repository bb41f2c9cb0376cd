"""A checkpoint of an earlier release, whose optimizer groups hold the flat names (`whiten_tau`, `prepolar`,
`post_polar_dtype`), loads as today's groups (the dotted keys below `optim.`); a group made in code with an old
name is refused naming the new one. The earlier release's groups were recorded by that release
(tests/golden/record_legacy_groups.py, at commit 6e2a25b)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from muonlab.optim import MuonAdamW, extensions
from muonlab.optim.addons import moment_free, neumann_whitening
from muonlab.optim.legacy_group_keys import RENAMED

_SCRIPT = Path(__file__).parents[1] / "golden" / "record_legacy_groups.py"
_spec = importlib.util.spec_from_file_location("record_legacy_groups", _SCRIPT)
recording = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recording)


def _options(groups):
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


@pytest.fixture(scope="module")
def earlier():
    return torch.load(recording.OUT, weights_only=True)


def test_the_recording_holds_every_old_name_a_run_wrote(earlier):
    keys = {k for g in earlier for k in g}
    assert {"whiten", "whiten_tau", "whiten_terms", "whiten_mean_addback", "whiten_first_t", "table_whiten",
            "table_whiten_tau", "table_whiten_first_t", "prepolar", "prepolar_scope", "prepolar_tau",
            "prepolar_first_t", "polar_dtype", "post_polar_dtype"} <= keys
    assert not any("." in k for k in keys)


def test_an_earlier_releases_groups_load_as_todays_groups(earlier):
    """The recorded groups, loaded into today's optimizer of the same config, are that optimizer's groups: every
    method's value under its new key, nothing left under an old one (an old key left in place would run the
    method at its default: torch takes a loaded group's options as they were saved)."""
    today = recording.param_groups()
    assert _options(earlier) != _options(today)  # the names did change
    optimizer = recording.optimizer()
    optimizer.load_state_dict({"state": {}, "param_groups": earlier})
    assert _options(optimizer.param_groups) == _options(today)
    assert optimizer.param_groups[-1]["prepolar.tau"] == 25.0 and optimizer.param_groups[0]["whiten.tau"] == 40.0


def test_every_new_name_is_a_group_key_of_todays_methods():
    known = {key for cls in extensions.prepolars().values() for key in cls.group_defaults()}
    known |= {"prepolar.kind", "prepolar.scope"} | set(neumann_whitening.WHITEN_DEFAULTS)
    known |= set(moment_free.OE_MFREE_DEFAULTS)
    from muonlab.optim.addons.polar_precision import PolarPrecision

    known |= set(PolarPrecision.group_keys().values())
    assert set(RENAMED.values()) <= known, set(RENAMED.values()) - known


@pytest.mark.parametrize("old, new", [("prepolar_tau", "prepolar.tau"), ("prepolar", "prepolar.kind"),
                                      ("post_polar_dtype", "polar.post_dtype"), ("prepolar_p", "prepolar.p")])
def test_a_group_made_in_code_with_an_old_name_is_refused_naming_the_new_one(old, new, plugin_power):
    p = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=rf"^{old} is now {new.replace('.', '[.]')} "):
        MuonAdamW([{"kind": "muon", "params": [p], "lr": 0.02, old: "hbieq"}])


@pytest.mark.parametrize("key", ["prepolar_tua", "prepolar_step"])
def test_a_prepolar_key_that_never_was_an_option_is_not_given_a_new_name(key):
    p = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=rf"^{key} is not a group key"):
        MuonAdamW([{"kind": "muon", "params": [p], "lr": 0.02, key: 1.0}])


@pytest.fixture
def plugin_power():
    """A plug-in conditioner with an option `p` (its old group key was prepolar_p)."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Power(extensions.PrePolar):
        p: float = extensions.option(0.5, "the power of |G|")

    extensions.register_prepolar("test_legacy_power", Power, paper="none (test plug-in)")
    yield
    extensions.unregister_prepolar("test_legacy_power")


def test_a_checkpoint_in_the_earlier_format_is_read_and_one_in_no_known_format_is_refused(tmp_path, monkeypatch):
    """A run writes muonlab-checkpoint/2 (the dotted group keys), so a release that reads /1 alone refuses it instead
    of running the methods at their defaults; /1, what 6e2a25b wrote (its groups renamed on load), is still read."""
    from muonlab.errors import MuonlabError
    from muonlab.train import checkpoint

    assert checkpoint.CHECKPOINT_FORMAT == "muonlab-checkpoint/2"
    for fmt, readable in (("muonlab-checkpoint/1", True), ("muonlab-checkpoint/0", False)):
        monkeypatch.setattr(checkpoint, "CHECKPOINT_FORMAT", fmt)  # what that release writes, sidecar and payload
        path = checkpoint.save_checkpoint(tmp_path / fmt.replace("/", "-"), 3, {"x": torch.ones(2)})
        monkeypatch.undo()
        if readable:
            assert checkpoint.load_checkpoint(path)["step"] == 3
        else:
            with pytest.raises(MuonlabError, match="unknown checkpoint format 'muonlab-checkpoint/0'"):
                checkpoint.load_checkpoint(path)
