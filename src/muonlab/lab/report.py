"""Experiment report from a run ledger: per-arm mean ± SD, paired contrasts against a baseline
arm with 95% t-intervals and a preregistered decision, failed runs, protocol warnings, plots.

The report needs only the ledger (so ledgers from other machines can be analysed); training
curves are drawn where a run's directory is present (at its recorded `run_dir`, or beside
the ledger as `<ledger dir>/<run_id>/`). Statistics follow spec-002 §3.4 and spec-000-003 §3
(see `muonlab.lab.stats`); the decision threshold is seed 003's preregistered 0.0005 BPB.

Rules that decide what goes into the numbers:
- only `ok` runs enter the statistics; `failed` and `diverged` runs are listed, every one;
- an (arm, seed) with several `ok` runs uses the latest (by `finished_at`, else ledger
  order), and the report says so;
- a malformed ledger line is skipped and reported with its line number;
- `metric` is any numeric key of a record's `metrics` (val_bpb, holdout_bpb, val_ce, ...);
  lower is better except for throughput-like keys in `HIGHER_IS_BETTER`.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

from muonlab.atomic import write_json, write_text
from muonlab.errors import MuonlabError, UsageError
from muonlab.lab.stats import DecisionRule, paired_contrast, summarize_arm, t_quantile
from muonlab.record.ledger import STATUSES, read_records_tolerant

DEFAULT_THRESHOLD = 0.0005  # BPB; seed 003's preregistered practical separation rule
BPB_METRICS = ("val_bpb", "holdout_bpb")
HIGHER_IS_BETTER = frozenset({"tokens_per_second", "mfu_percent"})
# Config keys that never change a result (config.BOOKKEEPING_FIELDS, download settings) plus
# the seed, which arms are paired over.
IGNORED_KEYS = frozenset({"arm", "seed", "run_name", "runs_dir", "ledger", "log_every", "quiet",
                          "data.cache_dir", "data.download_workers", "data.download_retries",
                          "data.download_backoff_s", "data.download_timeout_s"})
# What every arm must share when its own overrides are not known.
PROTOCOL_KEYS = ("data.source", "num_steps", "time_budget", "total_batch_size", "sequence_len",
                 "eval_tokens", "data.vocab_size", "depth")
CURVE_FILE = "metrics.jsonl"
PLOT_FILES = {"loss_curves": "loss_curves.png", "paired_deltas": "paired_deltas.png",
              "forest": "forest.png"}


# ---------------------------------------------------------------------------- ledger input
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


def _finished(record: Mapping[str, Any]) -> datetime | None:
    try:
        return datetime.strptime(str(record.get("finished_at")), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return None


def _latest(records: list[dict]) -> dict:
    stamps = [_finished(r) for r in records]
    if all(s is not None for s in stamps):
        return max(zip(stamps, records), key=lambda p: (p[0], p[1]["_line"]))[1]
    return max(records, key=lambda r: r["_line"])


# ---------------------------------------------------------------------------- curves
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


def load_curve(record: Mapping[str, Any], ledger_dir: Path) -> tuple[Curve | None, str | None]:
    """(curve, None), or (None, a note saying why there is none); bad lines are skipped."""
    run_id = str(record.get("run_id", "?"))
    run_dir = find_run_dir(record, ledger_dir)
    if run_dir is None:
        return None, f"no run directory with {CURVE_FILE} for run {run_id}"
    steps, values, bad, key = [], [], 0, None
    with open(run_dir / CURVE_FILE, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
                key = key or ("smooth_loss" if "smooth_loss" in row else "loss")
                step, value = int(row["step"]), float(row[key])
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            if math.isfinite(value):
                steps.append(step)
                values.append(value)
    if not steps:
        return None, f"run {run_id}: {run_dir / CURVE_FILE} holds no readable loss values"
    note = f"run {run_id}: skipped {bad} unreadable line(s) of {CURVE_FILE}" if bad else None
    return Curve(record["arm"], record["seed"], run_id, steps, values, key), note


# ---------------------------------------------------------------------------- protocol
def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'data': {'source': 'x'}} -> {'data.source': 'x'}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _override_keys(overrides: Iterable[str] | Mapping[str, Any]) -> set[str]:
    if isinstance(overrides, Mapping):
        return set(flatten(overrides))
    return set(overrides)


def _is_overridden(key: str, overridden: set[str]) -> bool:
    # an override named without its section ('vocab_size') also covers 'data.vocab_size'
    return any(key == k or key.endswith("." + k) for k in overridden)


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    absent = "<absent>"
    return {k: (a.get(k, absent), b.get(k, absent)) for k in sorted(set(a) | set(b))
            if k not in IGNORED_KEYS and a.get(k, absent) != b.get(k, absent)}


def _show(diffs: Mapping[str, tuple[Any, Any]], limit: int = 6) -> str:
    items = [f"{k}={a!r} vs {b!r}" for k, (a, b) in list(diffs.items())[:limit]]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return ", ".join(items) + more


def check_protocol(runs: Mapping[str, list[dict]], baseline: str,
                   arm_overrides: Mapping[str, Any] | None = None
                   ) -> tuple[list[str], dict[str, dict[str, list]], list[str]]:
    """Compare resolved configs: within each arm across seeds, and each arm against the baseline.

    Within an arm every seed must share one config (seed and bookkeeping aside). Across arms,
    where `arm_overrides` names both arms' override keys, everything else must match; where it
    does not, only PROTOCOL_KEYS are compared. Returns (warnings, per-arm differences from the
    baseline for the report, notes).
    """
    warnings, notes, settings = [], [], {}
    overrides = {arm: _override_keys(v) for arm, v in (arm_overrides or {}).items()}
    reference: dict[str, dict] = {}
    for arm, records in runs.items():
        configs = [(r["seed"], r.get("config")) for r in sorted(records, key=lambda r: r["seed"])]
        missing = [seed for seed, cfg in configs if not isinstance(cfg, dict)]
        if missing:
            warnings.append(f"arm {arm!r}: no config recorded for seed(s) {missing}; protocol not checked")
        configs = [(seed, flatten(cfg)) for seed, cfg in configs if isinstance(cfg, dict)]
        if not configs:
            continue
        seed0, first = configs[0]
        reference[arm] = first
        for seed, flat in configs[1:]:
            diffs = _differences(flat, first)
            if diffs:
                warnings.append(f"PROTOCOL MISMATCH within arm {arm!r}: seed {seed} differs from "
                                f"seed {seed0} in {_show(diffs)}")
    base = reference.get(baseline)
    if base is None:
        return warnings, settings, notes
    unknown = []
    for arm, flat in reference.items():
        if arm == baseline:
            continue
        diffs = _differences(flat, base)
        settings[arm] = {k: [a, b] for k, (a, b) in diffs.items()}
        if arm in overrides and baseline in overrides:
            allowed = overrides[arm] | overrides[baseline]
            bad = {k: v for k, v in diffs.items() if not _is_overridden(k, allowed)}
            where = "outside its overrides"
        else:
            unknown.append(arm)
            bad = {k: v for k, v in diffs.items() if k in PROTOCOL_KEYS}
            where = "in protocol settings"
        if bad:
            warnings.append(f"PROTOCOL MISMATCH: arm {arm!r} differs from baseline {baseline!r} "
                            f"{where}: {_show(bad)}; its contrast compares different protocols")
    if unknown:
        notes.append(f"overrides unknown for arm(s) {', '.join(unknown)}: only the protocol keys "
                     f"({', '.join(PROTOCOL_KEYS)}) were compared with the baseline")
    return warnings, settings, notes


def _provenance_warning(records: Iterable[dict]) -> str | None:
    envs = set()
    for r in records:
        prov = r.get("provenance") if isinstance(r.get("provenance"), dict) else {}
        envs.add((prov.get("device_name"), prov.get("torch"), prov.get("cuda")))
    if len(envs) > 1:
        shown = "; ".join(f"device {d}, torch {t}, cuda {c}" for d, t, c in sorted(envs, key=str))
        return f"runs come from {len(envs)} different device/software setups ({shown})"
    return None


# ---------------------------------------------------------------------------- analysis
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
    report, curves = _analyse(Path(ledger_path), baseline, metric, threshold, rule, arm_overrides)
    if out_dir is not None:
        write_report(report, out_dir, curves)
    return report


def run_report(ledger_path: str | os.PathLike, baseline: str = "baseline", metric: str = "val_bpb",
               threshold: float = DEFAULT_THRESHOLD, out_dir: str | os.PathLike | None = None,
               **options: Any) -> dict[str, Any]:
    """build_report, writing into `out_dir` (default `<ledger dir>/report/`)."""
    out_dir = Path(out_dir) if out_dir is not None else Path(ledger_path).parent / "report"
    return build_report(ledger_path, baseline, metric, threshold, out_dir, **options)


def _analyse(ledger: Path, baseline: str, metric: str, threshold: float, rule_kind: str,
             arm_overrides: Mapping[str, Any] | None) -> tuple[dict, dict[str, list[Curve]]]:
    if not isinstance(metric, str) or not metric:
        raise UsageError(f"metric must be a metrics key such as val_bpb, got {metric!r}")
    rule = DecisionRule(threshold, rule_kind, higher_is_better=metric in HIGHER_IS_BETTER)
    records, problems = load_ledger(ledger)
    warnings = [f"ledger {p}; skipped" for p in problems]
    notes: list[str] = []

    arms = list(dict.fromkeys(r["arm"] for r in records))  # ledger order of first appearance
    ok = [r for r in records if r["status"] == "ok"]
    failed = [r for r in records if r["status"] != "ok"]
    if not ok:
        raise MuonlabError(f"no runs with status 'ok' in {ledger} ({len(failed)} failed or diverged, "
                           f"{len(problems)} malformed line(s)); nothing to report")
    ok_arms = {r["arm"] for r in ok}
    if baseline not in ok_arms:
        raise UsageError(f"baseline arm {baseline!r} has no ok runs in {ledger}; arms with ok runs: "
                         f"{', '.join(a for a in arms if a in ok_arms)}")
    if not any(metric_value(r, metric) is not None for r in ok):
        numeric = sorted({k for r in ok for k in (r.get("metrics") or {}) if metric_value(r, k) is not None})
        raise UsageError(f"metric {metric!r} has no numeric value in any ok run; numeric metrics in "
                         f"this ledger: {', '.join(numeric) or 'none'}")

    # One ok run per (arm, seed): the latest, said out loud.
    grouped: dict[tuple[str, int], list[dict]] = {}
    for r in ok:
        grouped.setdefault((r["arm"], r["seed"]), []).append(r)
    chosen: dict[tuple[str, int], dict] = {}
    for (arm, seed), group in grouped.items():
        chosen[arm, seed] = _latest(group)
        if len(group) > 1:
            ids = ", ".join(f"{g.get('run_id')} (line {g['_line']})" for g in group)
            warnings.append(f"arm {arm!r} seed {seed}: {len(group)} ok runs ({ids}); using the latest, "
                            f"{chosen[arm, seed].get('run_id')}")
    runs_by_arm = {arm: [r for (a, _s), r in sorted(chosen.items(), key=lambda kv: kv[0][1]) if a == arm]
                   for arm in arms}

    metrics = [metric] + [m for m in BPB_METRICS if m != metric
                          and any(metric_value(r, m) is not None for r in chosen.values())]
    ordered = [baseline] + [a for a in arms if a != baseline]
    tables: dict[str, dict] = {}
    for m in metrics:
        m_rule = DecisionRule(threshold, rule_kind, higher_is_better=m in HIGHER_IS_BETTER)
        values = {arm: {r["seed"]: metric_value(r, m) for r in runs_by_arm[arm]} for arm in ordered}
        for arm, per_seed in values.items():
            missing = sorted(s for s, v in per_seed.items() if v is None)
            if missing:
                (warnings if m == metric else notes).append(
                    f"arm {arm!r}: {m} missing or not finite for ok seed(s) {missing}; left out")
        values = {arm: {s: v for s, v in per_seed.items() if v is not None}
                  for arm, per_seed in values.items()}
        summaries = {arm: summarize_arm(arm, values[arm]) for arm in ordered}
        contrasts = {arm: paired_contrast(values[arm], values[baseline], f"{arm} - {baseline}", m_rule)
                     for arm in ordered if arm != baseline}
        tables[m] = {"arms": summaries, "contrasts": contrasts}

    primary = tables[metric]
    base_seeds = set(primary["arms"][baseline].seeds)
    for arm, contrast in primary["contrasts"].items():
        unpaired = sorted(set(primary["arms"][arm].seeds) - base_seeds)
        lacking = sorted(base_seeds - set(primary["arms"][arm].seeds))
        if unpaired:
            warnings.append(f"arm {arm!r}: seed(s) {unpaired} have no ok baseline run and are left "
                            f"out of its paired contrast")
        if lacking:
            warnings.append(f"arm {arm!r}: no ok run with a {metric} value for baseline seed(s) {lacking}")
        if not contrast.estimable:
            warnings.append(f"contrast {contrast.name}: {contrast.reason}")
    for arm in arms:
        bad = [r for r in failed if r["arm"] == arm]
        if bad:
            warnings.append(f"arm {arm!r}: {len(bad)} run(s) failed or diverged (seed(s) "
                            f"{sorted({r['seed'] for r in bad})}); its statistics cover only ok runs")

    protocol_warnings, settings, protocol_notes = check_protocol(runs_by_arm, baseline, arm_overrides)
    warnings.extend(protocol_warnings)
    notes.extend(protocol_notes)
    prov = _provenance_warning(chosen.values())
    if prov:
        warnings.append(prov)

    curves: dict[str, list[Curve]] = {}
    curve_status: dict[str, dict] = {}
    curve_notes: list[str] = []
    for arm in ordered:
        found, missing = [], []
        for r in runs_by_arm[arm]:
            curve, note = load_curve(r, ledger.parent)
            if curve is not None:
                found.append(curve)
            else:
                missing.append(str(r.get("run_id")))
            if note:
                curve_notes.append(note)
        if found:
            curves[arm] = found
        curve_status[arm] = {"runs_with_curves": len(found), "runs_without": missing}
    if curves:
        notes.extend(curve_notes)
    else:  # a ledger from another machine: one line, not one per run
        notes.append(f"no run directory with {CURVE_FILE} found for any of the {len(chosen)} runs used: "
                     f"training-loss curves not drawn")

    base_cfg = (runs_by_arm[baseline][0].get("config") or {}) if runs_by_arm[baseline] else {}
    flat_base = flatten(base_cfg) if isinstance(base_cfg, dict) else {}
    report = {
        "ledger": str(ledger),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "metric": metric,
        "metrics": metrics,
        "baseline": baseline,
        "threshold": threshold,
        "decision_rule": {"kind": rule.kind, "threshold": threshold,
                          "higher_is_better": rule.higher_is_better, "text": rule.describe()},
        "protocol": {
            "statistics": "per arm mean ± sample SD (n−1); paired Δ = arm − baseline per seed; "
                          "95% t-interval mean ± t_{0.975,n−1}·SD/√n; no multiplicity adjustment",
            "t_975_n3": t_quantile(3),
            "seeds": sorted({r["seed"] for r in chosen.values()}),
            "baseline_settings": {k: flat_base.get(k) for k in PROTOCOL_KEYS},
        },
        "counts": {"records": len(records), "ok": len(ok),
                   "failed": sum(r["status"] == "failed" for r in records),
                   "diverged": sum(r["status"] == "diverged" for r in records),
                   "malformed_lines": len(problems), "ok_used": len(chosen)},
        "arms": {arm: {**primary["arms"][arm].to_dict(),
                       "run_ids": [str(r.get("run_id")) for r in runs_by_arm[arm]
                                   if metric_value(r, metric) is not None]}
                 for arm in ordered},
        "contrasts": {arm: _contrast_dict(c, arm, baseline, metric)
                      for arm, c in primary["contrasts"].items()},
        "secondary": {m: {"arms": {a: s.to_dict() for a, s in tables[m]["arms"].items()},
                          "contrasts": {a: _contrast_dict(c, a, baseline, m)
                                        for a, c in tables[m]["contrasts"].items()}}
                      for m in metrics[1:]},
        "failed_runs": [_failed_dict(r) for r in failed],
        "arm_settings": settings,
        "curves": curve_status,
        "warnings": warnings,
        "notes": notes,
        "ledger_problems": problems,
    }
    return report, curves


def _contrast_dict(contrast, arm: str, baseline: str, metric: str) -> dict:
    return {"name": contrast.name, "arm": arm, "reference": baseline, "metric": metric,
            **contrast.to_dict()}


def _failed_dict(record: Mapping[str, Any]) -> dict:
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    error = str(record.get("error") or "").strip().splitlines()
    return {"run_id": record.get("run_id"), "arm": record["arm"], "seed": record["seed"],
            "status": record["status"], "line": record["_line"],
            "diverged_step": metrics.get("diverged_step"), "error": error[0][:200] if error else None}


# ---------------------------------------------------------------------------- output
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


def fmt(value: float | None, signed: bool = False) -> str:
    """6 decimals for BPB-sized numbers (as the papers print), fewer for large ones."""
    if value is None:
        return "n/a"
    sign = "+" if signed else ""
    if abs(value) >= 1000:
        return f"{value:{sign},.1f}"
    return f"{value:{sign}.6f}"


def _mean_sd(summary: Mapping[str, Any]) -> str:
    if not summary or summary.get("n", 0) == 0:
        return "no ok runs"
    sd = f" ± {fmt(summary['sd'])}" if summary.get("sd") is not None else " (n = 1, no SD)"
    return fmt(summary["mean"]) + sd


def _ci(contrast: Mapping[str, Any]) -> str:
    ci = contrast.get("ci95")
    return f"[{fmt(ci[0], True)}, {fmt(ci[1], True)}]" if ci else "n/a"


def _per_seed(contrast: Mapping[str, Any]) -> str:
    return ", ".join(f"s{s}: {fmt(d, True)}" for s, d in zip(contrast["seeds"], contrast["deltas"])) or "—"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _contrast_row(c: Mapping[str, Any]) -> str:
    if not c["estimable"]:
        return _row(c["name"], c["n"], "not estimable", "n/a", "n/a", c["decision"], _per_seed(c))
    return _row(c["name"], c["n"], f"{fmt(c['mean_delta'], True)} ± {fmt(c['sd_delta'])}", _ci(c),
                f"{c['seeds_improved']}/{c['n']}", f"**{c['decision']}**", _per_seed(c))


def _value_of(table: Mapping[str, Any] | None, seed: int) -> str:
    if not table or seed not in table.get("seeds", []):
        return "n/a"
    return fmt(table["values"][table["seeds"].index(seed)])


def _failure_detail(f: Mapping[str, Any]) -> str:
    if f["diverged_step"] is not None:
        return f"diverged at step {f['diverged_step']}"
    return (f["error"] or "").replace("|", "/")


def render_markdown(report: Mapping[str, Any]) -> str:
    """report.md: protocol, warnings, per-arm per-seed tables, contrasts, failed runs, plots."""
    metric, baseline, protocol = report["metric"], report["baseline"], report["protocol"]
    shown = [metric] + [m for m in BPB_METRICS if m != metric and m in report["secondary"]]
    tables = {metric: report["arms"], **{m: t["arms"] for m, t in report["secondary"].items()}}
    counts = report["counts"]
    settings = ", ".join(f"{k} = {v}" for k, v in protocol["baseline_settings"].items())
    lines = [f"# Experiment report: {Path(report['ledger']).name}", "",
             f"Ledger `{report['ledger']}`, generated {report['generated_at']}.", "", "## Protocol", "",
             f"- Primary metric: `{metric}`; baseline arm: `{baseline}`.",
             f"- Statistics: {protocol['statistics']} (t_0.975,2 = {protocol['t_975_n3']:.6f}).",
             f"- Decision rule: {report['decision_rule']['text']}. "
             f"A contrast with fewer than 2 paired seeds is not estimable.",
             f"- Runs: {counts['records']} ledger records, {counts['ok']} ok ({counts['ok_used']} used after "
             f"de-duplication), {counts['failed']} failed, {counts['diverged']} diverged, "
             f"{counts['malformed_lines']} malformed line(s). Only ok runs enter the statistics; every "
             f"failed or diverged run is listed below.",
             f"- Seeds: {', '.join(map(str, protocol['seeds']))}.",
             f"- Baseline settings: {settings}.", ""]
    if report["warnings"]:
        lines += ["## Warnings", ""]
        lines += [f"- **{w}**" if w.startswith("PROTOCOL") else f"- {w}" for w in report["warnings"]]
        lines.append("")

    lines += ["## Arms", "", _row("arm", "n", *(f"{m} mean ± SD" for m in shown)),
              _row(*["---"] * (2 + len(shown)))]
    for arm, summary in report["arms"].items():
        lines.append(_row(arm, summary["n"], *(_mean_sd(tables[m].get(arm)) for m in shown)))
    lines.append("")
    for arm, summary in report["arms"].items():
        lines += [f"### {arm}", "", _row("seed", "run", *shown), _row(*["---"] * (2 + len(shown)))]
        for seed, run_id in zip(summary["seeds"], summary["run_ids"]):
            lines.append(_row(seed, run_id, *(_value_of(tables[m].get(arm), seed) for m in shown)))
        for f in (f for f in report["failed_runs"] if f["arm"] == arm):
            lines.append(_row(f["seed"], f["run_id"], *[f["status"]] * len(shown)))
        lines += [_row("**mean ± SD**", f"n = {summary['n']}", *(_mean_sd(tables[m].get(arm)) for m in shown)), ""]
        diffs = report["arm_settings"].get(arm)
        if diffs:
            lines += ["Settings that differ from the baseline: " +
                      ", ".join(f"`{k}` = {a!r} (baseline {b!r})" for k, (a, b) in diffs.items()), ""]

    header = [_row("contrast", "n", "mean Δ ± SD", "95% CI", "improved", "decision", "per-seed Δ"),
              _row(*["---"] * 7)]
    lines += [f"## Contrasts vs `{baseline}` ({metric}; Δ < 0 means lower)", ""] + header
    lines += [_contrast_row(c) for c in report["contrasts"].values()] + [""]
    for m, table in report["secondary"].items():
        lines += [f"### Secondary metric: {m} (same rule and θ; {metric} is the primary endpoint)", ""]
        lines += header + [_contrast_row(c) for c in table["contrasts"].values()] + [""]

    lines += ["## Failed and diverged runs", ""]
    if report["failed_runs"]:
        lines += [_row("run", "arm", "seed", "status", "detail"), _row(*["---"] * 5)]
        lines += [_row(f["run_id"], f["arm"], f["seed"], f["status"], _failure_detail(f))
                  for f in report["failed_runs"]]
    else:
        lines.append("None.")
    lines.append("")
    plots = (report.get("files") or {}).get("plots", {})
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({Path(path).name})" for name, path in plots.items()] + [""]
    if report["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in report["notes"]] + [""]
    return "\n".join(lines)


def format_text(report: Mapping[str, Any]) -> str:
    """Compact terminal tables: arms, contrasts, failures, warnings."""
    metric, baseline, contrasts = report["metric"], report["baseline"], report["contrasts"]
    extra = [m for m in report["secondary"] if m in BPB_METRICS]
    w = max([len(a) for a in report["arms"]] + [len(c["name"]) for c in contrasts.values()] + [8])
    out = [f"report of {report['ledger']}: metric {metric}, baseline {baseline}, "
           f"rule {report['decision_rule']['kind']} (θ = {report['threshold']:g})", "",
           f"{'arm':<{w}}  {'n':>2}  " + "  ".join(f"{m + ' mean ± SD':<24}" for m in [metric] + extra)]
    for arm, summary in report["arms"].items():
        cells = [_mean_sd(summary)] + [_mean_sd(report["secondary"][m]["arms"].get(arm)) for m in extra]
        out.append(f"{arm:<{w}}  {summary['n']:>2}  " + "  ".join(f"{c:<24}" for c in cells))
    out.append("")
    if not contrasts:
        out.append(f"no contrasts: {baseline} is the only arm in the ledger")
    else:
        out.append(f"{'contrast':<{w}}  {'n':>2}  {'mean Δ ± SD':<22}  {'95% CI':<24}  {'k/n':<5}  decision")
    for c in contrasts.values():
        if not c["estimable"]:
            out.append(f"{c['name']:<{w}}  {c['n']:>2}  {c['reason']}")
            continue
        mean_sd = f"{fmt(c['mean_delta'], True)} ± {fmt(c['sd_delta'])}"
        k = f"{c['seeds_improved']}/{c['n']}"
        out.append(f"{c['name']:<{w}}  {c['n']:>2}  {mean_sd:<22}  {_ci(c):<24}  {k:<5}  {c['decision']}")
    if report["failed_runs"]:
        out += ["", f"failed/diverged runs ({len(report['failed_runs'])}):"]
        out += [f"  {f['arm']} seed {f['seed']}: {f['status']} ({f['run_id']})" for f in report["failed_runs"]]
    if report["warnings"]:
        out += ["", f"warnings ({len(report['warnings'])}):"] + [f"  - {x}" for x in report["warnings"]]
    files = report.get("files")
    if files:
        written = [files["report_md"], files["report_json"], *files["plots"].values()]
        out += ["", "wrote " + ", ".join(written)]
    return "\n".join(out)
