"""Where sweep runs execute: local subprocesses or SLURM job arrays (through submitit).

Local: each run is a separate `python -m muonlab train --config FILE` process, so a crash or
an out-of-memory kills one run, not the sweep. With GPUs, one run per GPU at a time
(`CUDA_VISIBLE_DEVICES` set per run): throughput-sensitive runs never share a GPU. On CPU,
`parallel` runs at a time (default 1), the cores split between them.
SLURM: one job array, one task per run, through submitit (`cluster="local"` runs the same
array as local processes, which is how it is tested).
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

EXECUTORS = ("local", "slurm")


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class LocalExecutor:
    def __init__(self, parallel: int | None = None, gpus: list[str] | None = None):
        self.gpus = visible_gpus() if gpus is None else gpus
        if self.gpus:
            if parallel is not None and parallel > len(self.gpus):
                raise UsageError(f"--parallel {parallel} exceeds the {len(self.gpus)} visible GPU(s): "
                                 "runs never share a GPU")
            self.slots = list(self.gpus[:parallel] if parallel else self.gpus)
        else:
            if parallel is not None and parallel < 1:
                raise UsageError(f"--parallel must be >= 1, got {parallel}")
            self.slots = [None] * (parallel or 1)

    def _env(self, slot: str | None) -> dict[str, str]:
        env = dict(os.environ)
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        else:
            threads = max(1, (os.cpu_count() or 1) // len(self.slots))
            env.setdefault("OMP_NUM_THREADS", str(threads))
        return env

    def run(self, jobs, workdir: Path, log: Callable[[str], None]) -> None:
        queue = list(jobs)
        running: dict[int, tuple[subprocess.Popen, Any, Any]] = {}  # slot index -> (proc, job, logfile)
        try:
            while queue or running:
                for i, slot in enumerate(self.slots):
                    if i not in running and queue:
                        job = queue.pop(0)
                        logfile = open(workdir / f"{job.name}.log", "w")
                        cmd = [sys.executable, "-m", "muonlab", "train"] + (
                            ["--resume", job.resume_dir] if job.resume_dir
                            else ["--config", str(workdir / f"{job.name}.json")])
                        proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=self._env(slot))
                        running[i] = (proc, job, logfile)
                        where = f"GPU {slot}" if slot is not None else "CPU"
                        log(f"start {job.name} on {where} (log {logfile.name})")
                for i, (proc, job, logfile) in list(running.items()):
                    if proc.poll() is not None:
                        logfile.close()
                        del running[i]
                        log(f"done  {job.name}: exit {proc.returncode}")
                time.sleep(0.2)
        except KeyboardInterrupt:
            # children record themselves as interrupted; give them time to write their ledger line
            for proc, job, logfile in running.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            deadline = time.time() + 60
            for proc, job, logfile in running.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                logfile.close()
            raise


def _run_config(config: dict, resume_dir: str | None = None) -> str:
    """Body of one SLURM array task (runs on the compute node)."""
    from muonlab.config import RunConfig
    from muonlab.train import run_training
    from muonlab.train.run import resume_training

    from muonlab.plugins import load_plugins

    if resume_dir:
        return resume_training(resume_dir).status
    load_plugins(config.get("record", {}).get("plugins", ""))
    return run_training(RunConfig.from_dict(config)).status


class SlurmExecutor:
    """submitit job arrays. `slurm` options: any submitit parameter (e.g. `slurm_partition`,
    `timeout_min`, `gpus_per_node`, `slurm_array_parallelism`); `cluster` picks submitit's
    backend ("slurm", or "local"/"debug" for testing without a cluster)."""

    def __init__(self, slurm: dict[str, Any]):
        try:
            import submitit  # noqa: F401
        except ImportError as exc:  # pragma: no cover - submitit is a pinned dependency
            raise UsageError("the slurm executor needs the `submitit` package") from exc
        self.options = dict(slurm)
        self.cluster = self.options.pop("cluster", "slurm")

    def run(self, jobs, workdir: Path, log: Callable[[str], None]) -> None:
        import submitit

        executor = submitit.AutoExecutor(folder=workdir / "submitit", cluster=self.cluster)
        params = {"timeout_min": 24 * 60, "gpus_per_node": 1, "slurm_array_parallelism": len(jobs)}
        params.update(self.options)
        if self.cluster != "slurm":
            params = {k: v for k, v in params.items() if not k.startswith("slurm_") and k != "gpus_per_node"}
        executor.update_parameters(**params)
        handles = executor.map_array(_run_config, [job.config.to_dict() for job in jobs],
                                     [job.resume_dir for job in jobs])
        log(f"submitted {len(handles)} task(s) as job array {handles[0].job_id.split('_')[0]} ({self.cluster})")
        for job, handle in zip(jobs, handles):
            try:
                status = handle.result()
                log(f"done  {job.name}: {status}")
            except Exception as exc:  # the run itself recorded its failure in the ledger
                log(f"done  {job.name}: failed ({str(exc).splitlines()[-1] if str(exc) else exc.__class__.__name__})")


def make_executor(name: str, parallel: int | None = None, slurm: dict[str, Any] | None = None):
    if name == "local":
        return LocalExecutor(parallel=parallel)
    if name == "slurm":
        return SlurmExecutor(slurm or {})
    raise UsageError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")
