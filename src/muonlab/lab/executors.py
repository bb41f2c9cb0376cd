"""Where sweep runs execute: local subprocesses or SLURM job arrays (through submitit).

Local: each run is a separate `muonlab train --config FILE` process, so a crash or an
out-of-memory kills one run, not the sweep (a CPU run is forked from a server that imported torch
and muonlab once, muonlab.lab.warm_start; a GPU or torchrun run is `python -m muonlab`). With
GPUs, one run per GPU at a time (`CUDA_VISIBLE_DEVICES` set per run): throughput-sensitive runs never share a GPU; with
`gpus_per_run` N > 1 a run is `torchrun --standalone --nproc_per_node N` on N GPUs of its own,
and GPUs // N runs go at a time. On CPU, `parallel` runs at a time (default 1), each of N gloo
processes when N > 1. Either way the cores are split between the runs at a
time: each gets its share for torch's threads and for torch.compile's (inductor's) compile
workers, so N runs do not each compile on every core. Runs start in a session of their own:
a Ctrl-C at the terminal reaches the sweep alone, which forwards it once to each run.
SLURM: one job array, one task per run, through submitit (`cluster="local"` runs the same
array as local processes), each task recorded beside the ledger as it is submitted; a task
requeued after a preemption continues its run. Tested against a one-node SLURM on the test
machine (tests/slurm/local_slurm.sh) and, for the batch script, as submitit renders it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from muonlab.atomic import folder_undone_on_failure
from muonlab.errors import MuonlabError, UsageError
from muonlab.lab import warm_start
from muonlab.lab.run_exits import RunExits
from muonlab.optional import require

EXECUTORS = ("local", "slurm")
LIVE_LINE_S = 0.2  # how often a local sweep's live line is redrawn while its runs go


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
    def __init__(self, parallel: int | None = None, gpus: list[str] | None = None, gpus_per_run: int = 1,
                 warm_start: bool = True):
        if gpus_per_run < 1:
            raise UsageError(f"--gpus-per-run must be >= 1, got {gpus_per_run}")
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel must be >= 1, got {parallel}")
        self.gpus = visible_gpus() if gpus is None else gpus
        self.per_run = gpus_per_run  # processes of one run (torchrun ranks when > 1)
        self.warm_start = warm_start  # CPU runs fork from a server that imported torch once (lab/warm_start.py)
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

    def starts_warm(self, slot: str | None) -> bool:
        """A one-process run without a GPU forks from the warm server (muonlab.lab.warm_start)."""
        return self.warm_start and slot is None and self.per_run == 1 and warm_start.available()

    def _start(self, argv: list[str], slot: str | None, logfile):
        """Start one run, in a session of its own: the terminal's Ctrl-C reaches the sweep only (stop_runs)."""
        if self.starts_warm(slot):
            return warm_start.WarmRun(argv, self._env(slot), logfile.name)
        return subprocess.Popen(self.launcher() + argv, stdin=subprocess.DEVNULL, stdout=logfile,
                                stderr=subprocess.STDOUT, env=self._env(slot), start_new_session=True)

    def run(self, jobs, workdir: Path, log: Callable[[str], None]) -> None:
        from muonlab.lab.progress import SweepProgress
        from muonlab.record.rundir import runs_dir

        queue = list(jobs)
        running: dict[int, tuple[subprocess.Popen, Any, Any]] = {}  # slot index -> (proc, job, logfile)
        exits = RunExits()
        shown = SweepProgress(len(queue), len(self.slots), log)
        # where each run writes (named before it starts: run_sweep), for the live line
        where_of = {job.name: job.resume_dir or (str(runs_dir(job.config) / job.config.record.run_name)
                                                 if job.config.record.run_name else None) for job in queue}
        try:
            while queue or running:
                for i, slot in enumerate(self.slots):
                    if i not in running and queue:
                        job = queue.pop(0)
                        logfile = open(workdir / f"{job.name}.log", "w")
                        argv = ["train"] + (["--resume", job.resume_dir] if job.resume_dir
                                            else ["--config", str(workdir / f"{job.name}.json")])
                        proc = self._start(argv, slot, logfile)
                        exits.watch(proc)
                        running[i] = (proc, job, logfile)
                        where = (f"GPU {slot}" if slot is not None else "CPU") + (
                            f" ({self.per_run} processes)" if self.per_run > 1 else "")
                        shown.start(job.name, f"{where} (log {logfile.name})")
                exits.wait(LIVE_LINE_S)  # returns as soon as a run ends: its slot takes the next run at once
                for i, (proc, job, logfile) in list(running.items()):
                    if proc.poll() is not None:
                        exits.forget(proc)
                        logfile.close()
                        del running[i]
                        shown.done(job.name, proc.returncode)
                shown.live([(job.name, where_of[job.name], job.config.train.num_steps)
                            for _proc, job, _logfile in running.values() if where_of[job.name]])
        except KeyboardInterrupt:
            stop_runs([proc for proc, _job, _logfile in running.values()], log)
            for _proc, _job, logfile in running.values():
                logfile.close()
            raise
        finally:
            exits.close()


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


