"""What a local sweep's run gets from its slot: its GPU, its share of the cores for torch's threads
and for torch.compile's compile workers (so N runs never compile on all cores at once), and a
session of its own (the terminal's Ctrl-C reaches the sweep alone, which forwards it once)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import muonlab.lab.executors as executors
from muonlab.lab.executors import LocalExecutor

CAPS = ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")


@pytest.fixture
def machine(monkeypatch):
    """A machine of `cores` cores, the sweep's environment without thread settings of its own."""
    for name in CAPS:
        monkeypatch.delenv(name, raising=False)

    def cores(n: int):
        monkeypatch.setattr(executors, "usable_cores", lambda: n)

    return cores


@pytest.mark.parametrize(("cores", "gpus", "parallel", "share"), [
    (16, ["0", "1", "2", "3"], None, 4),  # one run per GPU: 4 runs at a time
    (16, ["0", "1", "2", "3"], 2, 8),  # 2 of the 4 GPUs
    (8, ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"], None, 1),  # more GPUs than cores: at least 1
])
def test_each_gpu_slot_gets_its_gpu_and_its_share_of_the_cores(machine, cores, gpus, parallel, share):
    machine(cores)
    executor = LocalExecutor(parallel=parallel, gpus=gpus)
    for slot in executor.slots:
        env = executor._env(slot)
        assert env["CUDA_VISIBLE_DEVICES"] == slot
        assert {name: env[name] for name in CAPS} == {name: str(share) for name in CAPS}


def test_cpu_slots_split_the_cores(machine):
    machine(16)
    executor = LocalExecutor(parallel=3, gpus=[])
    env = executor._env(None)
    assert env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # the sweep's own
    assert {name: env[name] for name in CAPS} == {name: "5" for name in CAPS}


def test_the_sweeps_own_thread_settings_are_kept(machine, monkeypatch):
    machine(16)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env = LocalExecutor(gpus=["0", "1"])._env("1")
    assert (env["OMP_NUM_THREADS"], env["TORCHINDUCTOR_COMPILE_THREADS"]) == ("2", "1")


@pytest.mark.multiprocess
def test_a_run_started_with_its_slots_environment_applies_the_caps(machine):
    machine(2)  # this machine's 2 cores over 2 slots: 1 thread each
    env = LocalExecutor(gpus=["0", "1"])._env("0")
    probe = ("import json, torch, torch._inductor.config as inductor; "
             "print(json.dumps([torch.get_num_threads(), inductor.compile_threads]))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [1, 1]  # torch reads both at import: nothing else to apply


def test_runs_start_in_a_session_of_their_own_with_their_slots_environment(machine, monkeypatch, tmp_path):
    machine(8)
    started = []

    class Finished:
        returncode = 0

        def __init__(self, cmd, **kwargs):
            started.append(kwargs)

        def poll(self):
            return 0

    monkeypatch.setattr(executors.subprocess, "Popen", Finished)
    jobs = [SimpleNamespace(name=f"run{i}", resume_dir=None) for i in range(2)]
    executor = LocalExecutor(gpus=["0", "1"])
    executor.run(jobs, tmp_path, log=lambda _: None)
    assert [kw["start_new_session"] for kw in started] == [True, True]  # no share in the terminal's Ctrl-C
    assert sorted(kw["env"]["CUDA_VISIBLE_DEVICES"] for kw in started) == ["0", "1"]
    assert all(kw["env"]["TORCHINDUCTOR_COMPILE_THREADS"] == "4" for kw in started)
