"""Where sweep runs execute: local subprocesses or SLURM job arrays (through submitit).

Local: each run is a separate `python -m muonlab train --config FILE` process, so a crash or
an out-of-memory kills one run, not the sweep. With GPUs, one run per GPU at a time
(`CUDA_VISIBLE_DEVICES` set per run): throughput-sensitive runs never share a GPU; with
`gpus_per_run` N > 1 a run is `torchrun --standalone --nproc_per_node N` on N GPUs of its own,
and GPUs // N runs go at a time. On CPU, `parallel` runs at a time (default 1), each of N gloo
processes when N > 1. Either way the cores are split between the runs at a
time: each gets its share for torch's threads and for torch.compile's (inductor's) compile
workers, so N runs do not each compile on every core. Runs start in a session of their own:
a Ctrl-C at the terminal reaches the sweep alone, which forwards it once to each run.
SLURM: one job array, one task per run, through submitit (`cluster="local"` runs the same
array as local processes); a task requeued after a preemption continues its run. The batch
script the options make is tested as submitit renders it, without a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from muonlab.errors import UsageError
from muonlab.optional import require

EXECUTORS = ("local", "slurm")


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a SLURM or taskset allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LocalExecutor:
    def __init__(self, parallel: int | None = None, gpus: list[str] | None = None, gpus_per_run: int = 1):
        if gpus_per_run < 1:
            raise UsageError(f"--gpus-per-run must be >= 1, got {gpus_per_run}")
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel must be >= 1, got {parallel}")
        self.gpus = visible_gpus() if gpus is None else gpus
        self.per_run = gpus_per_run  # processes of one run (torchrun ranks when > 1)
        if self.gpus:
            if gpus_per_run > len(self.gpus):
                raise UsageError(f"--gpus-per-run {gpus_per_run} exceeds the {len(self.gpus)} visible GPU(s)")
            # disjoint groups of N GPUs: runs never share a GPU
            groups = [",".join(self.gpus[i:i + gpus_per_run])
                      for i in range(0, len(self.gpus) - gpus_per_run + 1, gpus_per_run)]
            if parallel is not None and parallel > len(groups):
                raise UsageError(f"--parallel {parallel}: {len(self.gpus)} visible GPU(s) hold {len(groups)} run(s) "
                                 f"of {gpus_per_run} GPU(s); runs never share a GPU")
            self.slots = groups[:parallel] if parallel else groups
        else:
            self.slots = [None] * (parallel or 1)

    def _env(self, slot: str | None) -> dict[str, str]:
        """The environment of a run in `slot` (a GPU id, or None on CPU): its GPU, and its share of
        the cores for torch's threads (OMP_NUM_THREADS, which torch reads at import) and inductor's
        compile workers (TORCHINDUCTOR_COMPILE_THREADS, read when torch._inductor.config is
        imported). Values the sweep's own environment sets are kept."""
        env = dict(os.environ)
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        threads = str(max(1, usable_cores() // (len(self.slots) * self.per_run)))
        env.setdefault("OMP_NUM_THREADS", threads)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", threads)
        return env

    def launcher(self) -> list[str]:
        """`python -m muonlab`, or torchrun of it on this run's N processes (a free port each:
        --standalone, so runs at a time never meet)."""
        if self.per_run == 1:
            return [sys.executable, "-m", "muonlab"]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(self.per_run),
                "-m", "muonlab"]

    def run(self, jobs, workdir: Path, log: Callable[[str], None]) -> None:
        queue = list(jobs)
        running: dict[int, tuple[subprocess.Popen, Any, Any]] = {}  # slot index -> (proc, job, logfile)
        try:
            while queue or running:
                for i, slot in enumerate(self.slots):
                    if i not in running and queue:
                        job = queue.pop(0)
                        logfile = open(workdir / f"{job.name}.log", "w")
                        cmd = self.launcher() + ["train"] + (
                            ["--resume", job.resume_dir] if job.resume_dir
                            else ["--config", str(workdir / f"{job.name}.json")])
                        # a session of its own: the terminal's Ctrl-C reaches the sweep only (stop_runs)
                        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logfile,
                                                stderr=subprocess.STDOUT, env=self._env(slot),
                                                start_new_session=True)
                        running[i] = (proc, job, logfile)
                        where = (f"GPU {slot}" if slot is not None else "CPU") + (
                            f" ({self.per_run} processes)" if self.per_run > 1 else "")
                        log(f"start {job.name} on {where} (log {logfile.name})")
                for i, (proc, job, logfile) in list(running.items()):
                    if proc.poll() is not None:
                        logfile.close()
                        del running[i]
                        log(f"done  {job.name}: exit {proc.returncode}")
                time.sleep(0.2)
        except KeyboardInterrupt:
            stop_runs([proc for proc, _job, _logfile in running.values()], log)
            for _proc, _job, logfile in running.values():
                logfile.close()
            raise


