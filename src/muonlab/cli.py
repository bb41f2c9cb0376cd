"""The `muonlab` command line: argument parsing only; every verb calls a library function.

Exit status: 0 success, 1 runtime failure (including a diverged run or a failed check),
2 usage error (unknown option, impossible configuration, missing input), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Callable

from muonlab.errors import MuonlabError, UsageError


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _Parser(argparse.ArgumentParser):
    """Print one line and exit 2 on bad usage, instead of argparse's usage dump."""

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _field_type(annotation: str) -> tuple[Callable[[str], Any], bool]:
    """Converter for a dataclass field annotation like 'int | None'; second item: optional."""
    parts = [p.strip() for p in str(annotation).split("|")]
    optional = "None" in parts
    base = next((p for p in parts if p != "None"), "str")

    def convert(text: str):
        if optional and text.lower() in ("none", "null", ""):
            return None
        if base == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        return text

    convert.__name__ = base
    return convert, optional


def _add_config_flags(parser: argparse.ArgumentParser, config_cls, group_title: str):
    group = parser.add_argument_group(group_title)
    for f in dataclasses.fields(config_cls):
        # `data` gets DataConfig's own flags; `arm` has its own flag, which applies the arm's overrides
        if f.name in ("data", "arm"):
            continue
        convert, _ = _field_type(f.type)
        default = f.default if f.default is not dataclasses.MISSING else None
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", type=convert,
                           default=argparse.SUPPRESS, metavar=convert.__name__.upper(),
                           help=f"(default: {default})")


def _collect_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}


def _resolve_config(args: argparse.Namespace):
    from muonlab.arms import resolve_config
    from muonlab.config import apply_overrides, load_config_file

    overrides = _collect_overrides(args)
    # giving one duration switches the other off
    if "time_budget" in overrides and overrides["time_budget"] is not None and "num_steps" not in overrides:
        overrides["num_steps"] = None
    if "num_steps" in overrides and overrides["num_steps"] is not None and "time_budget" not in overrides:
        overrides["time_budget"] = None
    if getattr(args, "config", None):
        return apply_overrides(load_config_file(args.config), overrides).validate()
    return resolve_config(getattr(args, "arm", "baseline"), args.preset, overrides)


def _emit(args, payload: dict, text: str) -> None:
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text)


def _log_for(args) -> Callable[[str], None]:
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    return lambda message: print(message, file=stream, flush=True)


# ------------------------------------------------------------------------------ verbs
def cmd_prepare(args) -> int:
    from muonlab.data.prepare import prepare_data

    cfg = _resolve_config(args)
    data = prepare_data(cfg.data, log=_log_for(args))
    payload = data.describe()
    text = "\n".join(f"{k}: {v}" for k, v in payload.items())
    _emit(args, payload, text)
    return 0


def cmd_train(args) -> int:
    from muonlab.train import run_training
    from muonlab.train.run import format_summary, resume_training

    if args.resume:
        if _collect_overrides(args) or args.config:
            raise UsageError("--resume continues a run with its saved config; give no other settings")
        result = resume_training(args.resume, log=_log_for(args), fallback=args.fallback,
                                 quiet=True if args.json else None)
    else:
        cfg = _resolve_config(args)
        if args.json:
            cfg.quiet = True
        result = run_training(cfg, log=_log_for(args))
    _emit(args, {"run_id": result.run_id, "run_dir": str(result.run_dir), "status": result.status,
                 "summary": result.summary, "metrics": result.metrics},
          format_summary(result.summary) + f"\nrun_dir:          {result.run_dir}")
    return 0


def cmd_arms(args) -> int:
    from muonlab.arms import ARMS

    payload = {name: arm.to_dict() for name, arm in sorted(ARMS.items())}
    lines = []
    for arm in payload.values():
        origin = " / ".join(x for x in (arm["paper"], arm["experiment"]) if x) or "-"
        lines.append(f"{arm['name']:<20} [{arm['family']}] {arm['description']}")
        lines.append(f"{'':<20} reproduces: {origin}; overrides: {json.dumps(arm['overrides']) if arm['overrides'] else 'none'}")
    _emit(args, payload, "\n".join(lines))
    return 0


