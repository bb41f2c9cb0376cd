"""The SLURM executor's options, checked in the batch script submitit would submit (rendered and
"submitted" here, with `sbatch` replaced by a print: no cluster, nothing submitted), and its
array task continuing its run after a requeue."""

import os
import sys

import pytest
import torch

import muonlab.train.run as run_module
from muonlab.cli import main
from muonlab.lab.executors import ArrayTask, SlurmExecutor
from muonlab.lab.sweep import plan_sweep
from muonlab.record.ledger import read_records
from muonlab.record.rundir import ledger_path, runs_dir


@pytest.fixture
def fake_sbatch(monkeypatch, tmp_path_factory):
    from submitit.slurm.slurm import SlurmExecutor as SubmititSlurm

    monkeypatch.setattr(SubmititSlurm, "affinity", classmethod(lambda cls: 2))  # no srun here
    monkeypatch.setattr(SubmititSlurm, "_make_submission_command",
                        lambda self, path: [sys.executable, "-c", "print('Submitted batch job 4242')"])
    # the executor asks for SLURM's tools on PATH before writing a job file: stand-ins that are never called
    tools = tmp_path_factory.mktemp("slurm-tools")
    for tool in ("sbatch", "srun"):
        (tools / tool).write_text("#!/bin/sh\nexit 99\n")
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")


def submit(tmp_path, options: dict, seeds=(1, 2, 3), **shape) -> tuple[list, list[str]]:
    jobs = plan_sweep(["baseline"], list(seeds), "cpu-tiny")
    handles = SlurmExecutor(options, **shape).submit(jobs, tmp_path)
    (script,) = (tmp_path / "submitit").glob("4242_submission.sh")
    return handles, script.read_text().splitlines()


def test_options_reach_the_batch_script(tmp_path, fake_sbatch):
    options = {"slurm_partition": "gpu", "timeout_min": 90, "gpus_per_node": 2, "slurm_array_parallelism": 2,
               "cpus_per_task": 8, "slurm_account": "lab"}
    handles, lines = submit(tmp_path, options)
    assert [h.job_id for h in handles] == ["4242_0", "4242_1", "4242_2"]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --account=lab", "#SBATCH --job-name=muonlab-sweep",
                 "#SBATCH --array=0-2%2",  # three runs, two at a time
                 "#SBATCH --requeue",  # a preempted task goes back in the queue...
                 "#SBATCH --signal=USR2@90"):  # ...and is warned first (submitit's handler requeues it)
        assert line in lines, (line, lines)
    assert any("-m submitit.core._submit" in line for line in lines)
    # each task gets its own run directory, named before submission, so a requeue finds it again
    tasks = [h.submission() for h in handles]
    dirs = [t.args[1] for t in tasks]
    assert all(isinstance(t.function, ArrayTask) for t in tasks) and len(set(dirs)) == 3
    assert [d.split("/")[-1].split("-")[:2] for d in dirs] == [["baseline", f"s{s}"] for s in (1, 2, 3)]


def test_defaults_and_requeue_off(tmp_path, fake_sbatch):
    _, lines = submit(tmp_path, {"requeue": False}, seeds=(1, 2))
    assert "#SBATCH --time=1440" in lines and "#SBATCH --gpus-per-node=1" in lines
    assert "#SBATCH --array=0-1%2" in lines and "#SBATCH --requeue" not in lines


@pytest.mark.parametrize("shape, wanted, unwanted", [
    ({"gpus_per_run": 4, "nodes": 2}, ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4"], []),
    ({"gpus_per_run": 2, "on_gpu": False}, ["--nodes=1", "--ntasks-per-node=2"], ["--gpus-per-node"]),  # gloo ranks
    ({"on_gpu": False}, ["--ntasks-per-node=1"], ["--gpus-per-node"]),  # a CPU run asks for no GPU
])
def test_gpus_per_run_and_nodes_shape_each_task(tmp_path, fake_sbatch, shape, wanted, unwanted):
    _, lines = submit(tmp_path, {}, seeds=(1,), **shape)
    for option in wanted:
        assert f"#SBATCH {option}" in lines, (option, lines)
    assert not [line for line in lines for option in unwanted if option in line], lines


@pytest.mark.parametrize("option", ["slurm_partiton=gpu", "partition=gpu", "requeue=maybe"])
def test_bad_option_is_a_usage_error_before_any_work(tmp_path, capsys, option):
    assert main(["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1", "--executor", "slurm",
                 "--slurm", option]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and option.split("=")[0] in err[0]
    assert not (tmp_path / "cache" / "runs").exists()


def test_requeued_task_continues_its_run(tmp_path, monkeypatch, one_thread):
    overrides = {"train.num_steps": 6, "record.checkpoint_every": 2, "record.quiet": True, "runtime.device": "cpu"}
    (job,) = plan_sweep(["baseline"], [1], "cpu-tiny", overrides)
    run_dir = runs_dir(job.config) / "task"
    args = (job.config.to_dict(), str(run_dir))
    real_save = run_module.save_checkpoint

    def preempted_after_first_checkpoint(run, step, *a, **kw):
        real_save(run, step, *a, **kw)
        raise SystemExit(-1)  # submitit's signal handler, having requeued the task, exits

    task = ArrayTask()
    with monkeypatch.context() as patch:
        patch.setattr(run_module, "save_checkpoint", preempted_after_first_checkpoint)
        with pytest.raises(SystemExit):
            task(*args)
    (rec,) = read_records(ledger_path(job.config))
    assert rec["status"] == "interrupted" and rec["checkpoint"].endswith("step-000002.pt")

    assert task.checkpoint(*args).result() == "ok"  # what submitit dumps for the requeued task, run
    _, resumed = read_records(ledger_path(job.config))
    assert resumed["run_dir"] == str(run_dir) and resumed["resumed_from_step"] == 2

    reference = tmp_path / "reference"
    assert main(["train", "--preset", "cpu-tiny", "--device", "cpu", "--seed", "1", "--num-steps", "6",
                 "--quiet", "--runs-dir", str(reference), "--run-name", "ref"]) == 0
    ref, final = (torch.load(d / "model.pt", weights_only=True) for d in (reference / "ref", run_dir))
    assert final.keys() == ref.keys() and all(torch.equal(final[k], ref[k]) for k in ref)
