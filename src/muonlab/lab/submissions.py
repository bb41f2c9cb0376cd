"""What a sweep handed to a scheduler, and what the scheduler says of it now.

A SLURM sweep appends one line per task to `<ledger stem>.submitted.jsonl` beside its ledger as
soon as the array is accepted (arm, seed, config hash, job id, run directory). The ledger says how
a run ended; this file says that a run was handed over and where to look for it while it has not
ended, so a sweep started again never submits a duplicate of a queued or running run, and
`sweep --status` can say which runs are queued or running without the login process that
submitted them.

The scheduler's view is `squeue` (live jobs only: a job that left the queue has ended, and its
run's own ledger line says how).
"""

from __future__ import annotations

import getpass
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from muonlab.errors import MuonlabError
from muonlab.record.ledger import STAMP_FORMAT, append_line, finished_time, read_records_tolerant

# squeue's states of a job that still holds or waits for resources
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD",
                           "SUSPENDED", "RESIZING", "SPECIAL_EXIT"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"})
SQUEUE_TIMEOUT_S = 60


def submissions_path(ledger: Path) -> Path:
    return ledger.with_name(f"{ledger.stem}.submitted.jsonl")


@dataclass(frozen=True)
class Submission:
    arm: str
    seed: int
    config_hash: str
    job_id: str  # SLURM's array task id, e.g. "1234_5"
    run_dir: str
    submitted_at: float
    num_steps: int | None = None  # for the ETA of `sweep --status --ledger` (a time budget: None)

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.arm, self.seed, self.config_hash)


def record_submissions(ledger: Path, submissions: list[Submission]) -> None:
    path = submissions_path(ledger)
    for sub in submissions:
        append_line(path, dict(arm=sub.arm, seed=sub.seed, config_hash=sub.config_hash, job_id=sub.job_id,
                               run_dir=sub.run_dir, submitted_at=sub.submitted_at, num_steps=sub.num_steps,
                               submitted=time.strftime(STAMP_FORMAT, time.localtime(sub.submitted_at))),
                    what="the submission record")


def latest_submissions(ledger: Path, warn: Callable[[str], None] = lambda _: None) -> dict[tuple, Submission]:
    """The newest submission of each (arm, seed, config hash)."""
    path = submissions_path(ledger)
    records, problems = read_records_tolerant(path)
    for problem in problems:
        warn(f"warning: {path}: {problem}; skipped")
    latest: dict[tuple, Submission] = {}
    for rec in records:
        try:
            sub = Submission(rec["arm"], int(rec["seed"]), rec["config_hash"], str(rec["job_id"]), rec["run_dir"],
                             float(rec["submitted_at"]), rec.get("num_steps"))
        except (KeyError, TypeError, ValueError):
            warn(f"warning: {path}: line {rec.get('_line')}: not a submission; skipped")
            continue
        latest[sub.key] = sub
    return latest


def pending_submissions(submissions: dict[tuple, Submission], latest_records: dict[tuple, dict]
                        ) -> dict[tuple, Submission]:
    """Submissions that no ledger line has answered since (a requeued run records `interrupted`
    and runs again, so only a line written after the submission, other than interrupted, or the
    job leaving the queue, ends one)."""
    pending = {}
    for key, sub in submissions.items():
        rec = latest_records.get(key)
        if not answers(rec, sub) or rec.get("status") == "interrupted":
            pending[key] = sub
    return pending


def answers(rec: dict | None, sub: Submission) -> bool:
    """Whether ledger line `rec` was written after submission `sub` (its stamp has whole seconds)."""
    return rec is not None and record_time(rec) >= int(sub.submitted_at)


def record_time(rec: dict) -> float:
    """A ledger line's end as a Unix time, its UTC offset honoured (a compute node's time zone may
    not be the login node's); 0 without one."""
    stamp = finished_time(rec)
    return stamp.timestamp() if stamp is not None else 0.0


def live_jobs(job_ids: list[str]) -> dict[str, str]:
    """SLURM state of each given job id still in the queue (ids that left it are absent).

    Raises MuonlabError when squeue cannot answer: a sweep must not guess that a run it handed to
    SLURM has ended."""
    if not job_ids:
        return {}
    if shutil.which("squeue") is None:
        raise MuonlabError(f"{len(job_ids)} submitted run(s) may still be queued or running, and squeue is not on "
                           "PATH to ask SLURM: run this where SLURM's commands are")
    # every array task on its own line (-r); all of this user's jobs, since squeue refuses a list
    # holding an id it has forgotten
    cmd = ["squeue", "-r", "-h", "-o", "%i|%T", "-u", getpass.getuser()]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MuonlabError(f"squeue did not answer: {exc}") from exc
    if out.returncode != 0:
        raise MuonlabError(f"squeue failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}")
    wanted, states = set(job_ids), {}
    for line in out.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id in wanted:
            states[job_id] = state.strip()
    return states


def queue_state(state: str | None) -> str | None:
    """'queued' or 'running' for a live SLURM state, None for a job that left the queue."""
    if state is None:
        return None
    return "running" if state in RUNNING_STATES else "queued" if state in QUEUED_STATES else "running"


def progress(run_dir: str, num_steps: int | None) -> dict:
    """Step, loss and ETA of a running run, from its metrics.jsonl (the newest attempt's)."""
    base = Path(run_dir)
    # the task's attempts: its run directory and one per requeue without a checkpoint (executors.attempt_dirs)
    candidates = [base, *sorted(base.parent.glob(f"{base.name}-requeue*"))] if base.parent.is_dir() else [base]
    files = [p / "metrics.jsonl" for p in candidates if (p / "metrics.jsonl").is_file()]
    if not files:
        return {}
    path = max(files, key=lambda p: p.stat().st_mtime)
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    steps = []
    for ln in lines[-20:]:
        try:
            steps.append(json.loads(ln))
        except ValueError:  # the line being written
            continue
    if not steps:
        return {}
    last = steps[-1]
    out = {"step": int(last.get("step", -1)) + 1, "loss": last.get("smooth_loss", last.get("loss"))}
    dts = sorted(s["dt"] for s in steps if isinstance(s.get("dt"), (int, float)))
    if num_steps is not None:
        out["num_steps"] = num_steps
        if dts:
            out["eta_s"] = max(0, num_steps - out["step"]) * dts[len(dts) // 2]
    elif isinstance(last.get("progress"), (int, float)) and 0 < last["progress"] <= 1 and dts:
        done = sum(dts)
        out["eta_s"] = done / max(1e-9, steps[-1]["progress"] - steps[0]["progress"]) * (1 - last["progress"])
    return out
