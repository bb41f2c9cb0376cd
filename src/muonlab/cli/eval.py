"""`muonlab eval`: score a run's final weights or a checkpoint again, in a process of its own, and compare
with what the run recorded; --every: the val split of each kept checkpoint, recorded as evaluations."""

from __future__ import annotations

from muonlab.cli.parser import _emit, _log_for
from muonlab.errors import UsageError
from muonlab.settings import comma_items, integer_at_least

HELP = ("score a run's final weights or a checkpoint again, in a process of its own, and compare with what the "
        "run recorded (equal bit for bit on the machine that trained it)")


def add_arguments(p, context) -> None:
    p.add_argument("run", metavar="RUN_DIR", help="a run directory (holding config.json)")
    p.add_argument("--step", type=integer_at_least(0), default=None, metavar="N",
                   help="the checkpoint after N steps (checkpoints/step-NNNNNN.pt) instead of the final weights")
    p.add_argument("--every", type=integer_at_least(1), default=None, metavar="N",
                   help="score the val split of each kept checkpoint after a multiple of N steps, as a periodic "
                        "evaluation, and record them where report --at-step reads them")
    p.add_argument("--splits", default="val,holdout", help="val, holdout or both (default: both)")
    p.add_argument("--device", default=None, help="score on this device instead of the run's (cpu, cuda, ...)")
    p.add_argument("--json", action="store_true", help="print the scores and the recorded values as JSON")


def run(args) -> int:
    from muonlab.train.rescore import rescore_every, rescore_run

    if args.every is not None:
        if args.step is not None:
            raise UsageError("--every scores the checkpoints at every multiple of N steps: drop --step")
        results = rescore_every(args.run, args.every, device=args.device, log=_log_for(args))
        text = [f"{r.step:>8}  " + "  ".join(f"{k} {v:.6f}" for k, v in r.scores.items()) for r in results]
        _emit(args, {"run_dir": args.run, "every": args.every, "evaluations": [r.to_dict() for r in results]},
              "\n".join([f"{args.run}: the val split after each multiple of {args.every} steps, recorded in its "
                         "evals.jsonl (report --at-step reads them)", "   steps  scores", *text]))
        return 0
    splits = tuple(comma_items(args.splits, "--splits", empty_ok=False))
    result = rescore_run(args.run, step=args.step, splits=splits, device=args.device, log=_log_for(args))
    _emit(args, result.to_dict(), result.format())
    return 0 if result.equal is not False else 1
