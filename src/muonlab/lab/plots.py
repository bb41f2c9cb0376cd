"""PNG figures for experiment reports: training-loss curves, per-seed paired differences and
a forest plot of contrasts with the preregistered ±θ band.

Figures are drawn with matplotlib's object API on an Agg canvas (no pyplot, no global
backend switch), so reports render on headless machines and never disturb a user's
interactive matplotlib session. Every function takes plain data (the report's JSON-ready
dicts), so the plots can be redrawn from a saved report.json.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from muonlab.atomic import atomic_open
from muonlab.optional import require

DECISION_COLORS = {"improves": "#1a9850", "worse": "#d73027", "inconclusive": "#636363",
                   "not estimable": "#bdbdbd"}


def _figure(width: float, height: float):
    # Imported here so the rest of the lab (and the report's numbers) work without matplotlib.
    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "the report's plots").FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")


def _palette(i: int) -> str:
    from matplotlib import colormaps

    return colormaps["tab10"](i % 10)


def plot_loss_curves(curves: Mapping[str, Sequence[tuple[int, Sequence[int], Sequence[float]]]],
                     path: str | os.PathLike, ylabel: str = "training loss (EMA)",
                     title: str = "Training loss per arm") -> None:
    """Per arm: thin line per seed, thick line for the mean over seeds at their common steps; on the left the
    whole run, on the right from a tenth of it on (the first steps' loss, ~ln V, dwarfs the differences that
    matter). Each panel's y range holds every line it draws, per-seed ones included.

    `curves` maps arm -> [(seed, steps, values), ...].
    """
    fig = _figure(11.0, 4.8)
    whole, zoom = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    last = max((max(steps) for runs in curves.values() for _s, steps, _v in runs if len(steps)), default=0)
    start = last / 10
    for ax, lower in ((whole, None), (zoom, start)):
        shown: list[float] = []
        for i, (arm, runs) in enumerate(curves.items()):
            color = _palette(i)
            for _seed, steps, values in runs:
                kept = [(s, v) for s, v in zip(steps, values) if lower is None or s >= lower]
                if kept:
                    ax.plot(*zip(*kept), color=color, linewidth=0.7, alpha=0.35)
                    shown += [v for _, v in kept]
            common = sorted(set.intersection(*(set(steps) for _s, steps, _v in runs))) if runs else []
            common = [s for s in common if lower is None or s >= lower]
            if common:
                lookup = [dict(zip(steps, values)) for _s, steps, values in runs]
                ax.plot(common, [sum(d[s] for d in lookup) / len(lookup) for s in common], color=color,
                        linewidth=2.0, label=f"{arm} (mean of {len(runs)})")
        if shown:
            lo, hi = min(shown), max(shown)
            pad = 0.05 * (hi - lo or abs(hi) or 1.0)
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel("steps done")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    whole.set_title("whole run", fontsize=9)
    zoom.set_title(f"from step {start:,.0f} on", fontsize=9)
    fig.suptitle(title)
    if curves:
        zoom.legend(fontsize=8)
    _save(fig, path)


def plot_bpb_against_compressor(steps: Sequence[int], bpb: Sequence[float], compressor_bpb: float,
                                path: str | os.PathLike, compressor: str = "xz -9e", title: str = "") -> None:
    """Validation bits per byte at the periodic evaluations, with a compressor's bits per byte on
    the same bytes as a horizontal line: where the model's curve falls below it, it compresses
    that text better than the compressor does."""
    fig = _figure(8.0, 4.8)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(steps, bpb, marker="o", markersize=3, linewidth=1.6, color=_palette(0), label="model: validation BPB")
    ax.axhline(compressor_bpb, color="black", linestyle="--", linewidth=1.0,
               label=f"{compressor} on the same bytes ({compressor_bpb:.3f})")
    tail = list(bpb[len(bpb) // 5:]) + [compressor_bpb]  # the first evaluations (~log2 V) dwarf the rest
    lo, hi = min(tail), max(tail)
    pad = 0.08 * (hi - lo or 1.0)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("steps done")
    ax.set_ylabel("bits per byte (lower is better)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _threshold_band(ax, threshold: float, vertical: bool) -> None:
    span = ax.axvspan if vertical else ax.axhspan
    line = ax.axvline if vertical else ax.axhline
    if threshold > 0:
        span(-threshold, threshold, color="#fee08b", alpha=0.35, zorder=0,
             label=f"±θ = {threshold:g}")
    line(0.0, color="black", linewidth=0.8, zorder=1)


def plot_paired_deltas(contrasts: Mapping[str, Mapping], path: str | os.PathLike, metric: str,
                       threshold: float, baseline: str) -> None:
    """Each seed's Δ (dots, labelled by seed) and the mean Δ with its 95% t-interval per arm."""
    names = list(contrasts)
    fig = _figure(max(5.0, 1.3 * len(names) + 2.5), 4.8)
    ax = fig.add_subplot(1, 1, 1)
    _threshold_band(ax, threshold, vertical=False)
    for x, name in enumerate(names):
        c = contrasts[name]
        deltas, seeds = c.get("deltas", []), c.get("seeds", [])
        k = len(deltas)
        offsets = [(j - (k - 1) / 2) * 0.08 for j in range(k)]
        ax.scatter([x - 0.15 + o for o in offsets], deltas, s=18, color="#3182bd", zorder=3)
        for o, seed, d in zip(offsets, seeds, deltas):
            ax.annotate(str(seed), (x - 0.15 + o, d), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
        if c.get("estimable"):
            lo, hi = c["ci95"]
            mean = c["mean_delta"]
            color = DECISION_COLORS.get(c["decision"], "black")
            ax.errorbar([x + 0.15], [mean], yerr=[[mean - lo], [hi - mean]], fmt="D", color=color,
                        capsize=4, zorder=4)
        else:
            ax.annotate("not estimable", (x, 0.0), fontsize=7, ha="center", xytext=(0, 6),
                        textcoords="offset points", color="#636363")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.7, max(len(names) - 0.3, 0.7))
    ax.set_ylabel(f"Δ {metric} vs {baseline} (negative = lower)")
    ax.set_title(f"Per-seed paired Δ {metric}\nwith mean and 95% t-interval", fontsize=10)  # fits 1 arm's width
    ax.grid(alpha=0.3, axis="y")
    if threshold > 0:
        ax.legend(fontsize=8, loc="best")
    _save(fig, path)


