"""Moving code must not move a run's identity: every arm x preset config hash and protocol id, and every
flag's dotted key, as recorded by tests/golden/make_config_identity.py before the front hall was rebuilt."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path


GOLDEN_DIR = Path(__file__).parents[1] / "golden"


def _maker():
    spec = importlib.util.spec_from_file_location("make_config_identity", GOLDEN_DIR / "make_config_identity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_arm_preset_identity_and_flag_is_the_recorded_one():
    maker = _maker()
    recorded = json.loads((GOLDEN_DIR / "config_identity.json").read_text())
    now = maker.identity()
    assert sum(v != "refused" for v in recorded["runs"].values()) > 700  # the guard guards something
    assert maker.differences(recorded, now) == []


def test_the_guard_sees_one_changed_hash():
    maker = _maker()
    recorded = json.loads((GOLDEN_DIR / "config_identity.json").read_text())
    key = next(k for k, v in recorded["runs"].items() if v != "refused")
    changed = {**recorded, "runs": {**recorded["runs"], key: "0" * 16 + "|x"}}
    assert maker.differences(recorded, changed) == [f"runs {key}: {recorded['runs'][key]} -> {'0' * 16}|x"]