def _parse_slurm_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--slurm expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def cmd_sweep(args) -> int:
    from muonlab.arms import default_seeds, get_arm
    from muonlab.lab.sweep import format_outcomes, parse_seeds, run_sweep

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        get_arm(arm)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else default_seeds(arms)
    overrides = _collect_overrides(args)
    overrides.setdefault("quiet", True)
    outcomes = run_sweep(arms, seeds, args.preset, overrides, executor=args.executor, parallel=args.parallel,
                         retry_failed=args.retry_failed, slurm=_parse_slurm_options(args.slurm),
                         log=_log_for(args))
    payload = [dict(arm=o.job.arm, seed=o.job.seed, config_hash=o.job.config_hash, action=o.action,
                    status=o.status, metrics=o.metrics) for o in outcomes]
    _emit(args, {"runs": payload}, format_outcomes(outcomes))
    return 0 if all(o.status == "ok" for o in outcomes) else 1


def cmd_report(args) -> int:
    from pathlib import Path

    from muonlab.arms import ARMS
    from muonlab.atomic import write_text
    from muonlab.record.ledger import read_records_tolerant
    from muonlab.lab.report import format_text, run_report
    from muonlab.record.results_tsv import results_tsv
    from muonlab.paths import cache_root

    ledger = Path(args.ledger) if args.ledger else cache_root() / "runs" / "ledger.jsonl"
    if not ledger.is_file():
        raise UsageError(f"ledger not found: {ledger}")
    report = run_report(ledger, baseline=args.baseline, metric=args.metric, threshold=args.threshold,
                        out_dir=args.out, rule=args.rule,
                        arm_overrides={name: arm.overrides for name, arm in ARMS.items()})
    if args.tsv:
        records, _ = read_records_tolerant(ledger)
        write_text(args.tsv, results_tsv(sorted(records, key=lambda r: r["_line"])))
    text = format_text(report)
    if args.tsv:
        text += f"\nresults.tsv: {args.tsv}"
    _emit(args, report, text)
    return 0


# tool: (module, runner, formatter, needs a run directory)
DIAGNOSTICS = {
    "conditioning": ("conditioning", lambda m, a: m.run(), "format_table", False),
    "storage": ("storage", lambda m, a: m.run_storage_audit(), "format_storage_table", False),
    "equivalence": ("equivalence", lambda m, a: m.run(), "format_table", False),
    "gauge": ("gauge", lambda m, a: m.run_gauge_audit(), "format_gauge_table", False),
    "trajectory": ("trajectory", lambda m, a: m.read_trajectory(a.run), "format_table", True),
    "geometry": ("geometry", lambda m, a: m.run(a.run), "format_table", True),
    "replay": ("replay", lambda m, a: m.run_replay(a.run, micro_batches=a.micro_batches, rule=a.rule),
               "format_replay_table", True),
    "audit": ("audit002", lambda m, a: m.run_audit(a.run), "format_audit_table", True),
    "afmuon": ("afmuon", lambda m, a: m.run(a.run), "format_table", True),
    "step0": ("step0_audit", lambda m, a: m.run_step0_audit(), "format_step0_table", False),
    "accounting": ("accounting", lambda m, a: m.accounting_table(_accounting_arms(a), a.preset),
                   "format_accounting_table", False),
}


def _accounting_arms(args) -> list[str]:
    """--arms, or every seed-002 arm (spec-002 §1.12)."""
    from muonlab.arms import ARMS, get_arm

    if args.arms:
        return [get_arm(name).name for name in args.arms.split(",")]
    return [name for name, arm in ARMS.items() if arm.paper == "seed 002"]


def cmd_diagnose(args) -> int:
    import importlib

    module_name, runner, formatter, needs_run = DIAGNOSTICS[args.tool]
    if needs_run and args.run is None:
        raise UsageError(f"diagnose {args.tool} reads a run: give --run RUN_DIR")
    mod = importlib.import_module(f"muonlab.diagnostics.{module_name}")
    result = runner(mod, args)
    _emit(args, result, getattr(mod, formatter)(result))
    failed = (result.get("passed") is False  # a check of the diagnostic itself failed: exit 1
              or (args.tool == "equivalence" and not result["proposition1"]["passed"])
              or (args.tool == "gauge" and result["passed"] != result["checks"]))
    return 1 if failed else 0


def cmd_demo(args) -> int:
    from muonlab.demo import format_demo, run_demo

    report = run_demo(cache_dir=args.cache_dir, log=_log_for(args), quiet=args.json)
    _emit(args, report, format_demo(report))
    return 0 if report["beats_xz"] else 1


