"""Plots a reader can read: every title and label inside its figure, every curve inside its frame."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from muonlab.lab import plots  # noqa: E402


def _drawn(monkeypatch, draw):
    figs = []

    def keep(fig, path):
        fig.tight_layout()
        figs.append(fig)

    monkeypatch.setattr(plots, "_save", keep)
    draw()
    (fig,) = figs
    fig.canvas.draw()
    return fig


def _texts_inside(fig) -> None:
    renderer, width, height = fig.canvas.get_renderer(), fig.bbox.width, fig.bbox.height
    texts = list(fig.texts)  # the suptitle; then each panel's titles, axis labels, legend and annotations
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += ax.get_legend().get_texts() if ax.get_legend() else []
    for text in texts:
        if isinstance(text, Text) and text.get_visible() and text.get_text().strip():
            box = text.get_window_extent(renderer)
            assert box.x0 >= -0.5 and box.x1 <= width + 0.5 and box.y0 >= -0.5 and box.y1 <= height + 0.5, \
                (text.get_text(), box, width, height)


def _lines_inside(fig) -> int:
    checked = 0
    for ax in fig.axes:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        for line in ax.get_lines():
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                if x0 <= x <= x1 and math.isfinite(y) and line.get_label() not in ("_nolegend_",):
                    assert y0 <= y <= y1, (line.get_label(), x, y, (y0, y1))
                    checked += 1
    return checked


def test_loss_curves_keep_every_seed_and_the_first_steps_in_their_frame(monkeypatch):
    steps = list(range(1, 101))
    def run(seed, level):  # a loss falling from ~ln V, seeds spread far more than their mean moves late
        return (seed, steps, [9.0 * math.exp(-s / 8) + level + 0.3 * seed * (s > 50) for s in steps])
    curves = {"baseline": [run(0, 3.0), run(3, 3.0)], "opt": [run(1, 2.9), run(2, 2.95)]}
    fig = _drawn(monkeypatch, lambda: plots.plot_loss_curves(curves, "x.png"))
    assert _lines_inside(fig) > 400
    _texts_inside(fig)
    assert any(max(line.get_ydata()) > 9 for line in fig.axes[0].get_lines())  # the whole run is drawn too


@pytest.mark.parametrize("arms", [1, 2, 6])
def test_paired_delta_titles_and_labels_fit_the_figure(monkeypatch, arms):
    contrast = {"deltas": [-0.01, -0.02, 0.005], "seeds": [41, 42, 47], "estimable": True, "ci95": [-0.04, 0.02],
                "mean_delta": -0.0083, "decision": "inconclusive"}
    contrasts = {f"an_arm_with_a_long_name_{i} - baseline": contrast for i in range(arms)}
    fig = _drawn(monkeypatch, lambda: plots.plot_paired_deltas(contrasts, "x.png", "holdout_bpb", 0.0005, "baseline"))
    _texts_inside(fig)
    assert any(isinstance(o, Line2D) for o in fig.axes[0].get_children())
