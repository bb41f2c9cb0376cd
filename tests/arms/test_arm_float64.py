"""Every registered arm reproduces its recorded float64 figures after 3 steps, on any CPU.

The figures (each step's loss; each final tensor's norm and projection on a fixed random direction) were
recorded by tests/golden/arm_float64.py, whose harness this test reruns; its docstring argues the
tolerance (RTOL, 1e-6 relative) from the float64 arithmetic. The bitwise checksums
(tests/arms/test_arm_checksums.py) are compared on top where this machine has a recorded set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).parents[1] / "golden" / "arm_float64.py"
_spec = importlib.util.spec_from_file_location("arm_float64", _SCRIPT)
figures_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures_script)
RECORDED = figures_script.load_figures()["arms"]


def _registered_arms() -> list[str]:
    from muonlab.arms import ARMS

    return sorted(ARMS)


GROUPS = figures_script.harness.arm_groups(_registered_arms())  # arms of one config: one set of figures
# config groups that differ only in a float setting's value run one code path: one of them is trained
# (make_arm_checksums.code_path_groups says which values stay apart)
CODE_PATHS = figures_script.harness.code_path_groups(_registered_arms())


@pytest.fixture(scope="module")
def data_cache():
    return {}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("arm-float64-cache")


@pytest.fixture(autouse=True)
def _recording_threads():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # any thread count gives the figures (RTOL); one leaves the other workers their cores
    yield
    torch.set_num_threads(threads)


def test_the_figures_cover_every_registered_arm_and_one_config_gives_one_set():
    from muonlab.arms import ARMS

    assert sorted(RECORDED) == sorted(ARMS), "record new arms with tests/golden/arm_float64.py --arms ..."
    for first, members in GROUPS.items():
        assert all(RECORDED[name] == RECORDED[first] for name in members), f"{members} share a config, not figures"


def test_the_comparison_tells_a_changed_figure_from_rounding():
    """differences() against hand-made figures: a change of 10 x RTOL is reported, one of RTOL / 10 is not,
    a projection is judged against its tensor's norm, a missing tensor and a non-finite loss are reported."""
    rtol = figures_script.RTOL
    recorded = {"preset": "cpu-tiny", "steps": 3, "losses": [5.0, 4.0], "tensors": {"w": [2.0, 1e-3], "b": [0.5, 0.1]}}

    def moved(**changes):
        out = json.loads(json.dumps(recorded))
        for key, value in changes.items():
            name, _, index = key.partition("__")
            if name == "loss":
                out["losses"][int(index)] = value
            else:
                out["tensors"][name][int(index)] = value
        return out

    assert figures_script.differences(recorded, recorded) == []
    assert figures_script.differences(moved(loss__1=4.0 * (1 + rtol / 10)), recorded) == []
    assert len(figures_script.differences(moved(loss__1=4.0 * (1 + 10 * rtol)), recorded)) == 1
    assert figures_script.differences(moved(w__1=1e-3 + 2.0 * rtol / 10), recorded) == []  # vs the norm 2.0
    assert len(figures_script.differences(moved(w__1=1e-3 + 2.0 * rtol * 10), recorded)) == 1
    assert len(figures_script.differences(moved(b__0=0.5 * (1 + 10 * rtol)), recorded)) == 1
    assert len(figures_script.differences(moved(loss__0=float("nan")), recorded)) == 1
    missing = json.loads(json.dumps(recorded))
    del missing["tensors"]["b"]
    assert figures_script.differences(missing, recorded) == ["tensor b missing"]


@pytest.mark.parametrize("arm_name", sorted(CODE_PATHS))
def test_arm_matches_its_float64_figures(arm_name, data_cache, shared_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))  # prepare each preset's data once
    measured = figures_script.arm_figures(arm_name, tmp_path / "runs", data_cache)
    differences = figures_script.differences(measured, RECORDED[arm_name])
    assert not differences, f"{arm_name}: {len(differences)} figures differ, e.g. {differences[:3]}"


def test_normuon_off_by_1e_4_fails_the_float64_check(data_cache, shared_cache, tmp_path, monkeypatch):
    """The check must catch a small change of the math on a machine without a bitwise set: NorMuon's output
    scaled by 1 + 1e-4 (a change bf16 Polar Express output would round away) moves the baseline's figures."""
    import muonlab.optim.steps as steps

    monkeypatch.setenv("MUONLAB_CACHE", str(shared_cache))
    normuon = steps.normuon
    monkeypatch.setattr(steps, "normuon", lambda *args, **kwargs: normuon(*args, **kwargs) * (1 + 1e-4))
    measured = figures_script.arm_figures("baseline", tmp_path / "runs", data_cache)
    differences = figures_script.differences(measured, RECORDED["baseline"])
    assert any("c_proj" in d for d in differences), differences
    assert not any(d.startswith("loss at step 0") for d in differences)  # step 0's loss comes before any update


def test_a_machine_without_a_bitwise_set_still_compares_numbers(tmp_path):
    """The path a new machine takes, on every machine: the arm tests pointed at an empty golden file skip
    the bit comparison with the reason, and the float64 figures are still compared (and pass)."""
    empty = tmp_path / "arm_checksums.json"
    empty.write_text(json.dumps({"machines": {}}))
    here = Path(__file__).parent
    first_of = {member: first for first, members in CODE_PATHS.items() for member in members}
    groups = [first_of["baseline"], first_of["t1_hybrid"]]  # the autoresearch GPT and seed 004's tied GPT
    nodes = [*(f"{here / 'test_arm_checksums.py'}::test_arm_trains_to_its_golden_checksum[{g}]" for g in groups),
             *(f"{here / 'test_arm_float64.py'}::test_arm_matches_its_float64_figures[{g}]" for g in groups)]
    env = {**os.environ, "MUONLAB_ARM_CHECKSUMS": str(empty), "MUONLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *nodes], capture_output=True, text=True, env=env, cwd=here.parents[1], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed, 2 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "SKIPPED [2] tests/arms/test_arm_checksums.py" in proc.stdout, proc.stdout[-3000:]  # -rs folds alike skips
    assert "no golden arm checksums for this machine" in proc.stdout, proc.stdout[-3000:]
