"""The scorecard: each paper table beside the ledger's runs of the same arms, seeds and protocol.

Per arm: the paper's mean ± sample SD over its seeds (or its printed mean), the measured mean ± SD over
the ledger's latest `ok` run of each of those seeds under the protocol, the difference and the difference
in units of the paper's seed SD, and the seeds with no run yet. Per printed contrast: the paper's gain and
p as printed, the same paired contrast recomputed from the paper's per-seed numbers (mean Δ = arm -
baseline, p, decision by the report's rule), and the measured one. The protocol is the table's paper preset
unless `preset` names another (a CPU preset: the output then says that the protocol differs).
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from typing import Any, Iterable

from muonlab.errors import UsageError
from muonlab.lab.paper.tables import PaperTable
from muonlab.lab.report.loading import Point, evaluation_at, metric_value
from muonlab.lab.report.protocol import recorded_settings
from muonlab.lab.stats import (SINGLE_SEED_RULE, DecisionRule, paired_contrast, paired_deltas, retention_ratio,
                               single_seed_decision, summarize_arm)
from muonlab.lab.sweep_status import unfinished_text


def expected_protocol(arm: str, preset: str, overrides: dict[str, Any] | None = None) -> str | None:
    """The protocol id the arm's runs under the preset (and settings) carry (None: it does not run there)."""
    return _expected(arm, preset, tuple(sorted((overrides or {}).items())))[0]