def plot_forest(rows: Sequence[tuple[str, Mapping]], path: str | os.PathLike, threshold: float,
                xlabel: str = "mean Δ with 95% t-interval") -> None:
    """One row per contrast: mean Δ and 95% CI, coloured by decision, over the ±θ band."""
    fig = _figure(7.5, max(2.5, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    _threshold_band(ax, threshold, vertical=True)
    for y, (label, c) in enumerate(reversed(list(rows))):
        if c.get("estimable"):
            lo, hi = c["ci95"]
            color = DECISION_COLORS.get(c["decision"], "black")
            ax.plot([lo, hi], [y, y], color=color, linewidth=2.0)
            ax.plot([c["mean_delta"]], [y], "o", color=color)
        else:
            ax.annotate(f"not estimable (n={c.get('n', 0)})", (0.0, y), fontsize=7,
                        ha="center", va="center", color="#636363")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _c in reversed(list(rows))], fontsize=8)
    ax.set_ylim(-0.8, max(len(rows) - 0.2, 0.8))
    ax.set_xlabel(xlabel)
    ax.set_title("Contrasts (green: improves, red: worse, grey: inconclusive)")
    ax.grid(alpha=0.3, axis="x")
    if threshold > 0:
        ax.legend(fontsize=8, loc="best")
    _save(fig, path)
