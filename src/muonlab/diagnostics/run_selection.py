"""Which runs a diagnostic over several runs reads: run directories given one by one (`--run`,
repeatable), or a selection of a ledger's finished runs (`--arms`, `--seeds`, `--where KEY=VALUE`,
`--ledger`), the latest `ok` run of each (protocol, arm, seed), as `report` selects them.

Runs are grouped by protocol: a table's mean over seeds never mixes two protocols (a depth-6 and a
depth-8 run of one arm are two rows). Runs the ledger names whose directories are gone are listed as
left out, not silently dropped.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from muonlab.errors import UsageError
from muonlab.settings import comma_items

SELECTION_OPTIONS = (
    ("--run", dict(action="append", default=[], metavar="RUN_DIR",
                   help="a run directory to read; repeatable (or select runs from a ledger with --arms/--seeds/--where)")),
    ("--ledger", dict(default=None, help="the ledger to select finished runs from (default <cache>/runs/ledger.jsonl)")),
    ("--arms", dict(default=None, help="comma-separated arms: the ledger's latest ok run of each arm and seed")),
    ("--seeds", dict(default=None, help="comma-separated seeds to keep")),
    ("--where", dict(action="append", default=[], metavar="KEY=VALUE",
                     help="keep the ledger's runs whose config holds KEY=VALUE (depth=6); repeatable")),
)


@dataclass(frozen=True)
class SelectedRun:
    run_dir: Path
    arm: str
    seed: int
    protocol: str  # the protocol id, or "unknown" for a run that records none
    depth: int | None


@dataclass
class Selection:
    runs: list[SelectedRun]
    left_out: list[str] = field(default_factory=list)  # "arm seed: why" of selected ledger runs not read

    def groups(self) -> dict[str, list[SelectedRun]]:
        """Runs by protocol, in the order first seen."""
        out: dict[str, list[SelectedRun]] = {}
        for run in self.runs:
            out.setdefault(run.protocol, []).append(run)
        return out


def _csv(text: str | None, option: str, kind=str) -> list | None:
    if text is None:
        return None
    items = comma_items(text, option, empty_ok=False)
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise UsageError(f"{option} expects comma-separated {kind.__name__}s, got {text!r}") from None


def _from_dirs(dirs: list[str]) -> Selection:
    from muonlab.diagnostics.runs import run_config  # noqa: PLC0415

    runs = []
    for text in dirs:
        cfg = run_config(text)
        runs.append(SelectedRun(Path(text), cfg.arm, cfg.seed, cfg.protocol_id() or "unknown",
                                getattr(cfg.model, "depth", None)))
    return Selection(runs)


def _from_ledger(args: argparse.Namespace) -> Selection:
    from muonlab.lab.report.protocol import recorded_settings  # noqa: PLC0415
    from muonlab.lab.report.selection import parse_where, select_records  # noqa: PLC0415
    from muonlab.paths import cache_root  # noqa: PLC0415
    from muonlab.record.ledger import read_records_tolerant  # noqa: PLC0415

    ledger = Path(args.ledger) if args.ledger else cache_root() / "runs" / "ledger.jsonl"
    if not ledger.is_file():
        raise UsageError(f"no ledger at {ledger} (give --ledger, or run directories with --run)")
    arms, seeds = _csv(args.arms, "--arms"), _csv(args.seeds, "--seeds", int)
    filters = parse_where(args.where)
    records = [r for r in read_records_tolerant(ledger)[0] if r.get("status") == "ok"
               and (arms is None or r.get("arm") in arms) and (seeds is None or r.get("seed") in seeds)]
    if not records:
        raise UsageError(f"{ledger} has no finished run of {'arms ' + args.arms if arms else 'any arm'}"
                         f"{' at seeds ' + args.seeds if seeds else ''}")
    latest: dict[tuple, dict] = {}
    for rec in select_records(records, filters):
        latest[(rec.get("protocol") or "unknown", rec["arm"], rec["seed"])] = rec
    runs, left_out = [], []
    for (protocol, arm, seed), rec in latest.items():
        run_dir = Path(rec.get("run_dir") or "")
        if not rec.get("run_dir") or not run_dir.is_dir():
            left_out.append(f"{arm} seed {seed}: its run directory {rec.get('run_dir')} is gone")
            continue
        settings = recorded_settings(rec)
        depth = settings.values.get("model.depth") if settings is not None else None
        runs.append(SelectedRun(run_dir, arm, seed, protocol, depth))
    if not runs:
        raise UsageError(f"none of the selected runs has its directory any more ({left_out[0]})")
    return Selection(runs, left_out)


def _by_ledger(args: argparse.Namespace) -> bool:
    return args.arms is not None or args.seeds is not None or bool(args.where) or args.ledger is not None


def single_run(args: argparse.Namespace) -> str | None:
    """The run directory when the command names exactly one with --run and no ledger selection (a
    diagnostic then gives that run's whole reading), else None."""
    return args.run[0] if len(args.run) == 1 and not _by_ledger(args) else None


def select_runs(args: argparse.Namespace) -> Selection:
    """The runs the command's --run or ledger options name."""
    by_ledger = _by_ledger(args)
    if args.run and by_ledger:
        raise UsageError("give run directories (--run) or a ledger selection (--arms/--seeds/--where/--ledger), "
                         "not both")
    if args.run:
        return _from_dirs(args.run)
    if not by_ledger:
        raise UsageError("name the runs: --run RUN_DIR (repeatable), or --arms/--seeds/--where over a ledger")
    return _from_ledger(args)


def one_run_or_selection(one: Callable[[str], dict[str, Any]],
                         many: Callable[[Selection], dict[str, Any]]) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """A diagnostic's `run`: one run directory named alone (`--run`) gets `one(run_dir)`, its whole
    reading; otherwise `many(selection)` reads the runs --run or the ledger options select."""

    def run(args: argparse.Namespace) -> dict[str, Any]:
        single = single_run(args)
        return one(single) if single is not None else many(select_runs(args))

    return run


def format_one_or_selection(one: Callable[[dict], str], many: Callable[[dict], str]) -> Callable[[dict], str]:
    """The matching `format`: a selection's result holds its `protocols`, one run's does not."""
    return lambda result: many(result) if "protocols" in result else one(result)
