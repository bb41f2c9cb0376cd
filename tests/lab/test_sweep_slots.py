"""What a local sweep's run gets from its slot: its GPU, its share of the cores for torch's threads
and for torch.compile's compile workers (so N runs never compile on all cores at once), and a
session of its own (the terminal's Ctrl-C reaches the sweep alone, which forwards it once)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from support.torchrun import ABORT, run_muonlab

import muonlab.lab.executors as executors
from muonlab.arms import resolve_config
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
    cfg = resolve_config("baseline", "cpu-tiny")
    jobs = [SimpleNamespace(name=f"run{i}", resume_dir=None, config=cfg) for i in range(2)]
    executor = LocalExecutor(gpus=["0", "1"])
    executor.run(jobs, tmp_path, log=lambda _: None)
    assert [kw["start_new_session"] for kw in started] == [True, True]  # no share in the terminal's Ctrl-C
    assert sorted(kw["env"]["CUDA_VISIBLE_DEVICES"] for kw in started) == ["0", "1"]
    assert all(kw["env"]["TORCHINDUCTOR_COMPILE_THREADS"] == "4" for kw in started)


@pytest.mark.parametrize(("gpus", "per_run", "parallel", "slots"), [
    (["0", "1", "2", "3", "4", "5", "6", "7"], 4, None, ["0,1,2,3", "4,5,6,7"]),  # 2 runs of 4 GPUs
    (["0", "1", "2", "3", "4"], 2, None, ["0,1", "2,3"]),  # the odd GPU idles: runs never share one
    (["0", "1", "2", "3"], 2, 1, ["0,1"]),
    (["3", "5"], 2, None, ["3,5"]),  # the sweep's own CUDA_VISIBLE_DEVICES ids
])
def test_a_run_of_n_gpus_gets_n_gpus_of_its_own(machine, gpus, per_run, parallel, slots):
    machine(16)
    executor = LocalExecutor(parallel=parallel, gpus=gpus, gpus_per_run=per_run)
    assert executor.slots == slots
    for slot in slots:
        env = executor._env(slot)
        assert env["CUDA_VISIBLE_DEVICES"] == slot
        assert env["OMP_NUM_THREADS"] == str(max(1, 16 // (len(slots) * per_run)))  # per process
    assert executor.launcher()[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                        str(per_run)]


def test_gpus_per_run_is_refused_where_it_cannot_act(machine):
    machine(16)
    with pytest.raises(executors.UsageError, match="exceeds the 2 visible GPU"):
        LocalExecutor(gpus=["0", "1"], gpus_per_run=4)
    with pytest.raises(executors.UsageError, match="4 visible GPU.s. hold 2 run"):
        LocalExecutor(gpus=["0", "1", "2", "3"], gpus_per_run=2, parallel=3)
    with pytest.raises(executors.UsageError, match=">= 1"):
        LocalExecutor(gpus=[], gpus_per_run=0)
    with pytest.raises(executors.UsageError, match="--nodes is for --executor slurm"):
        executors.make_executor("local", nodes=2)
    assert LocalExecutor(gpus=[]).launcher() == [sys.executable, "-m", "muonlab"]


def test_a_two_process_run_in_a_sweep_is_the_one_process_run(tmp_path, capsys):
    """`--device cpu --gpus-per-run 2`: the sweep launches the run on 2 gloo processes (torchrun), which gives
    the weights of the same configuration run in one process, bit for bit (two ranks split the global batch
    exactly: tests/train/test_distributed_train.py), and ends with no abort at teardown."""
    from muonlab.cli import main
    from muonlab.record.ledger import read_records

    runs = tmp_path / "cache" / "runs"  # MUONLAB_CACHE (conftest)
    assert main(["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--num-steps", "6",
                 "--gpus-per-run", "2", "--json"]) == 0
    (rec,) = read_records(runs / "ledger.jsonl")
    assert (rec["status"], rec["world_size"], rec["process_group"]) == ("ok", 2, "gloo")
    (config,) = (runs / "sweeps").glob("*/baseline-s1.json")
    assert ABORT not in config.with_suffix(".log").read_text()  # the ranks' output: the sweep ended 0 either way
    alone = run_muonlab(["train", "--config", str(config), "--run-name", "alone", "--json"],
                        dict(os.environ, OMP_NUM_THREADS="1"))
    assert alone.returncode == 0, alone.stderr[-3000:]
    import torch

    swept = torch.load(runs / rec["run_id"] / "model.pt", weights_only=True)
    single = torch.load(runs / "alone" / "model.pt", weights_only=True)
    assert swept.keys() == single.keys() and all(torch.equal(swept[k], single[k]) for k in swept)
    assert json.loads(alone.stdout)["summary"]["val_bpb"] == rec["metrics"]["val_bpb"]
