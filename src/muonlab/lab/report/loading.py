"""Report input: ledger lines -> usable run records (malformed lines reported by number), and
run directories -> training-loss curves.

The report needs only the ledger (so ledgers from other machines can be analysed); curves are
read where a run's directory is present, at its recorded `run_dir` or beside the ledger as
`<ledger dir>/<run_id>/`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from muonlab.errors import UsageError
from muonlab.record.ledger import STATUSES, read_records_tolerant
from muonlab.record.rundir import periodic_evals, read_posthoc

CURVE_FILE = "metrics.jsonl"


def load_ledger(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """Read every usable record; each unusable line becomes a problem naming its line number.

    A record needs a string `arm`, an integer `seed` and a `status` in ledger.STATUSES.
    Each kept record gets `_line` (its 1-based line number) for ordering and messages.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"ledger not found: {path}")
    return read_records_tolerant(path, validate=_record_issue)


def _record_issue(record: dict) -> str | None:
    if not isinstance(record.get("arm"), str) or not record["arm"]:
        return "missing or empty 'arm'"
    seed = record.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        return f"'seed' is not an integer ({seed!r})"
    if record.get("status") not in STATUSES:
        return f"'status' is {record.get('status')!r}, not one of {', '.join(STATUSES)}"
    return None


def metric_value(record: Mapping[str, Any], metric: str) -> float | None:
    """The record's metric as a finite float, or None (absent, non-numeric, NaN or inf)."""
    metrics = record.get("metrics")
    value = metrics.get(metric) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass
class Curve:
    """One run's training-loss trajectory from its metrics.jsonl."""

    arm: str
    seed: int
    run_id: str
    steps: list[int]
    values: list[float]
    key: str  # smooth_loss (upstream's printed EMA) or loss


def find_run_dir(record: Mapping[str, Any], ledger_dir: Path) -> Path | None:
    """The run directory recorded in the ledger, else `<ledger dir>/<run_id>` (the default
    layout puts the ledger in runs_dir beside the run directories), if it has metrics."""
    candidates = []
    if record.get("run_dir"):
        candidates.append(Path(str(record["run_dir"])).expanduser())
    if record.get("run_id"):
        candidates.append(ledger_dir / str(record["run_id"]))
    for candidate in candidates:
        if (candidate / CURVE_FILE).is_file():
            return candidate
    return None


def load_curve(record: Mapping[str, Any], ledger_dir: Path, key: str | None = None
               ) -> tuple[Curve | None, str | None]:
    """(curve, None), or (None, a note saying why there is none); bad lines are skipped.

    `key` picks the metric; by default smooth_loss where the file has it, else loss. Lines
    without an explicitly named key are not counted as unreadable (periodic metrics such as
    val_bpb sit on some steps only)."""
    run_id = str(record.get("run_id", "?"))
    run_dir = find_run_dir(record, ledger_dir)
    if run_dir is None:
        return None, f"no run directory with {CURVE_FILE} for run {run_id}"
    steps, values, bad = [], [], 0
    explicit = key is not None
    with open(run_dir / CURVE_FILE, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
                if explicit and isinstance(row, dict) and key not in row:
                    continue
                key = key or ("smooth_loss" if "smooth_loss" in row else "loss")
                step, value = int(row["step"]), float(row[key])
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            if math.isfinite(value):
                steps.append(step + 1)  # steps done: metrics.jsonl's line `step` i records the state after i + 1
                values.append(value)
    if not steps:
        return None, f"run {run_id}: {run_dir / CURVE_FILE} holds no readable {key or 'loss'} values"
    note = f"run {run_id}: skipped {bad} unreadable line(s) of {CURVE_FILE}" if bad else None
    return Curve(record["arm"], record["seed"], run_id, steps, values, key), note


def load_curves(runs_by_arm: Mapping[str, list[dict]], arms: list[str], ledger_dir: Path, key: str | None = None
                ) -> tuple[dict[str, list[Curve]], dict[str, dict], list[str]]:
    """The curves of the runs used, per arm (`key` as in load_curve); a per-arm tally of runs
    with and without one; and the notes explaining each missing or partly unreadable curve."""
    curves: dict[str, list[Curve]] = {}
    status: dict[str, dict] = {}
    notes: list[str] = []
    for arm in arms:
        found, missing = [], []
        for record in runs_by_arm[arm]:
            curve, note = load_curve(record, ledger_dir, key)
            if curve is not None:
                found.append(curve)
            else:
                missing.append(str(record.get("run_id")))
            if note:
                notes.append(note)
        if found:
            curves[arm] = found
        status[arm] = {"runs_with_curves": len(found), "runs_without": missing}
    return curves, status, notes


@dataclass(frozen=True)
class Point:
    """Where in training a report compares: after `step` steps, or `tokens` training tokens. A run
    is read at its last periodic evaluation at or before the point (seed 004 compares at the last
    scheduled evaluation before its budget)."""

    step: int | None = None
    tokens: int | None = None

    def __post_init__(self):
        if (self.step is None) == (self.tokens is None):
            raise UsageError("a comparison point is a step or a token count, not both")
        if (self.step if self.step is not None else self.tokens) < 1:
            raise UsageError(f"the comparison point must be >= 1, got {self.step or self.tokens}")

    def describe(self) -> str:
        return f"step {self.step:,}" if self.step is not None else f"{self.tokens:,} tokens"


def evaluation_at(record: Mapping[str, Any], point: Point, ledger_dir: Path | None) -> dict[str, Any] | None:
    """The run's last evaluation at or before the point ({"step", "tokens", "val_bpb", ...}): a periodic one,
    from its ledger line (`evals`) or, for a line written before those were recorded, its metrics.jsonl, or its
    final evaluation where the run ended at or before the point; None when it evaluated nowhere before it."""
    evals = record.get("evals")
    run_dir = find_run_dir(record, ledger_dir or Path("."))
    if not isinstance(evals, list):
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        per_step = (config.get("train") or {}).get("total_batch_size")
        evals = periodic_evals(run_dir / CURVE_FILE, per_step) if run_dir is not None and per_step else []
    if run_dir is not None:  # and those `muonlab eval RUN --every N` scored from its checkpoints afterwards
        evals = [*evals, *read_posthoc(run_dir)]
    key = "step" if point.step is not None else "tokens"
    limit = point.step if point.step is not None else point.tokens
    due = [e for e in evals if isinstance(e, dict) and isinstance(e.get(key), int) and e[key] <= limit]
    final = final_evaluation(record)  # a run's last evaluation is its final one, at its end
    if final is not None and final[key] <= limit:
        due.append(final)
    return max(due, key=lambda e: e[key]) if due else None


def final_evaluation(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """An ok run's final evaluation as one at its end ({"step", "tokens", metrics...}), where its line records
    how far it trained (`metrics.steps` and `metrics.tokens`)."""
    metrics = record.get("metrics")
    if record.get("status") != "ok" or not isinstance(metrics, dict):
        return None
    steps, tokens = metrics.get("steps"), metrics.get("tokens")
    if not (isinstance(steps, int) and isinstance(tokens, int)) or isinstance(steps, bool):
        return None
    return {**metrics, "step": steps, "tokens": tokens}