def cmd_verify_reference(args) -> int:
    from muonlab.reference import verify_bundle

    report = verify_bundle(args.bundle)
    _emit(args, report.to_dict(), report.format_table())
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    from muonlab import __version__
    from muonlab.config import PRESETS, TrainConfig
    from muonlab.data.config import DataConfig

    parser = _Parser(prog="muonlab", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--version", action="version", version=f"muonlab {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True

    def with_config(p, train_flags: bool):
        p.add_argument("--preset", default="gpu-d8", choices=sorted(PRESETS),
                       help="protocol preset the flags override (default: gpu-d8)")
        if train_flags:
            _add_config_flags(p, TrainConfig, group_title="training")
        _add_config_flags(p, DataConfig, group_title="data")
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("prepare", help="download/materialise a corpus and train its tokenizer")
    with_config(p, train_flags=False)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one run and evaluate val/holdout BPB")
    p.add_argument("--arm", default="baseline", help="registered arm to train (see `muonlab arms`)")
    p.add_argument("--config", default=None, help="start from a saved config (a run's config.json) instead of --preset/--arm")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue an interrupted run from its newest checkpoint, in its own directory")
    p.add_argument("--fallback", action="store_true",
                   help="with --resume: if the newest checkpoint is corrupted, use the previous valid one")
    with_config(p, train_flags=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("arms", help="list the registered arms")
    p.add_argument("--json", action="store_true", help="print the registry as JSON")
    p.set_defaults(func=cmd_arms)

    p = sub.add_parser("sweep", help="run arms x seeds under one preset, resumable from the ledger")
    p.add_argument("--arms", required=True, help="comma-separated arm names")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds, e.g. 41,42,47 (default: the seeds the arms' paper used)")
    p.add_argument("--executor", default="local", choices=("local", "slurm"))
    p.add_argument("--parallel", type=int, default=None,
                   help="runs at a time (local; default: one per visible GPU, else 1)")
    p.add_argument("--retry-failed", action="store_true", help="run failed or diverged (arm, seed) again")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="submitit parameter, e.g. slurm_partition=gpu, timeout_min=60, cluster=local")
    with_config(p, train_flags=True)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="per-arm statistics, paired contrasts, Markdown/JSON/PNG report")
    p.add_argument("--ledger", default=None, help="ledger to analyse (default <cache>/runs/ledger.jsonl)")
    p.add_argument("--baseline", default="baseline", help="reference arm of the contrasts (default baseline)")
    p.add_argument("--metric", default="val_bpb", help="metrics key to compare: val_bpb (default), holdout_bpb, ...")
    p.add_argument("--threshold", type=float, default=0.0005,
                   help="preregistered decision threshold in metric units (default 0.0005 BPB)")
    p.add_argument("--rule", default="ci+threshold", choices=("ci+threshold", "ci", "threshold"),
                   help="decision rule (default: CI excludes 0 and |mean delta| >= threshold)")
    p.add_argument("--out", default=None, help="report directory (default <ledger dir>/report)")
    p.add_argument("--tsv", default=None, metavar="PATH", help="also export upstream-style results.tsv")
    p.add_argument("--json", action="store_true", help="print the report's numbers as JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("diagnose", help="read-only diagnostics: conditioning, storage, equivalence, gauge, "
                                        "step0, accounting; trajectory, geometry, replay, audit, afmuon (of a run, --run)")
    p.add_argument("tool", choices=tuple(DIAGNOSTICS), help="which diagnostic")
    p.add_argument("--run", default=None, metavar="RUN_DIR", help="the run to read (trajectory, geometry, replay, audit, afmuon)")
    p.add_argument("--rule", default="branch_tangent", help="replay: the backward rule compared with ordinary")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="replay: micro-batches to replay (default: one optimizer step's worth)")
    p.add_argument("--arms", default=None, help="accounting: comma-separated arms (default: every seed-002 arm)")
    p.add_argument("--preset", default="gpu-d8", choices=sorted(PRESETS),
                   help="accounting: the protocol the arms are priced at (default gpu-d8)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("demo", help="the CPU demo: stdlib corpus, cpu-demo preset, compare with xz")
    p.add_argument("--cache-dir", default=None, help="cache directory (default ~/.cache/muonlab)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("verify-reference", help="teacher-forced check against an upstream reference bundle")
    p.add_argument("bundle", help="path to an autoresearch-reference/1 bundle (.pt)")
    p.add_argument("--json", action="store_true", help="print every per-tensor figure as JSON")
    p.set_defaults(func=cmd_verify_reference)
    return parser


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a SLURM preemption or `kill` ends a run like Ctrl-C: recorded, then exit


def main(argv: list[str] | None = None) -> int:
    import signal

    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt) if threading_is_main() else None
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except MuonlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, a vanished file: the run is already recorded
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