def attempt_dirs(run_dir: Path, restarts: int) -> list[Path]:
    """The run directories of a task's attempts so far, oldest first: its own, then one per
    requeue that found no checkpoint to continue (`<run>-requeue<k>`). Named from SLURM's restart
    count alone, so every rank of a task names the same one without asking the file system."""
    return [run_dir] + [run_dir.with_name(f"{run_dir.name}-requeue{k}") for k in range(1, restarts + 1)]


class ArrayTask:
    """One SLURM array task: one run, in a run directory named before submission.

    A task of several SLURM tasks (--gpus-per-run N, --nodes M) is one torch.distributed run: its
    ranks join from SLURM's environment (submitit's TorchDistributedEnvironment), rank 0 writes
    the record. SLURM starts the task again after a requeue (`scontrol requeue`, a preemption, or
    the signal before the time limit, which makes the run checkpoint and requeue itself): it then
    continues its run from the newest complete checkpoint instead of starting over. Runs on the
    compute node."""

    def __call__(self, config: dict, run_dir: str) -> str:
        import json

        import submitit.helpers

        from muonlab.config import RunConfig
        from muonlab.plugins import load_plugins
        from muonlab.train import run_training
        from muonlab.train.checkpoint import newest_complete_checkpoint
        from muonlab.train.run import resume_training

        job = _job_environment()
        if job is not None and job.num_tasks > 1:  # MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK: what init_from_env reads
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        attempts = attempt_dirs(Path(run_dir), int(os.environ.get("SLURM_RESTART_COUNT", "0")))
        try:
            for path in reversed(attempts):
                summary = path / "summary.json"
                if summary.is_file() and json.loads(summary.read_text()).get("status") == "ok":
                    return "ok"  # requeued after it finished
                if newest_complete_checkpoint(path) is not None:
                    return resume_training(path).status
            path = attempts[-1]  # no checkpoint yet: a fresh attempt (beside the earlier ones)
            load_plugins(config.get("record", {}).get("plugins", ""))
            cfg = RunConfig.from_dict(config)
            cfg.record.runs_dir, cfg.record.run_name = str(path.parent), path.name
            return run_training(cfg).status
        except KeyboardInterrupt as exc:  # the run recorded itself as interrupted
            if getattr(exc, "signal", None) == REQUEUE_SIGNAL.name:
                if job is not None and job.global_rank == 0:  # SLURM's advance notice: the run checkpointed; come back
                    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
                raise SystemExit(-1) from None  # no result: the job is not over
            raise

    def checkpoint(self, config: dict, run_dir: str):
        """submitit, on the requeue signal outside the training loop (data preparation, the final
        evaluation): requeue this task, to continue its run."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, config, run_dir)


def _job_environment():
    """submitit's description of the SLURM task this runs in, or None outside one."""
    import submitit

    try:
        return submitit.JobEnvironment()
    except RuntimeError:  # not started by submitit (a test calls the task directly)
        return None


# SLURM's advance notice of a time limit or preemption (sbatch --signal, submitit's signal_delay_s
# seconds before): the training loop stops after its step, checkpoints, and the task requeues itself
REQUEUE_SIGNAL = signal.SIGUSR2

