"""The scorecard: each paper table beside the ledger's runs of the same arms, seeds and protocol.

Per arm: the paper's mean ± sample SD over its seeds (or its printed mean), the measured mean ± SD over
the ledger's latest `ok` run of each of those seeds under the protocol, the difference and the difference
in units of the paper's seed SD (under the paper's own protocol only), and the seeds with no run yet. Per printed
contrast: what the paper prints (gain, p, 95% t-interval, k/n, its conclusion), the same paired contrast from the
paper's per-seed numbers and from the measured runs (mean Δ = arm - baseline ± SD, CI, p, k/n), each decided by
the paper's rule (`rules.py`) or the reader's. The runs read are the table's plan (`runs.py`): the paper's run
set under its protocol, another preset, or the miniature, each arm at its comparison point.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from muonlab.errors import UsageError
from muonlab.lab.paper.rules import decision_rule, describe
from muonlab.lab.paper.runs import TablePlan
from muonlab.lab.report.loading import Point, evaluation_at, metric_value
from muonlab.lab.report.protocol import recorded_settings
from muonlab.lab.stats import (DecisionRule, contrast_from_deltas, paired_deltas, retention_ratio,
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
              point: Point | None = None, expected: dict[str, Any] | None = None,
              same_protocol=lambda record: False) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """{seed: value} of the latest ok run per seed under the protocol (at `point`: its last periodic
    evaluation at or before it); and the ok runs of the arm it left out, each with why: the settings
    that set it apart from `expected` (the hashed settings the table's protocol gives the arm), or
    that it has no value there."""
    values, left_out = {}, []
    for rec in records:
        if rec.get("arm") != arm or rec.get("status") != "ok":
            continue
        value = metric_value(rec, metric) if point is None else _value_at(rec, metric, point)
        if rec.get("protocol") != protocol and not same_protocol(rec):
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


def on_paper_data(record: dict, arm: str, plan: TablePlan, overrides: dict[str, Any]) -> bool:
    """Is the run one of the table's protocol on the paper's own data (the settings `prepare --preset P --download`
    prints, wherever the user's cache is)? Its recorded paths are read back into the route's settings."""
    from muonlab.data.paper_data import PAPER_DATA  # noqa: PLC0415

    route = PAPER_DATA.get(plan.preset)
    settings = recorded_settings(record)
    if plan.miniature or plan.preset != plan.table.preset or route is None or settings is None:
        return False
    marker = "\0root"
    written = route.settings(Path(marker))
    roots = set()
    for key, value in written.items():
        recorded = settings.hashed.get(key)
        if not isinstance(value, str) or not value.startswith(marker):
            continue
        suffix = value[len(marker):]
        if not isinstance(recorded, str) or not recorded.endswith(suffix):
            return False
        roots.add(recorded[: -len(suffix)])
    if len(roots) != 1:
        return False
    return record.get("protocol") == expected_protocol(arm, plan.preset, {**overrides, **route.settings(Path(roots.pop()))})


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


def score_table(plan: TablePlan, records: list[dict], rule: str | None = None,
                threshold: float = 0.0005) -> dict[str, Any]:
    """One table beside the ledger's runs of its plan (the arms, seeds, settings and comparison points that
    `paper run` makes), judged by the paper's rule or `rule`."""
    table, preset = plan.table, plan.preset
    rule_name = rule or table.rule
    decide = decision_rule(rule_name, threshold)
    rows, measured_values, missing = [], {}, []
    for runs in plan.arms:
        protocol = expected_protocol(runs.arm, preset, runs.overrides)
        expected = expected_settings(runs.arm, preset, runs.overrides)
        point = Point(tokens=runs.at_tokens) if runs.at_tokens else None
        found, left_out = _measured(records, runs.arm, protocol, table.metric, point, expected,
                                    lambda rec, a=runs: on_paper_data(rec, a.arm, plan, a.overrides))
        found = {s: v for s, v in found.items() if s in runs.seeds}
        measured_values[runs.arm] = found
        missing += [(runs.arm, s) for s in runs.seeds if s not in found] if protocol else []
        paper_arm = table.arm(runs.arm)
        paper = _stats(paper_arm.values) if paper_arm.values else {"n": paper_arm.n, "mean": paper_arm.mean,
                                                                    "sd": paper_arm.sd, "seeds": list(paper_arm.run_seeds)}
        measured = _stats(found)
        diff = None if measured["mean"] is None else measured["mean"] - paper["mean"]
        in_sd = diff / paper["sd"] if diff is not None and paper["sd"] and not plan.differs else None
        rows.append({"arm": runs.arm, "paper": paper, "measured": measured, "difference": diff,
                     "difference_in_paper_sd": in_sd, "compared_at_tokens": runs.at_tokens,
                     "runs_of_other_protocols": sum(r["protocol"] != protocol for r in left_out),
                     "left_out": left_out, "runs_under_preset": protocol is not None})
    contrasts = []
    for c in table.contrasts:
        arm, base = table.arm(c.arm), table.arm(c.baseline)
        name = f"{c.arm} - {c.baseline}"
        printed = {"gain": c.gain, "p_value": c.p, "ci95": list(c.ci) if c.ci else None,
                   "seeds_improved": list(c.k) if c.k else None, "decision": c.decision, "source": c.source}
        contrasts.append({"arm": c.arm, "baseline": c.baseline, "printed": printed,
                          "paper": _judge(arm.values, base.values, name, rule_name, decide, threshold),
                          "measured": _judge(measured_values[c.arm], measured_values[c.baseline], name, rule_name,
                                             decide, threshold)})
    derived = [_derived(d, {a.arm: a.values for a in table.arms}, measured_values) for d in table.derived]
    strongest = None
    if table.rule == "paired_t":  # seed 004 tests AF-Muon against the non-AF arm of the lowest mean loss
        strongest = {"paper": _strongest({a.arm: a.values for a in table.arms}),
                     "measured": _strongest(measured_values)}
    settings = "".join(f" --{k.replace('_', '-')} {v}" for k, v in sorted(plan.given.items()))
    note = None
    if plan.miniature:
        note = (f"miniature: {plan.describe()}; the runs keep the protocol's structure, not its scale: they compare "
                "in kind, not in value")
    elif plan.differs:
        note = (f"protocol differs: these runs are preset {preset}{settings}, the paper's is {table.preset}; they "
                "compare in kind, not in value")
    return {"id": table.id, "paper": table.paper, "source": table.source, "metric": table.metric,
            "paper_preset": table.preset, "table_settings": table.settings, "preset": preset, "settings": plan.given,
            "miniature": plan.miniature, "scale": plan.scale, "protocol_differs": plan.differs, "note": note,
            "compared_at": _compared_at(plan), "rule": rule_name, "paper_rule": table.rule,
            "decision_rule": describe(rule_name, threshold, table.rule_source if rule_name == table.rule else None),
            "choices": list(table.choices), "strongest_baseline": strongest, "rows": rows, "contrasts": contrasts, "derived": derived,
            "missing": [{"arm": a, "seed": s} for a, s in missing]}


def _strongest(values: dict[str, dict[int, float]]) -> str | None:
    """The non-AF arm (no AF-Muon in its name) of the lowest mean: seed 004's "strongest non-AF baseline by mean
    validation loss" (App. J, Table 2's caption)."""
    means = {arm: sum(v.values()) / len(v) for arm, v in values.items() if v and "afmuon" not in arm}
    return min(means, key=means.get) if means else None


def _judge(arm: dict[int, float], baseline: dict[int, float], name: str, rule_name: str,
           decide: DecisionRule | None, threshold: float) -> dict[str, Any]:
    """A paired contrast as the paper prints it: n, mean Δ ± SD, 95% t-CI, p, k/n (from two seeds on), and the
    decision of the rule (descriptive: none; seed 003's single-seed rule: one seed's Δ against θ)."""
    if rule_name == "single_seed":
        d = single_seed_decision(arm, baseline, name=name, rule=DecisionRule(threshold=threshold))
        return {"n": 0 if d.delta is None else 1, "mean_delta": d.delta, "sd_delta": None, "ci95": None,
                "p_value": None, "seeds_improved": None if d.delta is None else int(d.delta < 0),
                "decision": d.decision}
    deltas = paired_deltas(arm, baseline)
    c = contrast_from_deltas(deltas, name, decide or DecisionRule(kind="ci"))
    if not c.estimable:  # one seed: its difference, no spread
        mean = _mean(list(deltas.values()))
        return {"n": c.n, "mean_delta": mean, "sd_delta": None, "ci95": None, "p_value": None,
                "seeds_improved": None if mean is None else int(mean < 0),
                "decision": "descriptive" if decide is None else c.decision}
    return {"n": c.n, "mean_delta": c.mean_delta, "sd_delta": c.sd_delta, "ci95": list(c.ci95), "p_value": c.p_value,
            "seeds_improved": c.seeds_improved, "decision": "descriptive" if decide is None else c.decision}


def _mean(values: list[float]) -> float | None:
    """The mean of the paper's descriptive numbers: of one seed too (the paired t-test needs two)."""
    return sum(values) / len(values) if values else None


def _derived_value(row, values: dict[str, dict[int, float]]) -> tuple[float | None, float | None, int]:
    """(the derived number, its SD over seeds for a difference of differences, seeds it rests on)."""
    (a, b), (c, d) = row.first, row.second
    first, second = paired_deltas(values.get(a, {}), values.get(b, {})), paired_deltas(values.get(c, {}), values.get(d, {}))
    if row.kind == "dod":  # per seed (A - B) - (C - D), over the seeds all four arms have
        common = sorted(set(first) & set(second))
        per_seed = [first[s] - second[s] for s in common]
        return _mean(per_seed), statistics.stdev(per_seed) if len(per_seed) > 1 else None, len(common)
    ratio = retention_ratio(_mean(list(first.values())), _mean(list(second.values())))
    return ratio, None, min(len(first), len(second))


def _derived(row, paper_values: dict[str, dict[int, float]], measured: dict[str, dict[int, float]]) -> dict[str, Any]:
    """A derived row: as printed, recomputed from the paper's per-seed values, and from the ledger's runs."""
    from_paper, paper_sd, _ = _derived_value(row, paper_values)
    value, sd, n = _derived_value(row, measured)
    (a, b), (c, d) = row.first, row.second
    formula = f"({a} − {b}) − ({c} − {d})" if row.kind == "dod" else f"mean({a} − {b}) / mean({c} − {d})"
    return {"kind": row.kind, "name": row.name, "formula": formula, "source": row.source, "printed": row.printed,
            "from_paper_seeds": from_paper, "paper_sd": paper_sd, "measured": value, "measured_sd": sd, "n": n,
            "difference": None if value is None else value - row.printed}


def _compared_at(plan: TablePlan) -> str:
    table = plan.table
    points = sorted({a.at_tokens for a in plan.arms if a.at_tokens})
    if points:
        where = ", ".join(f"{p:,}" for p in points)
        paper = "" if not plan.miniature else f"; the paper's {table.at_tokens:,} tokens, steps / {plan.scale}"
        return (f"compared at {where} tokens, each run's last evaluation at or before it ({table.at_source}{paper})")
    if table.at_tokens:
        return (f"final values: the paper compares at {table.at_tokens:,} tokens ({table.at_source}), a point of "
                f"its own protocol, preset {table.preset}")
    return "final values, as the paper compares"


def scorecard(plans: list[TablePlan], records: list[dict], rule: str | None = None,
              threshold: float = 0.0005) -> dict[str, Any]:
    head = f"each table's paper rule{'' if rule is None else ' overridden: ' + describe(rule, threshold)}"
    return {"rule": rule, "rule_text": head, "threshold": threshold,
            "tables": [score_table(p, records, rule, threshold) for p in plans]}


def _num(v: float | None, digits: int = 6) -> str:
    """Six decimals by default: the papers print BPB to 1e-6, and 0.001 BPB decides."""
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _pm(stats: dict) -> str:
    if stats["mean"] is None:
        return "no runs"
    return f"{_num(stats['mean'])} ± {_num(stats['sd'])} (n {stats['n']})"


def _stat_cell(c: dict) -> str:
    """Δ ± SD [CI], p, k/n, decision: what the papers print for a paired contrast."""
    if c["mean_delta"] is None:
        return f"no pairs, {c['decision']}"
    parts = [_num(c["mean_delta"]) + (f" ± {_num(c['sd_delta'])}" if c["sd_delta"] is not None else "")]
    if c["ci95"]:
        parts.append(f"[{_num(c['ci95'][0])}, {_num(c['ci95'][1])}]")
    if c["p_value"] is not None:
        parts.append(f"p {_num(c['p_value'], 4)}")
    if c["seeds_improved"] is not None:
        parts.append(f"{c['seeds_improved']}/{c['n']}")
    return " ".join(parts) + f", {c['decision']}"


def _printed_cell(p: dict) -> str:
    parts = [f"gain {_num(p['gain'])}" if p["gain"] is not None else "–"]
    if p["ci95"]:
        parts.append(f"[{_num(p['ci95'][0])}, {_num(p['ci95'][1])}]")
    if p["p_value"] is not None:
        parts.append(f"p {_num(p['p_value'], 4)}")
    if p["seeds_improved"]:
        parts.append(f"{p['seeds_improved'][0]}/{p['seeds_improved'][1]}")
    if p["decision"]:
        parts.append(p["decision"].replace("_", " "))
    return " ".join(parts)


def format_scorecard(card: dict[str, Any]) -> str:
    """Markdown: one section per table."""
    lines = [f"# Scorecard against the seed papers (decision rule: {card.get('rule_text', 'each table paper rule')})"]
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
            lines += ["", "| contrast (Δ = arm − baseline) | printed | from the paper's seeds: Δ ± SD [95% CI], p, "
                          "k/n, decision | measured |", "| --- | --- | --- | --- |"]
            for c in t["contrasts"]:
                lines.append(f"| {c['arm']} − {c['baseline']} | {_printed_cell(c['printed'])} | "
                             f"{_stat_cell(c['paper'])} | {_stat_cell(c['measured'])} |")
        if t.get("derived"):
            lines += ["", "| derived | printed | from the paper's seeds | measured | difference |",
                      "| --- | --- | --- | --- | --- |"]
            for d in t["derived"]:
                pct = d["kind"] == "ratio"
                show = (lambda v: "–" if v is None else f"{100 * v:.1f}%") if pct else _num
                sd = (lambda v: "" if v is None else f" ± {_num(v)}")
                lines.append(f"| {d['name']}: {d['formula']} ({d['source']}) | {show(d['printed'])} | "
                             f"{show(d['from_paper_seeds'])}{sd(d['paper_sd'])} | {show(d['measured'])}"
                             f"{sd(d['measured_sd'])} (n {d['n']}) | {show(d['difference'])} |")
        if t.get("strongest_baseline"):
            b = t["strongest_baseline"]
            lines += ["", f"strongest non-AF baseline by mean (the paper tests AF-Muon against it): paper "
                          f"{b['paper'] or '–'}, measured {b['measured'] or '–'}"]
        if t["choices"]:
            lines += ["", "where the paper is silent, muonlab chose:"] + [f"- {c}" for c in t["choices"]]
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
