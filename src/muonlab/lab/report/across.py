"""One contrast in two protocols: `--dod A:B --across KEY` and `--retention A:B --across KEY`.

The two protocols must differ in KEY and agree on every other setting both record (their
shared settings, muonlab.lab.report.grouping); the contrast A − B is paired over seeds within
each, and the two are paired with each other by seed, as seed 002 pairs its arms by seed
(seed 002 §2.2): per seed (A − B)[KEY=v1] − (A − B)[KEY=v2], summarised like any contrast.
"""

from __future__ import annotations

import json
from typing import Any

from muonlab.errors import UsageError
from muonlab.lab.report.grouping import agree
from muonlab.lab.report.requests import Across, Pair, Requests
from muonlab.lab.report.study import Study, rule_for, unavailable
from muonlab.lab.stats import difference_of_differences, retention


def _value(study: Study, key: str) -> tuple[bool, Any]:
    shared = study.protocol.shared
    return (key in shared, shared.get(key))


def _token(value: Any) -> str:
    return json.dumps(value, default=str)


def _conditions(studies: list[Study], spec: Across) -> tuple[list[Study], list[Study], tuple[Any, Any]]:
    """The studies at KEY = v1 and at KEY = v2 (explicit, or the two values present ascending)."""
    located = [(s, v) for s in studies for has, v in [_value(s, spec.key)] if has]
    if spec.raw:
        def at(coerced: dict[str, Any]) -> list[Study]:
            return [s for s, v in located if s.protocol.shared.get("family", "autoresearch") in coerced
                    and _token(v) == _token(coerced[s.protocol.shared.get("family", "autoresearch")])]
        return at(spec.coerced[0]), at(spec.coerced[1]), tuple(next(iter(c.values())) for c in spec.coerced)
    distinct = sorted({_token(v): v for _, v in located}.values(), key=lambda v: (v is None, str(type(v)), v))
    if len(distinct) != 2:
        shown = ", ".join("none" if v is None else str(v) for v in distinct) or "none"
        raise UsageError(f"--across {spec.key}: the selected protocols hold {len(distinct)} value(s) of it "
                         f"({shown}); name two, e.g. --across {spec.key}=A,B")
    return ([s for s, v in located if _token(v) == _token(distinct[0])],
            [s for s, v in located if _token(v) == _token(distinct[1])], (distinct[0], distinct[1]))


def across_protocols(studies: list[Study], requests: Requests, metric: str, threshold: float,
                     rule_kind: str) -> tuple[list[dict], list[str]]:
    """Every requested across-protocol DoD and retention, per metric, and notes."""
    spec = requests.across
    if spec is None:
        return [], []
    first, second, shown = _conditions(studies, spec)
    pairs = [(p, q) for p in first for q in second if agree(p.protocol.shared, q.protocol.shared, [spec.key])]
    notes = []
    if not pairs:
        notes.append(f"--across {spec.describe()}: no two selected protocols differ only in {spec.key} "
                     f"({len(first)} at {shown[0]}, {len(second)} at {shown[1]}); nothing compared")
    out = []
    for p, q in pairs:
        metrics = [m for m in p.report["metrics"] if m in q.report["metrics"]] or [metric]
        for m in metrics:
            rule = rule_for(m, threshold, rule_kind)
            for pair in requests.across_dods:
                out.append(_across_dod(p, q, pair, spec, shown, m, rule))
            for pair in requests.across_retentions:
                out.append(_across_retention(p, q, pair, spec, shown, m, rule))
    return out, notes


def _label(pair: Pair, key: str, value: Any) -> str:
    return f"({pair.name})[{key}={'none' if value is None else value}]"


def _operands(p: Study, q: Study, pair: Pair, metric: str) -> tuple[list, str | None]:
    got = [s.values.get(metric, {}).get(arm) for s in (p, q) for arm in (pair.arm, pair.reference)]
    missing = [f"{arm!r} under protocol {s.protocol.id}" for s in (p, q) for arm in (pair.arm, pair.reference)
               if not s.values.get(metric, {}).get(arm)]
    return got, (f"no ok run with {metric} for {', '.join(missing)}" if missing else None)


def _base(kind: str, p: Study, q: Study, spec: Across, shown: tuple[Any, Any], metric: str) -> dict[str, Any]:
    return {"kind": kind, "key": spec.key, "values": [shown[0], shown[1]],
            "protocols": [p.protocol.id, q.protocol.id], "metric": metric}


def _across_dod(p: Study, q: Study, pair: Pair, spec: Across, shown, metric: str, rule) -> dict[str, Any]:
    name = f"{_label(pair, spec.key, shown[0])} - {_label(pair, spec.key, shown[1])}"
    head = _base("dod", p, q, spec, shown, metric)
    values, reason = _operands(p, q, pair, metric)
    if reason:
        return {**head, **unavailable(name, reason, metric)}
    return {**head, "name": name, **difference_of_differences(*values, name, rule).to_dict()}


def _across_retention(p: Study, q: Study, pair: Pair, spec: Across, shown, metric: str, rule) -> dict[str, Any]:
    parts = (_label(pair, spec.key, shown[0]), _label(pair, spec.key, shown[1]))
    name = f"{parts[0]} / {parts[1]}"
    head = _base("retention", p, q, spec, shown, metric)
    values, reason = _operands(p, q, pair, metric)
    if reason:
        return {**head, "name": name, "ratio": None, "percent": None, "n": 0, "seeds": [], "reason": reason}
    return {**head, **retention(*values, name, parts, rule).to_dict()}
