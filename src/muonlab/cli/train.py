"""`muonlab train`: one run (a preset and arm, a new --arm-name, a saved --config), or --resume of an
interrupted one; evaluates val/holdout BPB."""

from __future__ import annotations

from muonlab.cli.config_flags import collect_overrides
from muonlab.cli.parser import _emit, _log_for
from muonlab.cli.resolve import _resolve_config
from muonlab.errors import UsageError

HELP = "train one run and evaluate val/holdout BPB"


def add_arguments(p, context) -> None:
    p.add_argument("--arm", default="baseline", help="registered arm to train (see `muonlab arms`)")
    p.add_argument("--arm-name", default=None, metavar="NAME",
                   help="record the run as a new arm NAME: --arm (default baseline) plus the model and optimizer "
                        "settings given here (the run's other settings stay its protocol's, so `report` "
                        "contrasts NAME with the baseline); a NAME recorded with other settings is refused")
    p.add_argument("--config", default=None, help="start from a saved config (a run's config.json, or the TOML "
                                                  "`muonlab config` prints) instead of --preset/--arm")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue an interrupted run from its newest checkpoint, in its own directory")
    p.add_argument("--fallback", action="store_true",
                   help="with --resume: if the newest checkpoint is corrupted, use the previous valid one")
    context.with_config(p)


def run(args) -> int:
    from muonlab.train import run_training
    from muonlab.train.run import format_summary, resume_training

    if args.fallback and not args.resume:
        raise UsageError("--fallback picks the checkpoint --resume continues from: add --resume RUN_DIR")
    if args.resume:
        if collect_overrides(args) or args.config:
            raise UsageError("--resume continues a run with its saved config; give no other settings")
        result = resume_training(args.resume, log=_log_for(args), fallback=args.fallback,
                                 quiet=True if args.json else None)
    else:
        from muonlab.lab.plugin_methods import check_plugins_act

        cfg = _resolve_config(args)
        check_plugins_act([cfg], "this run selects none")
        if args.json:
            cfg.record.quiet = True
        result = run_training(cfg, log=_log_for(args))
    _emit(args, {"run_id": result.run_id, "run_dir": str(result.run_dir), "status": result.status,
                 "summary": result.summary, "metrics": result.metrics},
          format_summary(result.summary) + f"\nrun_dir:          {result.run_dir}")
    return 0
