"""`muonlab sweep`: arms x seeds under one preset (or an experiment file's study), resumable from the
ledger, locally or on SLURM; --dry-run lists what it would do, --status where each run stands."""

from __future__ import annotations

from muonlab.cli.config_flags import collect_overrides
from muonlab.cli.parser import _emit, _log_for, refuse_a_ledger_folder
from muonlab.cli.run_flags import add_run_flags, parse_slurm_options
from muonlab.errors import MuonlabError, UsageError

HELP = "run arms x seeds under one preset, resumable from the ledger"


def add_arguments(p, context) -> None:
    p.add_argument("--arms", default=None, help="comma-separated arm names")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds, e.g. 41,42,47 (default: the seeds the arms' paper used)")
    add_run_flags(p)
    p.add_argument("--status", action="store_true",
                   help="print where each (arm, seed) of the sweep stands (the same arguments, or --ledger): "
                        "missing, queued, running (step, loss, ETA), done, failed or interrupted")
    p.add_argument("--experiment", default=None, metavar="FILE",
                   help="run the study a TOML file describes (its preset, seeds, arms, plug-ins and settings; "
                        "see docs/experiments.md) instead of --arms/--seeds/--preset")
    p.add_argument("--dry-run", action="store_true",
                   help="list every (arm, seed) with its config hash, protocol and what the sweep would do "
                        "(run, resume, done, skip); run nothing")
    context.with_config(p)
    p.set_defaults(preset=None)


def run(args) -> int:
    from muonlab.lab.sweep import dry_run, format_dry_run, format_outcomes, run_sweep

    if args.status:
        return _sweep_status(args)
    arms, seeds, preset, overrides = _sweep_plan(args)
    if args.dry_run:
        from muonlab.lab.executors import make_executor

        if args.executor == "local":  # the SLURM-only flags are refused as a sweep refuses them, though nothing runs
            make_executor(args.executor, parallel=args.parallel, slurm=parse_slurm_options(args.slurm),
                          gpus_per_run=args.gpus_per_run, nodes=args.nodes, detach=args.detach)
        plan = dry_run(arms, seeds, preset, overrides, retry_failed=args.retry_failed, log=_log_for(args))
        _emit(args, {"runs": plan}, format_dry_run(plan))
        return 0
    outcomes = run_sweep(arms, seeds, preset, overrides, executor=args.executor, parallel=args.parallel,
                         retry_failed=args.retry_failed, slurm=parse_slurm_options(args.slurm),
                         log=_log_for(args), gpus_per_run=args.gpus_per_run, nodes=args.nodes, detach=args.detach)
    payload = [dict(arm=o.job.arm, seed=o.job.seed, config_hash=o.job.config_hash, action=o.action,
                    status=o.status, metrics=o.metrics) for o in outcomes]
    _emit(args, {"runs": payload}, format_outcomes(outcomes))
    # handed to SLURM and not yet back is not a failure: `sweep --status` follows it
    failed = [o for o in outcomes if o.status not in ("ok", "queued", "running")]
    if failed:
        first = failed[0]
        every = " (muonlab sweep --status lists every run)" if len(failed) > 1 else ""
        raise MuonlabError(f"{len(failed)} of {len(outcomes)} run(s) did not end ok; {first.job.arm} seed "
                           f"{first.job.seed}: {first.error or first.status}{every}")
    return 0


def _sweep_plan(args) -> tuple[list[str], list[int], str, dict]:
    """(arms, seeds, preset, overrides) of the sweep the arguments name (muonlab.lab.request's rules)."""
    from muonlab.lab.request import SweepRequest, plan_request

    return plan_request(SweepRequest(arms=args.arms, seeds=args.seeds, preset=args.preset,
                                     experiment=getattr(args, "experiment", None), overrides=collect_overrides(args)))


def _sweep_status(args) -> int:
    """`muonlab sweep --status`: each (arm, seed) of the sweep the other arguments name, or of every
    run of --ledger's study: missing, queued, running, done, failed or interrupted."""
    from pathlib import Path

    from muonlab.lab.sweep import latest_records, plan_sweep
    from muonlab.lab.sweep_status import format_status, sweep_status
    from muonlab.record.rundir import ledger_path

    for name in ("detach", "retry_failed"):
        if getattr(args, name):
            raise UsageError(f"--status only reads where a sweep stands; drop --{name.replace('_', '-')}")
    overrides = collect_overrides(args)
    if args.arms or args.experiment:
        jobs = plan_sweep(*_sweep_plan(args))
        ledger = ledger_path(jobs[0].config)
        planned = [(j.arm, j.seed, j.config_hash, j.config.train.num_steps) for j in jobs]
    elif overrides.get("ledger"):
        from muonlab.lab.report.build import still_out

        ledger, planned = Path(overrides["ledger"]).expanduser(), None
        refuse_a_ledger_folder(ledger)
        if not ledger.is_file() and not still_out(ledger):
            raise UsageError(f"ledger not found: {ledger} (no run finished and no sweep submitted there)")
    else:
        raise UsageError("muonlab sweep --status needs the sweep's --arms (with its --seeds, --preset and settings), "
                         "its --experiment or its --ledger")
    log = _log_for(args)
    states = sweep_status(ledger, latest_records(ledger, log), planned, warn=log)
    rows = [dict(arm=s.arm, seed=s.seed, config_hash=s.config_hash, state=s.state, detail=s.detail, job_id=s.job_id,
                 metrics=s.metrics) for s in states]
    _emit(args, {"ledger": str(ledger), "runs": rows}, f"ledger {ledger}\n" + format_status(states))
    return 0
