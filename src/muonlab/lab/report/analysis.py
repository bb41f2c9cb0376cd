"""Report analysis: ledger records -> the report as a JSON-ready dict.

Per-arm mean ± SD, paired contrasts against a baseline arm with 95% t-intervals and a
preregistered decision (spec-002 §3.4, spec-000-003 §3, computed by `muonlab.lab.stats`; the
threshold is seed 003's preregistered 0.0005 BPB), failed runs, protocol warnings.

Rules that decide what goes into the numbers:
- only `ok` runs enter the statistics; `failed`, `diverged` and `interrupted` runs are listed,
  every one, except an interrupted run that was resumed to `ok` (same run_id);
- an (arm, seed) with several `ok` runs uses the latest (by `finished_at`, else ledger
  order), and the report says so;
- a malformed ledger line is skipped and reported with its line number;
- `metric` is any numeric key of a record's `metrics` (val_bpb, holdout_bpb, val_ce, ...);
  lower is better except for throughput-like keys in `HIGHER_IS_BETTER`.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from muonlab.errors import MuonlabError, UsageError
from muonlab.lab.report.loading import CURVE_FILE, Curve, load_curves, load_ledger, metric_value
from muonlab.lab.report.protocol import PROTOCOL_KEYS, check_protocol, comparable, provenance_warning
from muonlab.lab.stats import DecisionRule, paired_contrast, summarize_arm, t_quantile

DEFAULT_THRESHOLD = 0.0005  # BPB; seed 003's preregistered practical separation rule
BPB_METRICS = ("val_bpb", "holdout_bpb")
HIGHER_IS_BETTER = frozenset({"tokens_per_second", "mfu_percent"})


def analyse(ledger: Path, baseline: str, metric: str, threshold: float, rule_kind: str,
            arm_overrides: Mapping[str, Any] | None) -> tuple[dict, dict[str, list[Curve]]]:
    """(the report dict, the training-loss curves found per arm) of one ledger.

    Raises UsageError for a missing ledger, an unknown baseline or metric, MuonlabError when
    the ledger has no ok run.
    """
    if not isinstance(metric, str) or not metric:
        raise UsageError(f"metric must be a metrics key such as val_bpb, got {metric!r}")
    rule = DecisionRule(threshold, rule_kind, higher_is_better=metric in HIGHER_IS_BETTER)
    records, problems = load_ledger(ledger)
    warnings = [f"ledger {p}; skipped" for p in problems]
    notes: list[str] = []

    arms = list(dict.fromkeys(r["arm"] for r in records))  # ledger order of first appearance
    ok = [r for r in records if r["status"] == "ok"]
    resumed = {r.get("run_id") for r in ok}
    failed = [r for r in records if r["status"] != "ok"
              and not (r["status"] == "interrupted" and r.get("run_id") in resumed)]
    _require_reportable(ledger, arms, ok, failed, problems, baseline, metric)

    chosen, duplicates = _one_run_per_seed(ok)
    warnings += duplicates
    runs_by_arm = {arm: [r for (a, _s), r in sorted(chosen.items(), key=lambda kv: kv[0][1]) if a == arm]
                   for arm in arms}
    metrics = [metric] + [m for m in BPB_METRICS if m != metric
                          and any(metric_value(r, m) is not None for r in chosen.values())]
    ordered = [baseline] + [a for a in arms if a != baseline]
    tables: dict[str, dict] = {}
    for m in metrics:
        tables[m], missing = _metric_table(runs_by_arm, ordered, baseline, m, threshold, rule_kind)
        (warnings if m == metric else notes).extend(missing)

    primary = tables[metric]
    warnings += _pairing_warnings(primary, baseline, metric)
    warnings += _failure_warnings(arms, failed)
    protocol_warnings, settings, protocol_notes = check_protocol(runs_by_arm, baseline, arm_overrides)
    warnings.extend(protocol_warnings)
    notes.extend(protocol_notes)
    prov = provenance_warning(chosen.values())
    if prov:
        warnings.append(prov)
    older = [r for r in chosen.values() if isinstance(r.get("config"), dict) and comparable(r["config"])[1]]
    if older:  # hashes of format 1 cannot match today's: the runs are compared by their converted configs
        warnings.append(f"{len(older)} run(s) were recorded by an older muonlab (config format 1, hash "
                        f"{older[0].get('config_hash')}...): their configs were converted to today's "
                        "settings for the protocol checks; a sweep will not recognise them as done")

    curves, curve_status, curve_notes = load_curves(runs_by_arm, ordered, ledger.parent)
    if curves:
        notes.extend(curve_notes)
    else:  # a ledger from another machine: one line, not one per run
        notes.append(f"no run directory with {CURVE_FILE} found for any of the {len(chosen)} runs used: "
                     f"training-loss curves not drawn")

    base_cfg = (runs_by_arm[baseline][0].get("config") or {}) if runs_by_arm[baseline] else {}
    flat_base = comparable(base_cfg)[0] if isinstance(base_cfg, dict) else {}
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
                   "interrupted": sum(r["status"] == "interrupted" for r in records),
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


def _require_reportable(ledger: Path, arms: list[str], ok: list[dict], failed: list[dict],
                        problems: list[str], baseline: str, metric: str) -> None:
    """Refuse a ledger with no ok run, a baseline without ok runs, or a metric no run has."""
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


def _one_run_per_seed(ok: list[dict]) -> tuple[dict[tuple[str, int], dict], list[str]]:
    """The latest ok run of each (arm, seed), and a warning for each (arm, seed) that had several."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for r in ok:
        grouped.setdefault((r["arm"], r["seed"]), []).append(r)
    chosen: dict[tuple[str, int], dict] = {}
    warnings = []
    for (arm, seed), group in grouped.items():
        chosen[arm, seed] = _latest(group)
        if len(group) > 1:
            ids = ", ".join(f"{g.get('run_id')} (line {g['_line']})" for g in group)
            warnings.append(f"arm {arm!r} seed {seed}: {len(group)} ok runs ({ids}); using the latest, "
                            f"{chosen[arm, seed].get('run_id')}")
    return chosen, warnings


