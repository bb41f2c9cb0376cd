"""`muonlab sweep --status`: where each (arm, seed) of a sweep stands, without the process that
started it.

done, failed and interrupted come from the run's newest ledger line; queued and running from
SLURM's queue for a run submitted since (lab/submissions.py), running with its step, loss and
ETA from the run's metrics.jsonl; missing is a run no sweep has handed over or recorded. A run
whose job left the queue without writing a line (cancelled before it started, killed outright)
is interrupted: the next sweep runs it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from muonlab.errors import MuonlabError
from muonlab.lab.submissions import (answers, latest_submissions, live_jobs, pending_submissions, progress, queue_state,
                                     submissions_path)

STATES = ("missing", "queued", "running", "done", "failed", "interrupted")
LEDGER_STATES = {"ok": "done", "failed": "failed", "diverged": "failed", "interrupted": "interrupted"}


@dataclass
class RunState:
    arm: str
    seed: int
    config_hash: str
    state: str
    detail: str = ""
    job_id: str | None = None
    metrics: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.arm, self.seed, self.config_hash)


def eta_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def running_detail(run_dir: str, num_steps: int | None) -> str:
    now = progress(run_dir, num_steps)
    if not now:
        return "starting"
    parts = [f"step {now['step']}" + (f"/{now['num_steps']}" if "num_steps" in now else "")]
    if isinstance(now.get("loss"), (int, float)):
        parts.append(f"loss {now['loss']:.4f}")
    if "eta_s" in now:
        parts.append(f"ETA {eta_text(now['eta_s'])}")
    return ", ".join(parts)


def _ledger_detail(rec: dict) -> str:
    metrics = rec.get("metrics") or {}
    if rec.get("status") == "ok":
        for key in ("val_bpb", "val_ce"):
            if isinstance(metrics.get(key), (int, float)):
                return f"{key} {metrics[key]:.6f}"
        return ""
    if rec.get("status") == "interrupted":
        return "resumable from its checkpoint" if rec.get("resumable") else "no checkpoint: starts over"
    return str(rec.get("error") or rec.get("status")).splitlines()[0][:100]


def sweep_status(ledger: Path, latest: dict[tuple, dict], planned: list[tuple[str, int, str, int | None]] | None,
                 warn: Callable[[str], None] = lambda _: None) -> list[RunState]:
    """The state of each planned (arm, seed, config hash, num_steps), or of every run the ledger and
    its submission record know of when `planned` is None."""
    submitted = latest_submissions(ledger, warn)
    pending = pending_submissions(submitted, latest)
    live = live_jobs(sorted({sub.job_id for sub in pending.values()}))
    if planned is None:
        keys = sorted(set(latest) | set(submitted), key=lambda k: (str(k[0]), int(k[1] or 0), str(k[2])))
        planned = [(*key, submitted[key].num_steps if key in submitted else _num_steps(latest.get(key)))
                   for key in keys]
    states = []
    for arm, seed, config_hash, num_steps in planned:
        key = (arm, seed, config_hash)
        rec, sub = latest.get(key), pending.get(key)
        in_queue = queue_state(live.get(sub.job_id)) if sub is not None else None
        if in_queue == "queued":
            states.append(RunState(arm, seed, config_hash, "queued", f"job {sub.job_id} {live[sub.job_id].lower()}",
                                   sub.job_id))
        elif in_queue == "running":
            states.append(RunState(arm, seed, config_hash, "running", running_detail(sub.run_dir, num_steps),
                                   sub.job_id))
        elif sub is not None and not answers(rec, sub):
            states.append(RunState(arm, seed, config_hash, "interrupted",
                                   f"job {sub.job_id} left the queue without a ledger line", sub.job_id))
        elif rec is not None:
            states.append(RunState(arm, seed, config_hash, LEDGER_STATES.get(rec.get("status"), "failed"),
                                   _ledger_detail(rec), sub.job_id if sub else None, rec.get("metrics") or {}))
        else:
            states.append(RunState(arm, seed, config_hash, "missing", "not submitted or run"))
    return states


def unfinished_runs(ledger: Path, latest: dict[tuple, dict], warn: Callable[[str], None] = lambda _: None
                    ) -> list[dict]:
    """The runs a sweep submitted to SLURM that have no final ledger line yet (queued, running, or
    gone from the queue without one), for `report` and `paper` to say what is still out. Where
    squeue cannot answer (off the cluster) each is "submitted", with the reason."""
    if not submissions_path(ledger).is_file():
        return []
    pending = pending_submissions(latest_submissions(ledger, warn), latest)
    planned = [(*key, sub.num_steps) for key, sub in sorted(pending.items(), key=lambda kv: str(kv[0]))]
    try:
        states = sweep_status(ledger, latest, planned, warn)
    except MuonlabError as exc:  # squeue missing or failing: say so, do not guess
        return [dict(arm=k[0], seed=k[1], config_hash=k[2], state="submitted", job_id=sub.job_id,
                     detail=f"job {sub.job_id}; its state is unknown: {exc}") for k, sub in sorted(pending.items(),
                                                                                         key=lambda kv: str(kv[0]))]
    return [dict(arm=s.arm, seed=s.seed, config_hash=s.config_hash, state=s.state, job_id=s.job_id, detail=s.detail)
            for s in states if s.state in ("queued", "running", "interrupted")]


def unfinished_text(unfinished: list[dict]) -> str:
    """One line: what is still out, for a report or a scorecard."""
    return (f"still out ({len(unfinished)} submitted run(s) without a final record; muonlab sweep --status): "
            + "; ".join(f"{u['arm']}@{u['seed']} {u['state']}" + (f" ({u['detail']})" if u["detail"] else "")
                        for u in unfinished))


def _num_steps(rec: dict | None) -> int | None:
    steps = ((rec or {}).get("config") or {}).get("train", {}).get("num_steps")
    return steps if isinstance(steps, int) else None


def format_status(states: list[RunState]) -> str:
    several = len({(s.arm, s.seed) for s in states}) < len(states)  # one (arm, seed) under several configs
    head = f"{'arm':<20} {'seed':>5}  " + ("config    " if several else "") + f"{'state':<12} detail"
    lines = [head]
    for s in states:
        lines.append(f"{s.arm:<20} {s.seed:>5}  " + (f"{s.config_hash[:8]:<10}" if several else "")
                     + f"{s.state:<12} {s.detail}".rstrip())
    counts = {state: sum(s.state == state for s in states) for state in STATES}
    lines.append(f"{len(states)} run(s): " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    return "\n".join(lines)