# The sweep's --slurm options are submitit's parameter names: its generic ones (timeout_min,
# gpus_per_node, cpus_per_task, mem_gb, nodes, tasks_per_node, name) and `slurm_<sbatch option>`
# (slurm_partition, slurm_array_parallelism, slurm_account, ...); and two of muonlab's: `cluster`
# (submitit's backend: slurm, or local/debug to run the array here) and `requeue` (default true:
# sbatch --requeue, so a preempted task is requeued and continues from its checkpoint).
SLURM_DEFAULTS = {"timeout_min": 24 * 60, "name": "muonlab-sweep"}
# what --gpus-per-run and --nodes set: given there, not as --slurm options too
SHAPE_OPTIONS = ("gpus_per_node", "tasks_per_node", "nodes")


def slurm_parameters(options: dict[str, Any], n_tasks: int, gpus_per_run: int = 1, nodes: int = 1,
                     on_gpu: bool = True) -> tuple[str, dict[str, Any]]:
    """(cluster, submitit AutoExecutor parameters) for an array of `n_tasks` runs, each of
    `gpus_per_run` processes on each of `nodes` nodes (one GPU per process unless the runs are
    made for the CPU)."""
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
    shape = {"nodes": nodes, "tasks_per_node": gpus_per_run}
    if on_gpu:  # a CPU run asks for no GPU (no --gpus-per-node line: a cluster without GPUs refuses one)
        shape["gpus_per_node"] = gpus_per_run
    given = [key for key in SHAPE_OPTIONS if key in options and options[key] != shape.get(key)]
    if given and (gpus_per_run != 1 or nodes != 1):
        raise UsageError(f"--slurm {given[0]} and --gpus-per-run/--nodes both shape the runs: give --gpus-per-run N "
                         "(processes and GPUs per node) and --nodes M only")
    if cluster != "slurm":  # run here (local/debug): the cluster's defaults do not apply, its options are ignored
        return cluster, options
    params = {**SLURM_DEFAULTS, "slurm_array_parallelism": n_tasks, **shape, **options}
    if requeue:
        params["slurm_additional_parameters"] = {"requeue": True, **params.get("slurm_additional_parameters", {})}
    return cluster, params


