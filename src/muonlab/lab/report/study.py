"""One protocol's study: per-arm statistics, contrasts against the baseline, the requested
contrasts, differences-of-differences, retention ratios and single-seed decisions.

Only the runs of one protocol come in (muonlab.lab.report.grouping), so nothing here can pool two
protocols. Within it:
- only `ok` runs enter the statistics; `failed`, `diverged` and `interrupted` runs are listed,
  every one, except an interrupted run that was resumed to `ok` (same run_id);
- an (arm, seed) with several `ok` runs uses the latest (by `finished_at`, else ledger order),
  and the report says so;
- `metric` is any numeric key of a record's `metrics`; lower is better except for
  throughput-like keys in `HIGHER_IS_BETTER`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from muonlab.lab.report.grouping import Protocol
from muonlab.lab.report.loading import CURVE_FILE, Curve, load_curves, metric_value
from muonlab.lab.report.protocol import PROTOCOL_KEYS, check_protocol, provenance_warning
from muonlab.lab.report.requests import Pair, Requests
from muonlab.lab.stats import (NOT_ESTIMABLE, DecisionRule, contrast_from_deltas, difference_of_differences,
                               paired_contrast, retention, single_seed_decision, summarize_arm)
from muonlab.record.ledger import finished_time

BPB_METRICS = ("val_bpb", "holdout_bpb")
HIGHER_IS_BETTER = frozenset({"tokens_per_second", "mfu_percent"})

Values = dict[str, dict[int, float]]  # arm -> seed -> value


def val_curve_key(metric: str) -> str:
    """The periodic evaluation drawn as validation curves: the compared metric when it is a val_
    key (seed 004: val_ce), else val_bpb."""
    return metric if metric.startswith("val_") else "val_bpb"


def rule_for(metric: str, threshold: float, kind: str) -> DecisionRule:
    return DecisionRule(threshold, kind, higher_is_better=metric in HIGHER_IS_BETTER)


@dataclass
class Study:
    report: dict[str, Any]
    curves: dict[str, list[Curve]]  # training loss per arm
    val_curves: dict[str, list[Curve]]  # periodic val_curve_key(metric) per arm (runs with --eval-every)
    values: dict[str, Values]  # metric -> arm -> seed -> value, for contrasts across protocols
    protocol: Protocol


def analyse_study(protocol: Protocol, baseline: str, metric: str, threshold: float, rule_kind: str,
                  requests: Requests, arm_overrides: Mapping[str, Any] | None, ledger_dir: Path,
                  settings: Mapping[str, Any]) -> Study:
    """The study of one protocol's runs; `settings` are those that tell it from the others."""
    records = protocol.records
    warnings: list[str] = []
    notes: list[str] = []
    arms = list(dict.fromkeys(r["arm"] for r in records))
    ok = [r for r in records if r["status"] == "ok"]
    failed = not_ok_runs(records)
    chosen, duplicates = _one_run_per_seed(ok)
    warnings += duplicates
    runs_by_arm = {arm: [r for (a, _s), r in sorted(chosen.items(), key=lambda kv: kv[0][1]) if a == arm]
                   for arm in arms}
    metrics = [metric] + [m for m in BPB_METRICS if m != metric
                          and any(metric_value(r, m) is not None for r in chosen.values())]
    has_baseline = bool(runs_by_arm.get(baseline))
    ordered = ([baseline] if baseline in arms else []) + [a for a in arms if a != baseline]
    if not has_baseline:
        notes.append(f"baseline arm {baseline!r} has no ok run under this protocol: no contrasts against it")
    protocol_warnings, arm_settings, protocol_notes, refused = check_protocol(runs_by_arm, baseline, arm_overrides)
    tables: dict[str, dict] = {}
    values: dict[str, Values] = {}
    for m in metrics:
        values[m], missing = _values(runs_by_arm, ordered, m)
        (warnings if m == metric else notes).extend(missing)
        tables[m] = _tables(values[m], ordered, baseline if has_baseline else None, m,
                            rule_for(m, threshold, rule_kind), requests, refused)
    primary = tables[metric]
    if has_baseline:
        warnings += _pairing_warnings(primary, baseline, metric, refused)
    warnings += _failure_warnings(arms, failed)
    warnings += protocol_warnings
    notes += protocol_notes
    prov = provenance_warning(chosen.values())
    if prov:
        warnings.append(prov)
    curves, curve_status, curve_notes = load_curves(runs_by_arm, ordered, ledger_dir)
    val_curves, val_status, _ = load_curves(runs_by_arm, ordered, ledger_dir, key=val_curve_key(metric))
    if curves:
        notes.extend(curve_notes)
    elif chosen:  # a ledger from another machine: one line, not one per run
        notes.append(f"no run directory with {CURVE_FILE} found for any of the {len(chosen)} runs used: "
                     f"training-loss curves not drawn")
    report = {
        "protocol": protocol.id,
        "derived": protocol.derived,
        "unknown": protocol.unknown,
        "ambiguous": protocol.ambiguous,
        "unread": protocol.unread,
        "unchecked_settings": list(protocol.unchecked),
        "settings": dict(settings),
        "protocol_settings": {k: protocol.shared[k] for k in PROTOCOL_KEYS if k in protocol.shared},
        "seeds": sorted({r["seed"] for r in chosen.values()}),
        "metrics": metrics,
        "has_baseline": has_baseline,
        "counts": {"records": len(records), "ok": len(ok),
                   "failed": sum(r["status"] == "failed" for r in records),
                   "diverged": sum(r["status"] == "diverged" for r in records),
                   "interrupted": sum(r["status"] == "interrupted" for r in records), "ok_used": len(chosen)},
        "arms": {arm: {**primary["arms"][arm], "run_ids": [str(r.get("run_id")) for r in runs_by_arm[arm]
                                                           if metric_value(r, metric) is not None]}
                 for arm in ordered},
        **{k: v for k, v in primary.items() if k != "arms"},
        "secondary": {m: tables[m] for m in metrics[1:]},
        "failed_runs": [failed_dict(r) for r in failed],
        "arm_settings": arm_settings,
        "curves": curve_status,
        "validation_curves": {arm: st["runs_with_curves"] for arm, st in val_status.items()},
        "validation_curve_key": val_curve_key(metric),
        "warnings": warnings,
        "notes": notes,
    }
    return Study(report, curves, val_curves, values, protocol)


