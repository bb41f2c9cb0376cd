"""Sweeps: arms x seeds under one protocol, resumable from the ledger.

A job is identified by (arm, seed, config hash). Before running, the ledger is read: a job
whose latest record is `ok` is skipped; one that `failed` or `diverged` is skipped too unless
`retry_failed` is set (its failure stays on record); one that was `interrupted` (Ctrl-C,
SIGTERM, preemption) is run again, continued from its checkpoint when it has one. Every run
writes exactly one ledger line itself, so an interrupted sweep leaves a consistent ledger.
A job handed to SLURM that is still queued or running (lab/submissions.py) is never submitted
again: it is skipped as queued or running.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from muonlab.arms import resolve_config
from muonlab.config import RunConfig
from muonlab.errors import UsageError
from muonlab.record.ledger import check_writable, read_records_tolerant
from muonlab.record.rundir import read_posthoc, check_runs_folder, ledger_path, new_run_id, runs_dir
from muonlab.settings import comma_items


@dataclass
class SweepJob:
    arm: str
    seed: int
    config: RunConfig
    resume_dir: str | None = None  # an interrupted run with a checkpoint: continue it

    @property
    def config_hash(self) -> str:
        return self.config.config_hash()

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.arm, self.seed, self.config_hash)

    @property
    def name(self) -> str:
        return f"{self.arm}-s{self.seed}"


@dataclass
class SweepOutcome:
    job: SweepJob
    action: str  # "ran", "submitted", "skipped-ok", "skipped-failed", "skipped-queued", "skipped-running"
    status: str | None = None  # ledger status after the sweep
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why a run that ran did not end ok (its ledger line's error, else where its log is)


def parse_seeds(text: str) -> list[int]:
    items = comma_items(text, "--seeds", empty_ok=False)
    try:
        seeds = [int(s) for s in items]
    except ValueError as exc:
        raise UsageError(f"seeds must be comma-separated integers, got {text!r}") from exc
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds must be a list without repeats, got {text!r}")
    if min(seeds) < 0:
        raise UsageError(f"seeds must be >= 0, got {min(seeds)}")
    return seeds


# the seeds of a sweep: the same for every arm, or each arm's own (`paper run`: the seeds the paper ran per arm)
Seeds = Sequence[int] | Mapping[str, Sequence[int]]


def seeds_of(seeds: Seeds, arm: str) -> Sequence[int]:
    return seeds[arm] if isinstance(seeds, Mapping) else seeds


def plan_sweep(arms: list[str], seeds: Seeds, preset_name: str, overrides: dict[str, Any] | None = None,
               arm_overrides: Mapping[str, dict[str, Any]] | None = None) -> list[SweepJob]:
    """The sweep's jobs; `arm_overrides` adds settings of each arm's own (a paper table's miniature) on top of
    `overrides`."""
    if not arms or len(set(arms)) != len(arms):
        raise UsageError("arms must be a non-empty list without repeats")
    jobs = []
    for arm in arms:
        for seed in seeds_of(seeds, arm):
            own = (arm_overrides or {}).get(arm, {})
            cfg = resolve_config(arm, preset_name, {**(overrides or {}), **own, "seed": seed})
            jobs.append(SweepJob(arm, seed, cfg))
    # one ledger and one runs directory for the whole sweep
    if len({str(ledger_path(j.config)) for j in jobs}) != 1:
        raise UsageError("all runs of a sweep must share one ledger")
    return jobs


def latest_records(ledger: Path, warn: Callable[[str], None]) -> dict[tuple, dict]:
    """The latest ledger record of each (arm, seed, config hash)."""
    records, problems = read_records_tolerant(ledger)
    for problem in problems:
        warn(f"warning: {ledger}: {problem}; skipped")
    latest: dict[tuple, dict] = {}
    for rec in records:
        latest[(rec.get("arm"), rec.get("seed"), rec.get("config_hash"))] = rec
    return latest


def select(jobs: list[SweepJob], latest: dict[tuple, dict], retry_failed: bool,
           in_queue: dict[tuple, str] | None = None):
    """Split jobs into (to run, skipped outcomes); `in_queue` maps a job's key to "queued" or
    "running" while SLURM holds a submission of it."""
    to_run, skipped = [], []
    for job in jobs:
        rec = latest.get(job.key)
        if (in_queue or {}).get(job.key):
            skipped.append(SweepOutcome(job, f"skipped-{in_queue[job.key]}", in_queue[job.key]))
        elif rec is None:
            to_run.append(job)
        elif rec.get("status") == "interrupted" or rec.get("interrupted"):  # the flag: older ledgers
            if rec.get("resumable") and rec.get("run_dir") and Path(rec["run_dir"]).is_dir():
                job.resume_dir = rec["run_dir"]
            to_run.append(job)
        elif rec.get("status") == "ok":
            skipped.append(SweepOutcome(job, "skipped-ok", "ok", rec.get("metrics", {})))
        elif retry_failed:
            to_run.append(job)
        else:
            skipped.append(SweepOutcome(job, "skipped-failed", rec.get("status"), rec.get("metrics", {}),
                                        f"{rec.get('error') or 'failed'} (an earlier run; --retry-failed runs it again)"))
    return to_run, skipped


def lacks_evaluations(job: SweepJob, rec: dict) -> str | None:
    """What a done run lacks of the periodic evaluations its sweep asks for (--eval-every is not part of a run's
    identity, so the run counts as done), and how to get them; None where it has them."""
    every = job.config.train.eval_every
    steps = (rec.get("metrics") or {}).get("steps")
    if every <= 0 or not isinstance(steps, int):
        return None
    have = {e.get("step") for e in rec.get("evals") or [] if isinstance(e, dict)}
    run_dir = rec.get("run_dir")
    if run_dir and Path(run_dir).is_dir():
        have |= {e["step"] for e in read_posthoc(Path(run_dir))}
    wanted = set(range(every, steps, every))
    if wanted <= have:
        return None
    return (f"without the evaluations every {every} steps asked for: `muonlab eval {run_dir or rec.get('run_id')} "
            f"--every {every}` scores its kept checkpoints")


def sweep_dir(jobs: list[SweepJob]) -> Path:
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    path = runs_dir(jobs[0].config) / "sweeps" / stamp
    path.mkdir(parents=True)
    return path


def in_queue(ledger: Path, latest: dict[tuple, dict], log: Callable[[str], None]) -> dict[tuple, str]:
    """"queued" or "running" for each job SLURM still holds a submission of (none without a
    submission record: squeue is asked only when there is something to ask)."""
    from muonlab.lab.submissions import latest_submissions, live_jobs, pending_submissions, queue_state

    pending = pending_submissions(latest_submissions(ledger, log), latest)
    live = live_jobs(sorted({sub.job_id for sub in pending.values()}))
    return {key: queue_state(live[sub.job_id]) for key, sub in pending.items() if sub.job_id in live}


def run_sweep(arms: list[str], seeds: Seeds, preset_name: str, overrides: dict[str, Any] | None = None,
              executor: str = "local", parallel: int | None = None, retry_failed: bool = False,
              slurm: dict[str, Any] | None = None, log: Callable[[str], None] = print,
              gpus_per_run: int = 1, nodes: int = 1, detach: bool = False,
              arm_overrides: Mapping[str, dict[str, Any]] | None = None) -> list[SweepOutcome]:
    from muonlab.lab.executors import SubmissionRefused, make_executor

    jobs = plan_sweep(arms, seeds, preset_name, overrides, arm_overrides)
    ledger = ledger_path(jobs[0].config)
    on_gpu = any(job.config.runtime.device != "cpu" for job in jobs)  # CPU runs ask SLURM for no GPU
    runner = make_executor(executor, parallel=parallel, slurm=slurm or {}, gpus_per_run=gpus_per_run, nodes=nodes,
                           on_gpu=on_gpu, detach=detach)  # validate first
    if executor == "local":  # runs here: a GPU preset on a machine without one is refused before any run
        from muonlab.train.run import training_device

        for job in jobs:
            training_device(job.config)
    latest = latest_records(ledger, log)
    to_run, skipped = select(jobs, latest, retry_failed, in_queue(ledger, latest, log))
    for job in to_run:
        if job.resume_dir:
            log(f"resume {job.name}: interrupted run {Path(job.resume_dir).name} has a checkpoint")
    for outcome in skipped:
        if outcome.action in ("skipped-queued", "skipped-running"):
            log(f"skip {outcome.job.name}: {outcome.status} on SLURM (muonlab sweep --status)")
            continue
        lacking = lacks_evaluations(outcome.job, latest.get(outcome.job.key, {})) if outcome.status == "ok" else None
        log(f"skip {outcome.job.name}: already {outcome.status} in {ledger}"
            + ("" if outcome.status == "ok" else " (use --retry-failed to run it again)")
            + (f"; {lacking}" if lacking else ""))
    if to_run:
        check_writable(ledger)  # as each run checks them, once, before a job file is written
        check_runs_folder(jobs[0].config)
        log(f"sweep: {len(to_run)} run(s) to do, {len(skipped)} skipped; executor {executor}; ledger {ledger}")
        workdir = sweep_dir(to_run)
        try:
            for job in to_run:
                if not job.resume_dir and not job.config.record.run_name:  # named now: progress reads its metrics
                    job.config.record.run_name = new_run_id(job.config)
                (workdir / f"{job.name}.json").write_text(json.dumps({"config": job.config.to_dict()}, indent=2))
            if executor == "slurm":
                runner.run(to_run, workdir, log, ledger=ledger)
            else:
                runner.run(to_run, workdir, log)
        except SubmissionRefused:  # nothing went out: the sweep's job files go too
            shutil.rmtree(workdir, ignore_errors=True)
            raise
    latest = latest_records(ledger, lambda _: None)
    ran = []
    for job in to_run:
        if detach:  # handed to SLURM: `sweep --status` follows it
            ran.append(SweepOutcome(job, "submitted", "queued"))
            continue
        rec = latest.get(job.key, {})
        status = rec.get("status", "missing")
        error = None if status == "ok" else (rec.get("error") or f"no ledger line: its log is {workdir / job.name}.log")
        ran.append(SweepOutcome(job, "ran", status, rec.get("metrics", {}), error))
    order = {job.key: i for i, job in enumerate(jobs)}
    return sorted(skipped + ran, key=lambda o: order[o.job.key])


def dry_run(arms: list[str], seeds: Seeds, preset_name: str, overrides: dict[str, Any] | None = None,
            retry_failed: bool = False, log: Callable[[str], None] = print,
            arm_overrides: Mapping[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What `run_sweep` would do, run by run, without running, submitting or writing anything:
    each (arm, seed) with its config hash, protocol id, the arm's overrides and the action."""
    from muonlab.arms import get_arm

    jobs = plan_sweep(arms, seeds, preset_name, overrides, arm_overrides)
    ledger = ledger_path(jobs[0].config)
    latest = latest_records(ledger, log)
    to_run, skipped = select(jobs, latest, retry_failed, in_queue(ledger, latest, log))
    lacking = {o.job.key: lacks_evaluations(o.job, latest.get(o.job.key, {})) for o in skipped if o.action == "skipped-ok"}
    actions = {o.job.key: {"skipped-ok": "done (ok)" + (f"; {lacking[o.job.key]}" if lacking.get(o.job.key) else ""),
                           "skipped-failed": f"skip ({o.status}; --retry-failed runs it)",
                           "skipped-queued": "skip (queued on SLURM)", "skipped-running": "skip (running on SLURM)"
                           }[o.action] for o in skipped}
    actions.update({j.key: f"resume {Path(j.resume_dir).name}" if j.resume_dir else "run" for j in to_run})
    return [dict(arm=j.arm, seed=j.seed, config_hash=j.config_hash, protocol=j.config.protocol_id(),
                 action=actions[j.key], overrides=get_arm(j.arm).overrides, ledger=str(ledger)) for j in jobs]


def format_dry_run(plan: list[dict[str, Any]]) -> str:
    lines = [f"{'arm':<20} {'seed':>5}  {'config hash':<16}  {'protocol':<16}  action",
             *(f"{p['arm']:<20} {p['seed']:>5}  {p['config_hash']:<16}  {str(p['protocol']):<16}  {p['action']}"
               for p in plan)]
    arms = dict.fromkeys(p["arm"] for p in plan)
    lines += ["", "arms:"] + [f"  {arm}: " + (", ".join(f"{k}={v!r}" for k, v in
                                                          next(p for p in plan if p["arm"] == arm)["overrides"].items())
                                              or "the baseline, no overrides") for arm in arms]
    todo = sum(p["action"] == "run" or p["action"].startswith("resume") for p in plan)
    lines.append(f"\n{todo} of {len(plan)} run(s) to do; ledger {plan[0]['ledger']} (dry run: nothing was run)")
    return "\n".join(lines)


def format_outcomes(outcomes: list[SweepOutcome]) -> str:
    # bits per byte where the runs have it, else seed 004's validation loss
    bpb = any("val_bpb" in o.metrics for o in outcomes) or not any("val_ce" in o.metrics for o in outcomes)
    val_key, hold_key = ("val_bpb", "holdout_bpb") if bpb else ("val_ce", "holdout_ce")
    lines = [f"{'arm':<20} {'seed':>5}  {'action':<16} {'status':<11} {val_key:>9} {hold_key:>11}"]
    for o in outcomes:
        val, hold = o.metrics.get(val_key), o.metrics.get(hold_key)
        val_text = "-" if val is None else f"{val:.6f}"
        hold_text = "-" if hold is None else f"{hold:.6f}"
        lines.append(f"{o.job.arm:<20} {o.job.seed:>5}  {o.action:<16} {str(o.status):<11} "
                     f"{val_text:>9} {hold_text:>11}")
    return "\n".join(lines)
