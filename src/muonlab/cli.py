"""The `muonlab` command line: argument parsing only; every verb calls a library function.

Exit status: 0 success, 1 runtime failure (including a diverged run or a failed check),
2 usage error (unknown option, impossible configuration, missing input), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Callable

from muonlab.errors import MuonlabError, UsageError


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


def _add_config_flags(parser: argparse.ArgumentParser, config_cls, skip=(), group_title=None):
    group = parser.add_argument_group(group_title) if group_title else parser
    for f in dataclasses.fields(config_cls):
        if f.name in skip or dataclasses.is_dataclass(f.default_factory if f.default_factory
                                                      is not dataclasses.MISSING else None):
            continue
        if f.name == "data":
            continue
        convert, _ = _field_type(f.type)
        default = f.default if f.default is not dataclasses.MISSING else None
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", type=convert,
                           default=argparse.SUPPRESS, metavar=convert.__name__.upper(),
                           help=f"(default: {default})")


def _collect_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}


def _resolve_config(args: argparse.Namespace):
    from muonlab.config import apply_overrides, preset

    overrides = _collect_overrides(args)
    # giving one duration switches the other off
    if "time_budget" in overrides and overrides["time_budget"] is not None and "num_steps" not in overrides:
        overrides["num_steps"] = None
    if "num_steps" in overrides and overrides["num_steps"] is not None and "time_budget" not in overrides:
        overrides["time_budget"] = None
    return apply_overrides(preset(args.preset), overrides).validate()


def _emit(args, payload: dict, text: str) -> None:
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
    from muonlab.train.run import format_summary

    cfg = _resolve_config(args)
    if args.json:
        cfg.quiet = True
    result = run_training(cfg, log=_log_for(args))
    _emit(args, {"run_id": result.run_id, "run_dir": str(result.run_dir), "status": result.status,
                 "summary": result.summary, "metrics": result.metrics},
          format_summary(result.summary) + f"\nrun_dir:          {result.run_dir}")
    return 0


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
        p.add_argument("--preset", default="gpu-d8" if train_flags else "gpu-d8", choices=sorted(PRESETS),
                       help="protocol preset the flags override (default: gpu-d8)")
        if train_flags:
            _add_config_flags(p, TrainConfig, group_title="training")
        _add_config_flags(p, DataConfig, group_title="data")
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("prepare", help="download/materialise a corpus and train its tokenizer")
    with_config(p, train_flags=False)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one run and evaluate val/holdout BPB")
    with_config(p, train_flags=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="the CPU demo: stdlib corpus, cpu-demo preset, compare with xz")
    p.add_argument("--cache-dir", default=None, help="cache directory (default ~/.cache/muonlab)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("verify-reference", help="teacher-forced check against an upstream reference bundle")
    p.add_argument("bundle", help="path to an autoresearch-reference/1 bundle (.pt)")
    p.add_argument("--json", action="store_true", help="print every per-tensor figure as JSON")
    p.set_defaults(func=cmd_verify_reference)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except MuonlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
