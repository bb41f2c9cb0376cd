"""Report files: report.json, report.md and the PNG plots, written into one folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from muonlab.atomic import write_json, write_text
from muonlab.lab.report.loading import Curve
from muonlab.lab.report.render import render_markdown

PLOT_FILES = {"loss_curves": "loss_curves.png", "paired_deltas": "paired_deltas.png",
              "forest": "forest.png"}


def write_report(report: dict[str, Any], out_dir: str | os.PathLike,
                 curves: Mapping[str, list[Curve]] | None = None) -> dict[str, str]:
    """Write the plots, report.json and report.md into out_dir; record the paths in report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = _write_plots(report, out, curves or {})
    report["files"] = {"report_md": str(out / "report.md"), "report_json": str(out / "report.json"),
                       "plots": {k: str(out / v) for k, v in plots.items()}}
    write_json(out / "report.json", report)
    write_text(out / "report.md", render_markdown(report))
    return report["files"]


def _write_plots(report: dict, out: Path, curves: Mapping[str, list[Curve]]) -> dict[str, str]:
    try:
        from muonlab.lab import plots
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency of the lab
        report["notes"].append(f"plots skipped: {exc}")
        return {}
    written = {}
    if curves:
        keys = {c.key for runs in curves.values() for c in runs}
        label = "training loss (EMA)" if keys == {"smooth_loss"} else "training loss"
        plots.plot_loss_curves({arm: [(c.seed, c.steps, c.values) for c in runs]
                                for arm, runs in curves.items()},
                               out / PLOT_FILES["loss_curves"], ylabel=label)
        written["loss_curves"] = PLOT_FILES["loss_curves"]
    if report["contrasts"]:
        plots.plot_paired_deltas(report["contrasts"], out / PLOT_FILES["paired_deltas"],
                                 report["metric"], report["threshold"], report["baseline"])
        written["paired_deltas"] = PLOT_FILES["paired_deltas"]
        rows = [(f"{c['name']} ({c['metric']})", c) for c in report["contrasts"].values()]
        for m, table in report["secondary"].items():
            rows += [(f"{c['name']} ({m})", c) for c in table["contrasts"].values()]
        plots.plot_forest(rows, out / PLOT_FILES["forest"], report["threshold"])
        written["forest"] = PLOT_FILES["forest"]
    return written