STOP_LIMIT_S = 60  # a run asked to stop finishes its step and checkpoints; after this it is killed


def stop_runs(procs: list[subprocess.Popen], log: Callable[[str], None]) -> None:
    """Stop interrupted runs so that each records itself as interrupted, with a checkpoint.

    Runs have sessions of their own, so the terminal's Ctrl-C reached the sweep alone: each live
    run gets it here, once. The first SIGINT asks a run to stop after its step and checkpoint; a
    second Ctrl-C while the sweep waits is forwarded once too (the run then stops at once, as one
    of its own would). A run still going after STOP_LIMIT_S is killed (its last periodic
    checkpoint still resumes it)."""
    live = [p for p in procs if p.poll() is None]
    if live:
        log(f"interrupted: asked {len(live)} run(s) to checkpoint and record themselves")
    _forward_sigint(live)
    deadline = time.time() + STOP_LIMIT_S
    while True:
        try:
            for proc in live:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            return
        except KeyboardInterrupt:  # Ctrl-C again: pass it on, keep waiting for the records
            _forward_sigint(live)


def _forward_sigint(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)


class ArrayTask:
    """One SLURM array task: one run, in a run directory named before submission.

    submitit calls it again after a requeue (a preemption, or the time limit with `checkpoint`
    below) with the same arguments: it then continues its run from the newest complete checkpoint
    instead of starting over. Runs on the compute node."""

    def __call__(self, config: dict, run_dir: str) -> str:
        import json

        from muonlab.config import RunConfig
        from muonlab.plugins import load_plugins
        from muonlab.train import run_training
        from muonlab.train.checkpoint import newest_complete_checkpoint
        from muonlab.train.run import resume_training

        path = Path(run_dir)
        summary = path / "summary.json"
        if summary.is_file() and json.loads(summary.read_text()).get("status") == "ok":
            return "ok"  # requeued after it finished
        if newest_complete_checkpoint(path) is not None:
            return resume_training(path).status
        if path.exists():  # requeued before its first checkpoint: a fresh attempt beside it
            path = path.with_name(f"{path.name}-{os.urandom(2).hex()}")
        self.run_dir = str(path)  # what `checkpoint` resubmits
        load_plugins(config.get("record", {}).get("plugins", ""))
        cfg = RunConfig.from_dict(config)
        cfg.record.runs_dir, cfg.record.run_name = str(path.parent), path.name
        return run_training(cfg).status

    def checkpoint(self, config: dict, run_dir: str):
        """submitit, on a preemption or the time limit: requeue this task, to continue its run."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, config, getattr(self, "run_dir", run_dir))


# The sweep's --slurm options are submitit's parameter names: its generic ones (timeout_min,
# gpus_per_node, cpus_per_task, mem_gb, nodes, tasks_per_node, name) and `slurm_<sbatch option>`
# (slurm_partition, slurm_array_parallelism, slurm_account, ...); and two of muonlab's: `cluster`
# (submitit's backend: slurm, or local/debug to run the array here) and `requeue` (default true:
# sbatch --requeue, so a preempted task is requeued and continues from its checkpoint).
SLURM_DEFAULTS = {"timeout_min": 24 * 60, "gpus_per_node": 1, "name": "muonlab-sweep"}


def slurm_parameters(options: dict[str, Any], n_tasks: int) -> tuple[str, dict[str, Any]]:
    """(cluster, submitit AutoExecutor parameters) for an array of `n_tasks` runs."""
    submitit = require("submitit", "the slurm executor")

    options = dict(options)
    cluster = options.pop("cluster", "slurm")
    requeue = options.pop("requeue", True)
    if not isinstance(requeue, bool):
        raise UsageError(f"--slurm requeue must be true or false, got {requeue!r}")
    generic, sbatch = set(submitit.AutoExecutor._typed_parameters()), submitit.SlurmExecutor._valid_parameters()
    for key in options:
        if key not in generic and not (key.startswith("slurm_") and key[len("slurm_"):] in sbatch):
            raise UsageError(f"unknown --slurm option {key!r}: use cluster, requeue, one of {', '.join(sorted(generic))}, "
                             "or slurm_<option> for an option of submitit's SlurmExecutor (e.g. slurm_partition)")
    if cluster != "slurm":  # run here (local/debug): the cluster's defaults do not apply, its options are ignored
        return cluster, options
    params = {**SLURM_DEFAULTS, "slurm_array_parallelism": n_tasks, **options}
    if requeue:
        params["slurm_additional_parameters"] = {"requeue": True, **params.get("slurm_additional_parameters", {})}
    return cluster, params


class SlurmExecutor:
    """submitit job arrays, one task per run (see `slurm_parameters` for the options)."""

    def __init__(self, slurm: dict[str, Any]):
        require("submitit", "the slurm executor")  # before any work
        self.options = dict(slurm)
        self.cluster, _ = slurm_parameters(self.options, 1)  # validate before any work

    def submit(self, jobs, workdir: Path) -> list:
        """Submit the array; its handles, one per job."""
        import submitit

        from muonlab.record.rundir import new_run_id, runs_dir

        cluster, params = slurm_parameters(self.options, len(jobs))
        executor = submitit.AutoExecutor(folder=workdir / "submitit", cluster=cluster)
        executor.update_parameters(**params)
        # each task's run directory is named now, so a requeued task finds its run again
        run_dirs = [job.resume_dir or str(runs_dir(job.config) / new_run_id(job.config)) for job in jobs]
        return executor.map_array(ArrayTask(), [job.config.to_dict() for job in jobs], run_dirs)

    def run(self, jobs, workdir: Path, log: Callable[[str], None]) -> None:
        handles = self.submit(jobs, workdir)
        log(f"submitted {len(handles)} task(s) as job array {handles[0].job_id.split('_')[0]} ({self.cluster})")
        for job, handle in zip(jobs, handles):
            try:
                status = handle.result()
                log(f"done  {job.name}: {status}")
            except Exception as exc:  # the run itself recorded its failure in the ledger
                log(f"done  {job.name}: failed ({str(exc).splitlines()[-1] if str(exc) else exc.__class__.__name__})")


def make_executor(name: str, parallel: int | None = None, slurm: dict[str, Any] | None = None,
                  gpus_per_run: int = 1):
    if name == "local":
        return LocalExecutor(parallel=parallel, gpus_per_run=gpus_per_run)
    if name == "slurm":
        if gpus_per_run != 1:
            raise UsageError("--gpus-per-run runs several processes per run with the local executor only, so far; "
                             "on SLURM give each task its GPUs with --slurm gpus_per_node=N")
        return SlurmExecutor(slurm or {})
    raise UsageError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")
