"""`torchrun --nproc_per_node=2 -m muonlab train` on CPU (gloo) against the single-process run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.models import assert_trained
from support.torchrun import ended_cleanly, run_muonlab

from muonlab.cli import main

pytestmark = pytest.mark.spread  # each test a unit of work of its own (support.budget.work_unit)

ARGS = ["train", "--preset", "cpu-tiny", "--num-steps", "16", "--json"]
PEAK = 1e15  # what every device reports under the fixed_peak plug-in, so CPU runs have an MFU
FIXED_PEAK = ["--plugin", str(Path(__file__).parents[1] / "support" / "fixed_peak.py")]


def _run(tmp_path, argv, nproc=None):
    env = dict(os.environ, MUONLAB_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
               MUONLAB_TEST_PEAK_FLOPS=str(PEAK))
    return run_muonlab(argv, env, nproc)


def test_two_ranks_match_one_process(tmp_path):
    single = _run(tmp_path, ARGS + FIXED_PEAK + ["--run-name", "single"])
    assert single.returncode == 0, single.stderr
    # each rank tokenizing in a worker process of its own, as on a GPU node (data.encode_processes left to none
    # gives every rank of a 16-core node processes), not reading the small corpus's stored ids: the same batches
    tokenized = ["--encode-processes", "1", "--encoded-store-mb", "0"]
    double = ended_cleanly(_run(tmp_path, ARGS + FIXED_PEAK + ["--run-name", "double", *tokenized], nproc=2))
    s, d = json.loads(single.stdout), json.loads(double.stdout)  # only rank 0 prints
    # same global batch, same micro-batches (rank r takes batches r, r+W, ...): the same numbers.
    # The bound is 1e-4; with W=2 the gradient average is exact, so we see equality.
    assert abs(s["summary"]["val_bpb"] - d["summary"]["val_bpb"]) < 1e-4
    assert abs(s["summary"]["holdout_bpb"] - d["summary"]["holdout_bpb"]) < 1e-4
    runs = tmp_path / "cache" / "runs"
    ws = torch.load(runs / "single" / "model.pt", weights_only=True)
    wd = torch.load(runs / "double" / "model.pt", weights_only=True)
    assert all(torch.equal(ws[k], wd[k]) for k in ws)
    assert_trained(runs / "single")  # equal, and trained: a loop that never steps would be equal too
    records = [json.loads(line) for line in (runs / "ledger.jsonl").read_text().splitlines()]
    assert [r["world_size"] for r in records] == [1, 2]  # one ledger line per run, not per rank
    # MFU: the global batch's FLOPs over the peak of every device, per step and in the summary
    for out, name, world in ((s, "single", 1), (d, "double", 2)):
        m = out["metrics"]
        assert m["mfu_percent"] == pytest.approx(100 * m["flops_per_token"] * m["tokens_per_second"] / (PEAK * world))
        steps = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
        assert steps and all(r["mfu"] == pytest.approx(100 * m["flops_per_token"] * r["tok_per_sec"] / (PEAK * world))
                             for r in steps)


def test_a_two_rank_run_ends_cleanly(tmp_path):
    """Issue 46: rank 1 of a 2-process gloo run once aborted at exit ("terminate called without an active
    exception", -6). Each rank frees what holds a collective's work and leaves the group before the interpreter
    is torn down (train.distributed.shutdown) and leaves without finalization (exit_rank: its own test below).
    The shortest two-rank run ends 0 with no abort; so does every two-rank `muonlab train` of the suite, each
    checked for it (support.torchrun.ended_cleanly, or the ranks' log): five a run (this one, the ranks-match
    run above, tests/optim/test_af_muon_distributed.py's, tests/lab/test_sweep_slots.py's sweep run, the SLURM
    two-task run) and the one-rank group run below: the repeats that catch an abort at teardown."""
    done = ended_cleanly(_run(tmp_path, ["train", "--preset", "cpu-tiny", "--num-steps", "2", "--eval-tokens", "256",
                                         "--run-name", "teardown", "--json"], nproc=2))
    assert json.loads(done.stdout)["status"] == "ok"


def test_global_batch_must_split_over_ranks(tmp_path):
    done = _run(tmp_path, ARGS + ["--device-batch-size", "8"], nproc=2)  # 512 tokens = 8 rows: 1 rank only
    assert done.returncode != 0
    assert "not divisible by device_batch_size x sequence_len x world_size" in done.stderr


@pytest.mark.parametrize("preset", ["tied-cpu"])  # DistAFMuon (DistMuonAdamW's: tests/doctor/test_doctor_gpu.py)
def test_a_torchrun_world_of_one_takes_the_group_path(tmp_path, capsys, preset):
    """`torchrun --nproc_per_node 1` joins a process group (gloo here, NCCL on a GPU) and runs the
    N-rank code path (the distributed optimizer, gathered checkpoints) with the single process's
    numbers: the GPU acceptance check proves NCCL on one GPU this way."""
    argv = ["train", "--preset", preset, "--num-steps", "4", "--json"]
    assert main(argv + ["--run-name", "single"]) == 0  # the one-process run in this process (one thread here too)
    single = json.loads(capsys.readouterr().out)
    one = ended_cleanly(_run(tmp_path, argv + ["--run-name", "one"], nproc=1))
    runs = tmp_path / "cache" / "runs"
    records = {r["run_id"]: r for r in map(json.loads, (runs / "ledger.jsonl").read_text().splitlines())}
    assert records["single"]["process_group"] is None and records["one"]["process_group"] == "gloo"
    assert [records[n]["world_size"] for n in ("single", "one")] == [1, 1]
    ws = torch.load(runs / "single" / "model.pt", weights_only=True)
    wo = torch.load(runs / "one" / "model.pt", weights_only=True)
    assert ws.keys() == wo.keys() and all(torch.equal(ws[k], wo[k]) for k in ws)
    assert json.loads(one.stdout)["summary"]["val_bpb"] == single["summary"]["val_bpb"]


# An atexit handler says whether the interpreter was finalized; `muonlab arms` is a command that returns 0.
FINALIZED = ("import atexit, runpy\n"
             "atexit.register(lambda: print('finalized', flush=True))\n"
             "runpy.run_module('muonlab', run_name='__main__', alter_sys=True)\n")


def test_a_rank_ends_with_its_commands_status_and_output_without_finalization(tmp_path):
    """A rank (RANK and WORLD_SIZE set, as torchrun sets them) leaves through exit_rank: its output flushed, its
    exit status the command's, no finalization (where threads torn down inside C++ code abort); any other
    process exits as Python does."""
    def run(rank_env: dict, *argv) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | rank_env
        return subprocess.run([sys.executable, "-c", FINALIZED, *argv], env=env, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    rank = run({"RANK": "0", "WORLD_SIZE": "1"}, "arms")
    assert rank.returncode == 0 and "baseline" in rank.stdout and "finalized" not in rank.stdout, rank.stderr
    refused = run({"RANK": "0", "WORLD_SIZE": "1"}, "arms", "--no-such-option")
    assert refused.returncode == 2 and refused.stderr.startswith("error:") and "finalized" not in refused.stdout
    plain = run({}, "arms")
    assert plain.returncode == 0 and "baseline" in plain.stdout and plain.stdout.rstrip().endswith("finalized")
