"""Every registered arm reproduces its golden parameter checksum after 3 steps, bit for bit, on a machine
whose set is recorded.

The golden file was recorded by tests/golden/make_arm_checksums.py before the structure refactor
(issue 12); this test reruns that script's own harness, so the two cannot drift. Arms whose checked
configs hash alike (every setting that can change a number) form one group, trained once. Bits depend
on the CPU: on a machine without a recorded set this check is skipped, and the float64 figures
(tests/arms/test_arm_float64.py), which hold on any CPU, compare every arm's numbers there as everywhere.
`MUONLAB_ARM_CHECKSUMS` points the test at another golden file (the suite points it at an empty one, so
the path of a machine without a set runs on every machine).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).parents[1] / "golden" / "make_arm_checksums.py"
golden_script = sys.modules.get("make_arm_checksums")  # loaded once per process (the float64 script loads it too)
if golden_script is None:
    _spec = importlib.util.spec_from_file_location("make_arm_checksums", _SCRIPT)
    golden_script = sys.modules["make_arm_checksums"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(golden_script)
FINGERPRINT, MACHINE = golden_script.machine_fingerprint()
GOLDEN_FILE = Path(os.environ.get("MUONLAB_ARM_CHECKSUMS") or golden_script.GOLDEN)
_SETS = golden_script.load_golden(GOLDEN_FILE)["machines"]
GOLDEN = _SETS.get(FINGERPRINT, {}).get("arms")
STALE = _SETS.get(FINGERPRINT, {}).get("stale", {})  # arms an intended change moved, not yet recorded here
NO_SET = (f"no golden arm checksums for this machine ({MACHINE}, {FINGERPRINT}) in {GOLDEN_FILE.name}: bits not "
          "compared (the float64 figures are); record them as tests/golden/make_arm_checksums.py says")


@pytest.fixture(scope="module")
def data_cache():
    return {}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("arm-cache")


@pytest.mark.skipif(GOLDEN_FILE != golden_script.GOLDEN or not GOLDEN_FILE.exists(),
                    reason="another golden file (MUONLAB_ARM_CHECKSUMS), or none")
def test_every_machine_set_covers_every_registered_arm():
    from muonlab.arms import ARMS

    assert _SETS, "the golden file holds no machine set"
    for fingerprint, entry in _SETS.items():
        stale = entry.get("stale", {})
        assert not set(stale) & set(entry["arms"]) and all(stale.values()), f"{entry['machine']}: stale entries"
        assert sorted(ARMS) == sorted([*entry["arms"], *stale]), f"{entry['machine']}: record new arms with the script"


@pytest.fixture(autouse=True)
def _recording_threads():
    """The thread count the sets were recorded with (the script's), whatever the suite runs at."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(golden_script.recording_threads())
    yield
    torch.set_num_threads(threads)


# arms whose checked configs are one (e.g. K.5's batch arms at the CPU batch are t1's): one run per group
def _registered_arms() -> list[str]:
    from muonlab.arms import ARMS

    return sorted(ARMS)


GROUPS = golden_script.arm_groups(_registered_arms())
# config groups that differ only in a float setting's value run one code path: one of them is trained
CODE_PATHS = golden_script.code_path_groups(_registered_arms())


def test_arms_of_one_config_share_one_golden_checksum():
    """Each group's members have its first arm's config hash (by construction) and recorded digest, so
    training the first checks them all; an arm whose settings change leaves its group and is trained."""
    for fingerprint, entry in _SETS.items():
        for first, members in GROUPS.items():
            digests = {entry["arms"][name]["digest"] for name in members if name in entry["arms"]}
            assert len(digests) <= 1, f"{entry['machine']}: {members} share a config but not a checksum"
    assert sum(len(m) for m in GROUPS.values()) == len(_registered_arms())


# Settings no code branches on, read from where each acts: AF-Muon's tied rate lr * rho * s / d (optim/af_muon.py,
# eq. 6), the vector and AdamW groups' learning rates, the shared denominator's eps inside its rsqrt (seed 002's 12do)
MULTIPLY_OR_ADD = {"optim.scale", "optim.rho", "optim.vector_lr", "optim.adamw_lr", "model.routing.eps"}


def test_one_code_path_is_config_groups_apart_only_in_float_values():
    """Each code path's config groups differ only in settings that multiply or add, each such value finite, neither
    0 nor 1 and of one sign across the path (transcribed from code_path_groups' rule); the rule keeps the rest apart:
    K.7's caps, a switch in the LMO (below sqrt(d) the Newton clamp, above it the row scaling alone), above all."""
    from muonlab.arms import ARMS

    for first, members in CODE_PATHS.items():
        values = [golden_script.checked_config(name).hashed_values() for name in members]
        for other in values[1:]:
            assert other.keys() == values[0].keys(), first
            for key in (k for k in other if other[k] != values[0][k]):
                pair = (values[0][key], other[key])
                assert key in MULTIPLY_OR_ADD, (first, key, pair)
                assert all(type(v) is float and math.isfinite(v) and v not in (0.0, 1.0) for v in pair), (first, key, pair)
                assert (pair[0] > 0) == (pair[1] > 0), (first, key, pair)
    assert sorted(n for m in CODE_PATHS.values() for n in m) == sorted(ARMS)
    assert all(set(m) <= set(CODE_PATHS[f]) for f, m in GROUPS.items() if f in CODE_PATHS)  # a config group stays whole
    caps = {first for first in CODE_PATHS if first.startswith("k7_")}
    assert len(caps) == len({first for first in GROUPS if first.startswith("k7_")}) > 1  # each cap trained
    path = golden_script.code_path
    assert path({"optim.rho": 5.0, "k": 2}) == path({"optim.rho": 60.0, "k": 2})
    for apart in ({"optim.rho": 0.0, "k": 2}, {"optim.rho": 1.0, "k": 2}, {"optim.rho": math.inf, "k": 2},
                  {"optim.rho": -5.0, "k": 2}, {"optim.rho": 5.0, "k": 3}, {"optim.rho": "5.0", "k": 2}):
        assert path(apart) != path({"optim.rho": 5.0, "k": 2}), apart
    assert path({"optim.cap": 2.0}) != path({"optim.cap": 10.0})

@pytest.mark.parametrize("arm_name", sorted(CODE_PATHS))
def test_arm_trains_to_its_golden_checksum(arm_name, data_cache, shared_cache, tmp_path, monkeypatch):
    from muonlab.arms import ARMS

    if GOLDEN is None:
        pytest.skip(NO_SET)
    if arm_name not in GOLDEN:
        pytest.skip(f"{arm_name}: stale on this machine ({STALE.get(arm_name, 'not recorded')}): bits not compared "
                    "(the float64 figures are); record them as tests/golden/make_arm_checksums.py says")
    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))  # prepare each preset's data once
    preset_name = golden_script.preset_for(ARMS[arm_name])
    digest, tensors = golden_script.arm_checksum(arm_name, preset_name, tmp_path / "runs", data_cache)
    expected = GOLDEN[arm_name]
    assert expected["preset"] == preset_name, f"{arm_name}: recorded under {expected['preset']}"
    moved = sorted(set(expected["tensors"].values()) - set(tensors.values()))
    assert digest == expected["digest"], f"{arm_name}: {len(moved)} tensors differ, e.g. {moved[:3]}"
