"""The report verb's library entry: analyse a ledger, then write the report files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from muonlab.errors import MuonlabError
from muonlab.lab.report.analysis import DEFAULT_THRESHOLD, analyse
from muonlab.lab.report.loading import Point
from muonlab.lab.report.output import write_report
from muonlab.lab.report.requests import parse_requests


def still_out(ledger: Path) -> list[dict[str, Any]]:
    """The ledger's submitted runs that have not recorded an end yet (lab/sweep_status.py)."""
    from muonlab.lab.sweep import latest_records
    from muonlab.lab.sweep_status import unfinished_runs

    return unfinished_runs(ledger, latest_records(ledger, lambda _: None) if ledger.is_file() else {})


def build_report(ledger_path: str | os.PathLike, baseline: str = "baseline", metric: str = "auto",
                 threshold: float = DEFAULT_THRESHOLD, out_dir: str | os.PathLike | None = None, *,
                 rule: str = "ci+threshold", arm_overrides: Mapping[str, Any] | None = None,
                 where: Sequence[str] | Mapping[str, Any] | None = None, protocol: str | None = None,
                 contrasts: Sequence[str] = (), dods: Sequence[str] = (), retentions: Sequence[str] = (),
                 single_seed: Sequence[str] = (), across: str | None = None,
                 only: Collection[tuple[str, int, str | None]] | None = None,
                 at: Point | None = None, protocol_free: bool = False, title: str | None = None) -> dict[str, Any]:
    """Analyse a ledger and return the report as a JSON-ready dict, one study per protocol; with
    `out_dir`, also write report.md, report.json and the PNG plots there (see `write_report`).

    `rule` is a `muonlab.lab.stats.RULE_KINDS` key; `arm_overrides` maps arm -> the config keys
    (or the override dict) the arm changes (default: the registered arms'). `where` keeps the
    runs whose config holds each KEY=VALUE; `protocol` keeps the one protocol whose id starts
    so. `contrasts`, `dods`, `retentions`, `single_seed` and `across` take the command line's
    texts (muonlab.lab.report.requests: "A:B", "A:B,C:D", "A:B@SEED", "KEY" or "KEY=v1,v2"). `only`
    keeps the lines whose (arm, seed, protocol id) it lists (an experiment file's planned runs); `at`
    reads each run at its last periodic evaluation at or before that point (loading.Point);
    `protocol_free` pools lines that record neither a protocol nor a config into one protocol. `title` names
    the report (an experiment file's name; default: the ledger's).
    Raises UsageError for a missing ledger, an unknown baseline, metric, arm or setting, and a
    filter nothing matches; MuonlabError when the ledger has no ok run.
    """
    requests = parse_requests(contrasts, dods, retentions, single_seed, across)
    try:
        report, curves = analyse(Path(ledger_path), baseline, metric, threshold, rule, arm_overrides,
                                 where=where, protocol=protocol, requests=requests, only=only, at=at,
                                 protocol_free=protocol_free)
    except MuonlabError as exc:  # nothing reportable yet: say what is still on its way
        out = still_out(Path(ledger_path))
        if not out:
            raise
        raise type(exc)(f"{exc}; {len(out)} submitted run(s) are still out (muonlab sweep --status --ledger "
                        f"{ledger_path})") from exc
    report["unfinished"] = still_out(Path(ledger_path))  # a detached sweep's runs not yet recorded
    report["title"] = title or Path(ledger_path).name
    if out_dir is not None:
        write_report(report, out_dir, curves)
    return report


def run_report(ledger_path: str | os.PathLike, baseline: str = "baseline", metric: str = "auto",
               threshold: float = DEFAULT_THRESHOLD, out_dir: str | os.PathLike | None = None,
               **options: Any) -> dict[str, Any]:
    """build_report, writing into `out_dir` (default `<ledger dir>/report/`)."""
    out_dir = Path(out_dir) if out_dir is not None else Path(ledger_path).parent / "report"
    return build_report(ledger_path, baseline, metric, threshold, out_dir, **options)