def _values(runs_by_arm: Mapping[str, list[dict]], ordered: list[str], metric: str) -> tuple[Values, list[str]]:
    """Each arm's {seed: value} of one metric, and a message per arm whose ok runs lack it."""
    values, messages = {}, []
    for arm in ordered:
        per_seed = {r["seed"]: metric_value(r, metric) for r in runs_by_arm[arm]}
        missing = sorted(s for s, v in per_seed.items() if v is None)
        if missing:
            messages.append(f"arm {arm!r}: {metric} missing or not finite for ok seed(s) {missing}; left out")
        values[arm] = {s: v for s, v in per_seed.items() if v is not None}
    return values, messages


def _tables(values: Values, ordered: list[str], baseline: str | None, metric: str, rule: DecisionRule,
            requests: Requests, refused: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per-arm summaries, contrasts against the baseline (none for an arm of another protocol's
    size, budget or data: `refused`) and the requested analyses of one metric."""
    refused = refused or {}
    contrasts = {arm: (unavailable(f"{arm} - {baseline}", refused[arm], metric, arm=arm, reference=baseline)
                       if arm in refused else
                       _named(paired_contrast(values[arm], values[baseline], f"{arm} - {baseline}", rule),
                              arm, baseline, metric))
                 for arm in ordered if baseline is not None and arm != baseline}
    return {
        "arms": {arm: summarize_arm(arm, values[arm]).to_dict() for arm in ordered},
        "contrasts": contrasts,
        "extra_contrasts": [_extra(p, values, metric, rule) for p in requests.contrasts],
        "dods": [_dod(a, b, values, metric, rule) for a, b in requests.dods],
        "retentions": [_retention(a, b, values, metric, rule) for a, b in requests.retentions],
        "single_seed": [_single(s.pair, s.seed, s.name, values, metric, rule) for s in requests.single_seed],
    }


def _absent(arms: tuple[str, ...], values: Values, metric: str) -> str | None:
    gone = [a for a in dict.fromkeys(arms) if not values.get(a)]
    if gone:
        return f"arm(s) {', '.join(map(repr, gone))} have no ok run with {metric} under this protocol"
    return None


def unavailable(name: str, reason: str, metric: str, **extra: Any) -> dict[str, Any]:
    """A requested contrast that cannot be computed here, shaped like one that can."""
    return {"name": name, "metric": metric, **extra, **contrast_from_deltas({}, name).to_dict(), "reason": reason}


def _named(contrast, arm: str, reference: str, metric: str) -> dict[str, Any]:
    return {"name": contrast.name, "arm": arm, "reference": reference, "metric": metric, **contrast.to_dict()}


def _extra(p: Pair, values: Values, metric: str, rule: DecisionRule) -> dict[str, Any]:
    reason = _absent((p.arm, p.reference), values, metric)
    if reason:
        return unavailable(p.name, reason, metric, arm=p.arm, reference=p.reference)
    return _named(paired_contrast(values[p.arm], values[p.reference], p.name, rule), p.arm, p.reference, metric)


def dod_name(a: str, b: str) -> str:
    return f"({a}) - ({b})"


def _dod(first: Pair, second: Pair, values: Values, metric: str, rule: DecisionRule) -> dict[str, Any]:
    name = dod_name(first.name, second.name)
    parts = {"first": first.name, "second": second.name}
    reason = _absent((first.arm, first.reference, second.arm, second.reference), values, metric)
    if reason:
        return unavailable(name, reason, metric, **parts)
    c = difference_of_differences(values[first.arm], values[first.reference], values[second.arm],
                                  values[second.reference], name, rule)
    return {"name": name, "metric": metric, **parts, **c.to_dict()}


def _retention(cond: Pair, ref: Pair, values: Values, metric: str, rule: DecisionRule) -> dict[str, Any]:
    name = f"({cond.name}) / ({ref.name})"
    reason = _absent((cond.arm, cond.reference, ref.arm, ref.reference), values, metric)
    if reason:
        return {"name": name, "metric": metric, "ratio": None, "percent": None, "n": 0, "seeds": [],
                "reason": reason}
    r = retention(values[cond.arm], values[cond.reference], values[ref.arm], values[ref.reference], name,
                  (cond.name, ref.name), rule)
    return {"metric": metric, **r.to_dict()}


def _single(p: Pair, seed: int | None, name: str, values: Values, metric: str, rule: DecisionRule) -> dict:
    reason = _absent((p.arm, p.reference), values, metric)
    if reason:
        return {"name": name, "metric": metric, "seed": seed, "delta": None, "margin": None,
                "threshold": rule.threshold, "decision": NOT_ESTIMABLE, "reason": reason, "text": reason}
    d = single_seed_decision(values[p.arm], values[p.reference], seed, name, rule)
    return {"metric": metric, **d.to_dict()}


# ---------------------------------------------------------------------------- one run per seed
def _latest(records: list[dict]) -> dict:
    stamps = [finished_time(r) for r in records]
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


def _pairing_warnings(primary: dict, baseline: str, metric: str, refused: Mapping[str, str]) -> list[str]:
    """Seeds that cannot be paired with the baseline, and contrasts that are not estimable (an arm
    refused a contrast is said so once, by the protocol check)."""
    warnings = []
    base_seeds = set(primary["arms"][baseline]["seeds"])
    for arm, contrast in primary["contrasts"].items():
        if arm in refused:
            continue
        unpaired = sorted(set(primary["arms"][arm]["seeds"]) - base_seeds)
        lacking = sorted(base_seeds - set(primary["arms"][arm]["seeds"]))
        if unpaired:
            warnings.append(f"arm {arm!r}: seed(s) {unpaired} have no ok baseline run and are left "
                            f"out of its paired contrast")
        if lacking:
            warnings.append(f"arm {arm!r}: no ok run with a {metric} value for baseline seed(s) {lacking}")
        if not contrast["estimable"]:
            warnings.append(f"contrast {contrast['name']}: {contrast['reason']}")
    return warnings


def not_ok_runs(records: list[dict]) -> list[dict]:
    """The runs to list as not ok: every failed, diverged or interrupted one, less an interrupted
    run that a later line shows resumed to ok (the same run_id)."""
    resumed = {r.get("run_id") for r in records if r["status"] == "ok"}
    return [r for r in records if r["status"] != "ok"
            and not (r["status"] == "interrupted" and r.get("run_id") in resumed)]


def _failure_warnings(arms: list[str], failed: list[dict]) -> list[str]:
    warnings = []
    for arm in arms:
        bad = [r for r in failed if r["arm"] == arm]
        if bad:
            warnings.append(f"arm {arm!r}: {len(bad)} run(s) failed or diverged (seed(s) "
                            f"{sorted({r['seed'] for r in bad})}); its statistics cover only ok runs")
    return warnings


def failed_dict(record: Mapping[str, Any]) -> dict:
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    error = str(record.get("error") or "").strip().splitlines()
    return {"run_id": record.get("run_id"), "arm": record["arm"], "seed": record["seed"],
            "status": record["status"], "line": record["_line"],
            "diverged_step": metrics.get("diverged_step"), "error": error[0][:200] if error else None}
