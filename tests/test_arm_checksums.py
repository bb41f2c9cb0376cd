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
FINGERPRINT, MACHINE = golden_script.machine_fingerprint()
_SETS = golden_script.load_golden()["machines"]
GOLDEN = _SETS.get(FINGERPRINT, {}).get("arms")
# bits depend on the CPU (see the script): without this machine's set there is nothing to compare
needs_golden = pytest.mark.skipif(GOLDEN is None, reason=f"no golden arm checksums for this machine ({MACHINE}, "
                                  f"{FINGERPRINT}); record them as tests/golden/make_arm_checksums.py says")


@pytest.fixture(scope="module")
def data_cache():
    return {}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("arm-cache")


def test_every_machine_set_covers_every_registered_arm():
    from muonlab.arms import ARMS

    assert _SETS, "the golden file holds no machine set"
    for fingerprint, entry in _SETS.items():
        assert sorted(ARMS) == sorted(entry["arms"]), f"{entry['machine']}: record new arms with the script"


@needs_golden
@pytest.mark.slow
@pytest.mark.parametrize("arm_name", sorted(next(iter(_SETS.values()))["arms"]))
def test_arm_reproduces_its_golden_checksum(arm_name, data_cache, shared_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))  # prepare each preset's data once
    expected = GOLDEN[arm_name]
    digest, tensors = golden_script.arm_checksum(arm_name, expected["preset"], tmp_path / "runs", data_cache)
    moved = sorted(set(expected["tensors"].values()) - set(tensors.values()))
    assert digest == expected["digest"], f"{arm_name}: {len(moved)} tensors differ, e.g. {moved[:3]}"