def expected_settings(arm: str, preset: str, overrides: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The settings (hashed values) the arm's runs under the preset (and settings) hold."""
    return _expected(arm, preset, tuple(sorted((overrides or {}).items())))[1]


@lru_cache(maxsize=None)
def _expected(arm: str, preset: str, overrides: tuple) -> tuple[str | None, dict[str, Any] | None]:
    """(protocol id, hashed settings) of the arm under the preset, resolved once; (None, None) where it
    does not run there."""
    from muonlab.arms import resolve_config

    try:
        cfg = resolve_config(arm, preset, dict(overrides))
    except UsageError:
        return None, None
    return cfg.protocol_id(), cfg.hashed_values()


def _measured(records: Iterable[dict], arm: str, protocol: str | None, metric: str,
              point: Point | None = None, expected: dict[str, Any] | None = None
              ) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """{seed: value} of the latest ok run per seed under the protocol (at `point`: its last periodic
    evaluation at or before it); and the ok runs of the arm it left out, each with why: the settings
    that set it apart from `expected` (the hashed settings the table's protocol gives the arm), or
    that it has no value there."""
    values, left_out = {}, []
    for rec in records:
        if rec.get("arm") != arm or rec.get("status") != "ok":
            continue
        value = metric_value(rec, metric) if point is None else _value_at(rec, metric, point)
        if rec.get("protocol") != protocol:
            left_out.append({"run_id": rec.get("run_id"), "seed": rec.get("seed"), "protocol": rec.get("protocol"),
                             "why": _apart(rec, expected) or "another protocol id"})
            continue
        if value is None:
            where = f" at {point.describe()}" if point is not None else ""
            left_out.append({"run_id": rec.get("run_id"), "seed": rec.get("seed"), "protocol": protocol,
                             "why": f"no {metric}{where}"})
            continue
        values[int(rec["seed"])] = value  # later lines win: the latest run of a seed
    return values, left_out


def _apart(record: dict, expected: dict[str, Any] | None) -> str:
    """The recorded settings that differ from the expected ones, as 'key=recorded (table: expected)'."""
    settings = recorded_settings(record)
    if settings is None or expected is None:
        return "no config recorded" if settings is None else ""
    keys = sorted(k for k in set(settings.hashed) | set(expected)
                  if k != "seed" and settings.hashed.get(k) != expected.get(k))
    shown = [f"{k}={settings.hashed.get(k)!r} (table: {expected.get(k)!r})" for k in keys[:4]]
    return ", ".join(shown) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _value_at(record: dict, metric: str, point: Point) -> float | None:
    found = evaluation_at(record, point, None)
    return None if found is None else metric_value({"metrics": found}, metric)


def _stats(values: dict[int, float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "sd": None, "seeds": []}
    s = summarize_arm("", values)
    return {"n": s.n, "mean": s.mean, "sd": s.sd, "seeds": list(s.seeds)}


def score_table(table: PaperTable, records: list[dict], preset: str | None = None,
                rule: DecisionRule | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    rule = rule or DecisionRule()
    preset = preset or table.preset
    given = overrides or {}
    overrides = {**table.settings, **given}  # the table's protocol settings, the command line's on top
    # the paper's comparison point holds for its own protocol; another preset's runs are read at their end
    point = Point(tokens=table.at_tokens) if table.at_tokens and preset == table.preset else None
    rows, measured_values, missing = [], {}, []
    for paper_arm in table.arms:
        protocol = expected_protocol(paper_arm.arm, preset, overrides)
        seeds = paper_arm.run_seeds
        expected = expected_settings(paper_arm.arm, preset, overrides)
        found, left_out = _measured(records, paper_arm.arm, protocol, table.metric, point, expected)
        found = {s: v for s, v in found.items() if s in seeds}
        measured_values[paper_arm.arm] = found
        missing += [(paper_arm.arm, s) for s in seeds if s not in found] if protocol else []
        paper = _stats(paper_arm.values) if paper_arm.values else {"n": paper_arm.n, "mean": paper_arm.mean,
                                                                    "sd": None, "seeds": list(seeds)}
        measured = _stats(found)
        diff = None if measured["mean"] is None else measured["mean"] - paper["mean"]
        rows.append({"arm": paper_arm.arm, "paper": paper, "measured": measured, "difference": diff,
                     "difference_in_paper_sd": diff / paper["sd"] if diff is not None and paper["sd"] else None,
                     "runs_of_other_protocols": sum(r["protocol"] != protocol for r in left_out),
                     "left_out": left_out, "runs_under_preset": protocol is not None})
    contrasts = []
    for c in table.contrasts:
        arm, base = table.arm(c.arm), table.arm(c.baseline)
        name = f"{c.arm} - {c.baseline}"
        if table.rule == "single_seed":  # seed 003: one seed's Δ against θ alone
            paper = _single(single_seed_decision(arm.values, base.values, name=name, rule=rule))
            measured = _single(single_seed_decision(measured_values[c.arm], measured_values[c.baseline], name=name,
                                                    rule=rule))
        elif table.rule == "descriptive":  # the paper prints the difference only: no test, no decision
            paper = _descriptive(arm.values, base.values)
            measured = _descriptive(measured_values[c.arm], measured_values[c.baseline])
        else:
            paper = _contrast(paired_contrast(arm.values, base.values, name, rule))
            measured = _contrast(paired_contrast(measured_values[c.arm], measured_values[c.baseline], name, rule))
        contrasts.append({"arm": c.arm, "baseline": c.baseline, "printed_gain": c.gain, "printed_p": c.p,
                          "paper": paper, "measured": measured})
    derived = [_derived(d, {a.arm: a.values for a in table.arms}, measured_values) for d in table.derived]
    # the runs' protocol is the paper's only if the preset and settings resolve to the paper preset's
    differs = any(expected_protocol(a.arm, preset, overrides) != expected_protocol(a.arm, table.preset, table.settings)
                  for a in table.arms)
    settings = "".join(f" --{k.replace('_', '-')} {v}" for k, v in sorted(given.items()))
    return {"id": table.id, "paper": table.paper, "source": table.source, "metric": table.metric,
            "paper_preset": table.preset, "table_settings": table.settings, "preset": preset, "settings": given,
            "protocol_differs": differs,
            "note": (f"protocol differs: these runs are preset {preset}{settings}, the paper's is {table.preset}; they "
                     "compare in kind, not in value") if differs else None,
            "compared_at": _compared_at(table, point), "decision_rule": _rule_text(table, rule),
            "rows": rows, "contrasts": contrasts, "derived": derived,
            "missing": [{"arm": a, "seed": s} for a, s in missing]}


def _mean(values: list[float]) -> float | None:
    """The mean of the paper's descriptive numbers: of one seed too (the paired t-test needs two)."""
    return sum(values) / len(values) if values else None


def _derived_value(row, values: dict[str, dict[int, float]]) -> tuple[float | None, int]:
    """(the derived number, seeds it rests on) from per-seed values."""
    (a, b), (c, d) = row.first, row.second
    first, second = paired_deltas(values.get(a, {}), values.get(b, {})), paired_deltas(values.get(c, {}), values.get(d, {}))
    if row.kind == "dod":  # per seed (A - B) - (C - D), over the seeds all four arms have
        common = sorted(set(first) & set(second))
        return _mean([first[s] - second[s] for s in common]), len(common)
    return retention_ratio(_mean(list(first.values())), _mean(list(second.values()))), min(len(first), len(second))


def _derived(row, paper_values: dict[str, dict[int, float]], measured: dict[str, dict[int, float]]) -> dict[str, Any]:
    """A derived row: as printed, recomputed from the paper's per-seed values, and from the ledger's runs."""
    from_paper, _ = _derived_value(row, paper_values)
    value, n = _derived_value(row, measured)
    (a, b), (c, d) = row.first, row.second
    formula = f"({a} − {b}) − ({c} − {d})" if row.kind == "dod" else f"mean({a} − {b}) / mean({c} − {d})"
    return {"kind": row.kind, "name": row.name, "formula": formula, "source": row.source, "printed": row.printed,
            "from_paper_seeds": from_paper, "measured": value, "n": n,
            "difference": None if value is None else value - row.printed}


def _compared_at(table: PaperTable, point: Point | None) -> str:
    if point is not None:
        return (f"compared at {point.describe()}, each run's last periodic evaluation at or before it "
                f"({table.at_source})")
    if table.at_tokens:
        return (f"final values: the paper compares at {table.at_tokens:,} tokens ({table.at_source}), a point of "
                f"its own protocol, preset {table.preset}")
    return "final values, as the paper compares"


def _single(d) -> dict[str, Any]:
    """A single-seed decision in the shape of a contrast row (no spread, no p)."""
    return {"n": 0 if d.delta is None else 1, "mean_delta": d.delta, "sd_delta": None, "p_value": None,
            "decision": d.decision}


def _rule_text(table: PaperTable, rule: DecisionRule) -> str:
    if table.rule == "single_seed":
        return f"{SINGLE_SEED_RULE}, θ = {rule.threshold:g} ({table.rule_source})"
    if table.rule == "descriptive":
        return f"descriptive: each Δ as the paper prints it, no test ({table.rule_source})"
    return f"paired t over seeds: {rule.describe()}" + (f" ({table.rule_source})" if table.rule_source else "")


def _descriptive(arm: dict[int, float], baseline: dict[int, float]) -> dict[str, Any]:
    """The mean paired difference (one seed's difference where there is one seed), without a test."""
    deltas = list(paired_deltas(arm, baseline).values())
    sd = statistics.stdev(deltas) if len(deltas) > 1 else None
    return {"n": len(deltas), "mean_delta": _mean(deltas), "sd_delta": sd, "p_value": None, "decision": "descriptive"}


def _contrast(c) -> dict[str, Any]:
    return {"n": c.n, "mean_delta": c.mean_delta, "sd_delta": c.sd_delta, "p_value": c.p_value,
            "decision": c.decision}


def scorecard(tables: list[PaperTable], records: list[dict], preset: str | None = None,
              threshold: float = 0.0005, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    rule = DecisionRule(threshold=threshold)
    return {"rule": rule.describe(), "tables": [score_table(t, records, preset, rule, overrides) for t in tables]}


def _num(v: float | None, digits: int = 6) -> str:
    """Six decimals by default: the papers print BPB to 1e-6, and 0.001 BPB decides."""
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _pm(stats: dict) -> str:
    if stats["mean"] is None:
        return "no runs"
    return f"{_num(stats['mean'])} ± {_num(stats['sd'])} (n {stats['n']})"


def format_scorecard(card: dict[str, Any]) -> str:
    """Markdown: one section per table."""
    lines = [f"# Scorecard against the seed papers (decision rule: {card['rule']})"]
    for t in card["tables"]:
        lines += ["", f"## {t['id']}: {t['paper']}, {t['source']} ({t['metric']}, preset {t['preset']})"]
        if t["note"]:
            lines.append(f"_{t['note']}_")
        lines.append(f"_{t['compared_at']}; decision rule: {t['decision_rule']}_")
        lines += ["", "| arm | paper | measured | difference | in paper SDs |", "| --- | --- | --- | --- | --- |"]
        for r in t["rows"]:
            measured = _pm(r["measured"]) if r["runs_under_preset"] else f"does not run under {t['preset']}"
            lines.append(f"| {r['arm']} | {_pm(r['paper'])} | {measured} | {_num(r['difference'])} | "
                         f"{_num(r['difference_in_paper_sd'], 2)} |")
        if t["contrasts"]:
            lines += ["", "| contrast | printed gain, p | paper Δ, p, decision | measured Δ, p, decision |",
                      "| --- | --- | --- | --- |"]
            for c in t["contrasts"]:
                p, m = c["paper"], c["measured"]
                printed = f"{_num(c['printed_gain'])}, {_num(c['printed_p'], 4) if c['printed_p'] else '–'}"
                lines.append(f"| {c['arm']} − {c['baseline']} | {printed} | {_num(p['mean_delta'])}, "
                             f"{_num(p['p_value'], 4)}, {p['decision']} | {_num(m['mean_delta'])}, "
                             f"{_num(m['p_value'], 4)}, {m['decision']} (n {m['n']}) |")
        if t.get("derived"):
            lines += ["", "| derived | printed | from the paper's seeds | measured | difference |",
                      "| --- | --- | --- | --- | --- |"]
            for d in t["derived"]:
                pct = d["kind"] == "ratio"
                show = (lambda v: "–" if v is None else f"{100 * v:.1f}%") if pct else _num
                lines.append(f"| {d['name']}: {d['formula']} ({d['source']}) | {show(d['printed'])} | "
                             f"{show(d['from_paper_seeds'])} | {show(d['measured'])} (n {d['n']}) | "
                             f"{show(d['difference'])} |")
        left = [(r["arm"], x) for r in t["rows"] for x in r.get("left_out", [])]
        if left:
            lines += ["", f"runs of these arms left out ({len(left)}):"]
            lines += [f"- {arm}@{x['seed']} {x['run_id']}: {x['why']}" for arm, x in left[:12]]
            lines += [f"- ... and {len(left) - 12} more"] if len(left) > 12 else []
        if t["missing"]:
            lines.append("")
            lines.append("no runs yet: " + ", ".join(f"{m['arm']}@{m['seed']}" for m in t["missing"]))
    if card.get("unfinished"):
        lines += ["", unfinished_text(card["unfinished"])]
    return "\n".join(lines)