@contextlib.contextmanager
def _stderr_aside():
    """File descriptor 2 into a temporary file for the block (a child's writes included), and sys.stderr
    with it (Python's writes, wherever sys.stderr points), then back."""
    import io  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as aside, contextlib.redirect_stderr(io.StringIO()):
        os.dup2(aside.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class SubmissionRefused(MuonlabError):
    """sbatch refused the array: no task was submitted (the sweep removes its job files)."""


class SlurmExecutor:
    """submitit job arrays, one task per run (see `slurm_parameters` for the options). Each
    submitted task is recorded beside the ledger at once (lab/submissions.py); `detach` returns
    then, leaving the array to SLURM."""

    def __init__(self, slurm: dict[str, Any], gpus_per_run: int = 1, nodes: int = 1, on_gpu: bool = True,
                 detach: bool = False):
        require("submitit", "the slurm executor")  # before any work
        if gpus_per_run < 1 or nodes < 1:
            raise UsageError(f"--gpus-per-run and --nodes must be >= 1, got {gpus_per_run} and {nodes}")
        self.options = dict(slurm)
        self.shape = dict(gpus_per_run=gpus_per_run, nodes=nodes, on_gpu=on_gpu)
        self.cluster, _ = slurm_parameters(self.options, 1, **self.shape)  # validate before any work
        if detach and self.cluster != "slurm":
            raise UsageError(f"--detach leaves the runs to SLURM; cluster={self.cluster} runs them in this process")
        missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]  # submitit calls both
        if self.cluster == "slurm" and missing:  # before a job file is written
            raise MuonlabError(f"SLURM's {missing[0]} is not on this machine's PATH: nothing was submitted (run where "
                               "SLURM is, or --executor local, or --slurm cluster=local to try the array here)")
        self.detach = detach

    def submit(self, jobs, workdir: Path, ledger: Path | None = None) -> list:
        """Submit the array and record each task beside `ledger`; its handles, one per job."""
        import submitit

        from muonlab.lab.submissions import Submission, record_submissions
        from muonlab.record.rundir import new_run_id, runs_dir

        cluster, params = slurm_parameters(self.options, len(jobs), **self.shape)
        # each task's run directory is named now, so a requeued task finds its run again
        run_dirs = [job.resume_dir or str(runs_dir(job.config) / new_run_id(job.config)) for job in jobs]
        try:
            # sbatch writes its complaints to our stderr: kept aside, the error is one line
            with folder_undone_on_failure(workdir / "submitit"), _stderr_aside():
                executor = submitit.AutoExecutor(folder=workdir / "submitit", cluster=cluster)
                executor.update_parameters(**params)
                handles = executor.map_array(ArrayTask(), [job.config.to_dict() for job in jobs], run_dirs)
        except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as exc:
            last = [line for line in str(exc).splitlines() if line.strip()] or [exc.__class__.__name__]
            raise SubmissionRefused(f"SLURM refused the array, nothing was submitted: {last[-1].strip()}") from None
        if ledger is not None and cluster == "slurm":
            now = time.time()
            record_submissions(ledger, [Submission(job.arm, job.seed, job.config_hash, str(handle.job_id), run_dir, now,
                                                   job.config.train.num_steps)
                                        for job, handle, run_dir in zip(jobs, handles, run_dirs)])
        return handles

    def run(self, jobs, workdir: Path, log: Callable[[str], None], ledger: Path | None = None) -> None:
        handles = self.submit(jobs, workdir, ledger)
        array = handles[0].job_id.split("_")[0]
        log(f"submitted {len(handles)} task(s) as job array {array} ({self.cluster})")
        if self.detach:
            log(f"detached: job array {array} runs on; `muonlab sweep` with the same arguments and --status "
                f"(or --status --ledger {ledger}) says where it stands")
            return
        try:
            if self.cluster == "slurm":
                self._wait_in_queue(jobs, [str(h.job_id) for h in handles], log)
            else:  # submitit's local/debug backends: their handles know when a task ends
                for job, handle in zip(jobs, handles):
                    try:
                        log(f"done  {job.name}: {handle.result()}")
                    except Exception as exc:  # the run itself recorded its failure in the ledger
                        log(f"done  {job.name}: failed ({str(exc).splitlines()[-1] if str(exc) else exc})")
        except KeyboardInterrupt:
            if self.cluster == "slurm":
                log(f"stopped waiting: job array {array} runs on (cancel it with scancel {array}); "
                    "--status says where it stands")
            raise

    def _wait_in_queue(self, jobs, job_ids: list[str], log: Callable[[str], None]) -> None:
        """Until every task left SLURM's queue (each run writes its own ledger line; squeue, not
        sacct, which a cluster without accounting lacks)."""
        from muonlab.lab.submissions import live_jobs

        waiting = dict(zip(job_ids, jobs))
        while waiting:
            time.sleep(QUEUE_POLL_S)
            live = live_jobs(list(waiting))
            for job_id in [j for j in waiting if j not in live]:
                log(f"done  {waiting.pop(job_id).name} (job {job_id} left the queue)")


QUEUE_POLL_S = 2.0  # how often a waiting sweep asks squeue


def make_executor(name: str, parallel: int | None = None, slurm: dict[str, Any] | None = None,
                  gpus_per_run: int = 1, nodes: int = 1, on_gpu: bool = True, detach: bool = False):
    if name == "local":
        if nodes != 1:
            raise UsageError("--nodes is for --executor slurm: a local sweep runs on this machine")
        if detach:
            raise UsageError("--detach is for --executor slurm: a local sweep's runs end with it")
        if slurm:
            raise UsageError("--slurm options are for --executor slurm")
        return LocalExecutor(parallel=parallel, gpus_per_run=gpus_per_run)
    if name == "slurm":
        if parallel is not None:
            raise UsageError("--parallel is for the local executor; on SLURM: --slurm slurm_array_parallelism=N")
        return SlurmExecutor(slurm or {}, gpus_per_run=gpus_per_run, nodes=nodes, on_gpu=on_gpu, detach=detach)
    raise UsageError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")
