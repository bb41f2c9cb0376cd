"""Every registered arm reproduces its golden parameter checksum after 3 steps, bit for bit.

The golden file was recorded by tests/golden/make_arm_checksums.py before the structure refactor
(issue 12); this test reruns that script's own harness, so the two cannot drift.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).parent / "golden" / "make_arm_checksums.py"
_spec = importlib.util.spec_from_file_location("make_arm_checksums", _SCRIPT)
golden_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_script)
GOLDEN = json.loads(golden_script.GOLDEN.read_text())


@pytest.fixture(scope="module")
def data_cache():
    return {}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("arm-cache")


def test_every_registered_arm_has_a_golden_checksum():
    from muonlab.arms import ARMS

    assert sorted(ARMS) == sorted(GOLDEN), "record new arms with tests/golden/make_arm_checksums.py"


@pytest.mark.slow
@pytest.mark.parametrize("arm_name", sorted(GOLDEN))
def test_arm_reproduces_its_golden_checksum(arm_name, data_cache, shared_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))  # prepare each preset's data once
    expected = GOLDEN[arm_name]
    digest, tensors = golden_script.arm_checksum(arm_name, expected["preset"], tmp_path / "runs", data_cache)
    moved = sorted(set(expected["tensors"].values()) - set(tensors.values()))
    assert digest == expected["digest"], f"{arm_name}: {len(moved)} tensors differ, e.g. {moved[:3]}"
