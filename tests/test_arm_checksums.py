"""Every registered arm reproduces its golden parameter checksum after 3 steps, bit for bit.

The golden file was recorded by tests/golden/make_arm_checksums.py before the structure refactor
(issue 12); this test reruns that script's own harness, so the two cannot drift. Arms whose checked
configs hash alike (every setting that can change a number) form one group, trained once.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).parent / "golden" / "make_arm_checksums.py"
_spec = importlib.util.spec_from_file_location("make_arm_checksums", _SCRIPT)
golden_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_script)
FINGERPRINT, MACHINE = golden_script.machine_fingerprint()
_SETS = golden_script.load_golden()["machines"]
GOLDEN = _SETS.get(FINGERPRINT, {}).get("arms")
STALE = _SETS.get(FINGERPRINT, {}).get("stale", {})  # arms an intended change moved, not yet recorded here
# Bits depend on the CPU (see the script). Without this machine's set every arm still trains and
# must change its weights; the bit-for-bit comparison is then reported as not made (a warning).
NO_SET = (f"no golden arm checksums for this machine ({MACHINE}, {FINGERPRINT}): arms trained, bits not "
          "compared; record them as tests/golden/make_arm_checksums.py says")


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
        stale = entry.get("stale", {})
        assert not set(stale) & set(entry["arms"]) and all(stale.values()), f"{entry['machine']}: stale entries"
        assert sorted(ARMS) == sorted([*entry["arms"], *stale]), f"{entry['machine']}: record new arms with the script"


def _initial_weights(arm_name: str, preset_name: str, data_cache: dict) -> dict[str, str]:
    """The per-tensor digests of the arm's model as initialised (seeded as a run seeds it)."""
    import torch

    from muonlab.arms import resolve_config
    from muonlab.device import Runtime
    from muonlab.train.build import build_model

    cfg = resolve_config(arm_name, preset_name,
                         {"num_steps": golden_script.STEPS, **golden_script.preset_batch(preset_name, arm_name)})
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data_cache[preset_name].tokenizer.vocab_size, Runtime(torch.device("cpu"), "fp32"))
    return golden_script.weights_digest(model.state_dict())[1]


@pytest.fixture(autouse=True)
def _recording_threads():
    """The thread count the sets were recorded with (the script's), whatever the suite runs at."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(golden_script.recording_threads())
    yield
    torch.set_num_threads(threads)


# arms whose checked configs are one (e.g. K.5's batch arms at the CPU batch are t1's): one run per group
ARMS_RECORDED = sorted({*next(iter(_SETS.values()))["arms"], *next(iter(_SETS.values())).get("stale", {})})
GROUPS = golden_script.arm_groups(ARMS_RECORDED)


def test_arms_of_one_config_share_one_golden_checksum():
    """Each group's members have its first arm's config hash (by construction) and recorded digest, so
    training the first checks them all; an arm whose settings change leaves its group and is trained."""
    for fingerprint, entry in _SETS.items():
        for first, members in GROUPS.items():
            digests = {entry["arms"][name]["digest"] for name in members if name in entry["arms"]}
            assert len(digests) <= 1, f"{entry['machine']}: {members} share a config but not a checksum"
    assert sum(len(m) for m in GROUPS.values()) == len(ARMS_RECORDED)


@pytest.mark.slow
@pytest.mark.parametrize("arm_name", sorted(GROUPS))
def test_arm_trains_to_its_golden_checksum(arm_name, data_cache, shared_cache, tmp_path, monkeypatch):
    from muonlab.arms import ARMS

    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))  # prepare each preset's data once
    recorded = GOLDEN if GOLDEN is not None and arm_name in GOLDEN else None
    preset_name = golden_script.preset_for(ARMS[arm_name])
    digest, tensors = golden_script.arm_checksum(arm_name, preset_name, tmp_path / "runs", data_cache)
    if recorded is None:
        warnings.warn(NO_SET if GOLDEN is None else f"{arm_name}: stale on this machine ({STALE[arm_name]}): "
                      "trained, bits not compared; record them as tests/golden/make_arm_checksums.py says")
        initial = _initial_weights(arm_name, preset_name, data_cache)
        assert set(tensors) == set(initial) and tensors != initial, f"{arm_name}: 3 steps left every weight as it was"
        return
    expected = recorded[arm_name]
    assert expected["preset"] == preset_name, f"{arm_name}: recorded under {expected['preset']}"
    moved = sorted(set(expected["tensors"].values()) - set(tensors.values()))
    assert digest == expected["digest"], f"{arm_name}: {len(moved)} tensors differ, e.g. {moved[:3]}"
