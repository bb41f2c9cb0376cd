"""The report verb's library entry: analyse a ledger, then write the report files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from muonlab.lab.report.analysis import DEFAULT_THRESHOLD, analyse
from muonlab.lab.report.output import write_report


def build_report(ledger_path: str | os.PathLike, baseline: str = "baseline", metric: str = "val_bpb",
                 threshold: float = DEFAULT_THRESHOLD, out_dir: str | os.PathLike | None = None, *,
                 rule: str = "ci+threshold",
                 arm_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Analyse a ledger and return the report as a JSON-ready dict; with `out_dir`, also write
    report.md, report.json and the PNG plots there (see `write_report`).

    `rule` is a `muonlab.lab.stats.RULE_KINDS` key; `arm_overrides` maps arm -> the config keys
    (or the override dict) the arm changes, so the protocol check can compare everything else.
    Raises UsageError for a missing ledger, an unknown baseline or metric, MuonlabError when
    the ledger has no ok run.
    """
    report, curves = analyse(Path(ledger_path), baseline, metric, threshold, rule, arm_overrides)
    if out_dir is not None:
        write_report(report, out_dir, curves)
    return report


def run_report(ledger_path: str | os.PathLike, baseline: str = "baseline", metric: str = "val_bpb",
               threshold: float = DEFAULT_THRESHOLD, out_dir: str | os.PathLike | None = None,
               **options: Any) -> dict[str, Any]:
    """build_report, writing into `out_dir` (default `<ledger dir>/report/`)."""
    out_dir = Path(out_dir) if out_dir is not None else Path(ledger_path).parent / "report"
    return build_report(ledger_path, baseline, metric, threshold, out_dir, **options)