def _metric_table(runs_by_arm: Mapping[str, list[dict]], ordered: list[str], baseline: str, metric: str,
                  threshold: float, rule_kind: str) -> tuple[dict, list[str]]:
    """Per-arm summaries and paired contrasts of one metric, and a message per arm whose ok
    runs lack the metric (those seeds are left out)."""
    rule = DecisionRule(threshold, rule_kind, higher_is_better=metric in HIGHER_IS_BETTER)
    values = {arm: {r["seed"]: metric_value(r, metric) for r in runs_by_arm[arm]} for arm in ordered}
    messages = []
    for arm, per_seed in values.items():
        missing = sorted(s for s, v in per_seed.items() if v is None)
        if missing:
            messages.append(f"arm {arm!r}: {metric} missing or not finite for ok seed(s) {missing}; left out")
    values = {arm: {s: v for s, v in per_seed.items() if v is not None} for arm, per_seed in values.items()}
    summaries = {arm: summarize_arm(arm, values[arm]) for arm in ordered}
    contrasts = {arm: paired_contrast(values[arm], values[baseline], f"{arm} - {baseline}", rule)
                 for arm in ordered if arm != baseline}
    return {"arms": summaries, "contrasts": contrasts}, messages


def _pairing_warnings(primary: dict, baseline: str, metric: str) -> list[str]:
    """Seeds that cannot be paired with the baseline, and contrasts that are not estimable."""
    warnings = []
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
    return warnings


def _failure_warnings(arms: list[str], failed: list[dict]) -> list[str]:
    warnings = []
    for arm in arms:
        bad = [r for r in failed if r["arm"] == arm]
        if bad:
            warnings.append(f"arm {arm!r}: {len(bad)} run(s) failed or diverged (seed(s) "
                            f"{sorted({r['seed'] for r in bad})}); its statistics cover only ok runs")
    return warnings


def _contrast_dict(contrast, arm: str, baseline: str, metric: str) -> dict:
    return {"name": contrast.name, "arm": arm, "reference": baseline, "metric": metric,
            **contrast.to_dict()}


def _failed_dict(record: Mapping[str, Any]) -> dict:
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    error = str(record.get("error") or "").strip().splitlines()
    return {"run_id": record.get("run_id"), "arm": record["arm"], "seed": record["seed"],
            "status": record["status"], "line": record["_line"],
            "diverged_step": metrics.get("diverged_step"), "error": error[0][:200] if error else None}
