"""Report files: report.json, report.md and the PNG plots, written into one folder.

One set of plots per study; with several protocols their names carry the protocol id
(`forest_<id8>.png`), so no study's plot overwrites another's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from muonlab.atomic import write_json, write_text
from muonlab.lab.report.loading import Curve
from muonlab.lab.report.render import render_markdown

PLOT_FILES = {"loss_curves": "loss_curves.png", "val_curves": "val_curves.png",
              "paired_deltas": "paired_deltas.png", "forest": "forest.png"}


def write_report(report: dict[str, Any], out_dir: str | os.PathLike,
                 curves: Mapping[str, Mapping[str, Mapping[str, list[Curve]]]] | None = None) -> dict[str, Any]:
    """Write the plots, report.json and report.md into out_dir; record the paths in report.

    `curves` maps study (protocol id) -> "loss" | "val" -> arm -> the runs' curves.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    many = len(report["studies"]) > 1
    every: dict[str, str] = {}
    for study in report["studies"]:
        suffix = f"_{study['protocol'][:8]}" if many else ""
        plots = _write_plots(study, report, out, (curves or {}).get(study["protocol"], {}), suffix)
        study["plots"] = {k: str(out / v) for k, v in plots.items()}
        every.update({f"{k}{suffix}": str(out / v) for k, v in plots.items()})
    report["files"] = {"report_md": str(out / "report.md"), "report_json": str(out / "report.json"),
                       "plots": every}
    write_json(out / "report.json", report)
    write_text(out / "report.md", render_markdown(report))
    return report["files"]


VAL_LABELS = {"val_bpb": "validation bits per byte", "val_ce": "validation loss (nats per token)",
              "val_bpd": "validation bits per dimension", "val_ppl": "validation perplexity"}


def _name(kind: str, suffix: str) -> str:
    stem, ext = PLOT_FILES[kind].rsplit(".", 1)
    return f"{stem}{suffix}.{ext}"


def _write_plots(study: dict, report: dict, out: Path, study_curves: Mapping[str, Mapping[str, list[Curve]]],
                 suffix: str) -> dict[str, str]:
    """The study's PNGs; `study_curves` holds "loss" (training) and "val" (periodic) curves per arm."""
    curves = study_curves.get("loss", {})
    val_curves = study_curves.get("val", {})
    try:
        from muonlab.lab import plots
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency of the lab
        study["notes"].append(f"plots skipped: {exc}")
        return {}
    written = {}
    if curves:
        keys = {c.key for runs in curves.values() for c in runs}
        label = "training loss (EMA)" if keys == {"smooth_loss"} else "training loss"
        written["loss_curves"] = _name("loss_curves", suffix)
        plots.plot_loss_curves({arm: [(c.seed, c.steps, c.values) for c in runs]
                                for arm, runs in curves.items()},
                               out / written["loss_curves"], ylabel=label)
    key = study.get("validation_curve_key", "val_bpb")
    if val_curves:  # seed 004's figures: validation loss per arm, seeds thin, their mean thick
        written["val_curves"] = _name("val_curves", suffix)
        plots.plot_loss_curves({arm: [(c.seed, c.steps, c.values) for c in runs] for arm, runs in val_curves.items()},
                               out / written["val_curves"], ylabel=VAL_LABELS.get(key, key),
                               title=f"{key} per arm (--eval-every)")
    if study["contrasts"]:
        written["paired_deltas"] = _name("paired_deltas", suffix)
        plots.plot_paired_deltas(study["contrasts"], out / written["paired_deltas"],
                                 report["metric"], report["threshold"], report["baseline"])
    tables = [(report["metric"], study)] + list(study["secondary"].items())
    rows = [(f"{c['name']} ({m})", c) for m, t in tables
            for c in [*t["contrasts"].values(), *t["extra_contrasts"], *t["dods"]]]
    if rows:
        written["forest"] = _name("forest", suffix)
        plots.plot_forest(rows, out / written["forest"], report["threshold"])
    return written
