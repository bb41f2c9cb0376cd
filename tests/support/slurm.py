"""A real one-node SLURM for the tests (tests/slurm/local_slurm.sh starts it, installing Debian's
slurm-wlm and munge where it may), and small helpers to watch its queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "local_slurm.sh"
CANNOT_RUN_HERE = 3  # the script's exit status where SLURM cannot run (the reason on stderr)


def start_local_slurm() -> dict[str, str]:
    """The environment variables a SLURM client needs (SLURM_CONF), after starting the daemons; skips
    the test with the script's reason where they cannot start."""
    if sys.platform != "linux":
        pytest.skip("the local SLURM runs on Linux only")
    try:
        out = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("the local SLURM did not start within 600 s")
    if out.returncode == CANNOT_RUN_HERE:
        pytest.skip(out.stderr.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
    version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, env={**os.environ, **env})
    env["_version"] = version.stdout.strip()
    return env


def squeue(job_id: str) -> str | None:
    """The job's state while it is in the queue, else None."""
    out = subprocess.run(["squeue", "-r", "-h", "-o", "%i|%T|%r"], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        jid, state, _reason = line.split("|")
        if jid == job_id:
            return state
    return None


def wait_for(what: str, predicate, timeout_s: float = 300, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# A requeue revokes the job's launch credential on the node, and slurmd refuses a credential made in
# the second of the revocation or before: a requeued job released at once can be started within
# that second and killed ("Killing non-startable batch JobId=N: Job credential revoked" in
# slurmctld.log, seen with a task that requeued itself on SIGUSR2 and was released 0.27 s later).
REQUEUE_SETTLE_S = 2.0


def release(job_id: str) -> None:
    """A requeued job waits for a begin time SLURM sets minutes ahead: let it start now, once its
    revoked credential can no longer be confused with the new one."""
    wait_for(f"job {job_id} back in the queue", lambda: squeue(job_id) == "PENDING")
    time.sleep(REQUEUE_SETTLE_S)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, capture_output=True)


def steps_done(run_dir: Path) -> int:
    """Steps the run has finished, from its metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1])["step"] + 1 if lines else 0
    except ValueError:
        return 0


def job_pids(job_id: str) -> list[int]:
    """The job's processes on this node (every step's, the batch script's included)."""
    out = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, check=True)
    return [int(line.split()[0]) for line in out.stdout.splitlines()[1:] if line.split() and line.split()[0] != "-1"]


def hold_past(job_id: str, run_dir: Path, step: int) -> list[int]:
    """Stop the job's processes (SIGSTOP) as soon as its run has finished `step` steps, and return them: held
    there, the run cannot end before the signal a scenario sends it, however loaded the machine (a length of
    run chosen to outlast the signal's way through SLURM was a guess of wall time). SLURM's own stop (requeue,
    scancel) sends SIGCONT ahead of its SIGTERM; a signal the scenario sends with `scancel --signal` is held
    pending until `go_on_once_pending`."""
    wait_for(f"the run to pass step {step}", lambda: steps_done(run_dir) >= step, every_s=0.02)
    pids = job_pids(job_id)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def _pending(pid: int) -> int:
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return 0
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def go_on_once_pending(pids: list[int], signum: int) -> None:
    """Let the held processes go on (SIGCONT) once the signal sent them through SLURM is pending in one of
    them: it is handled when they run again, before their next step ends."""
    wait_for(f"signal {signum} to reach the held run", lambda: any(_pending(p) >> (signum - 1) & 1 for p in pids),
             every_s=0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
