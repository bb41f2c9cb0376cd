"""`muonlab diagnose audit`: seed 002's checkpoint audits (audit002) of one run, or over several runs as the
paper tabulates them: Table 4 (each arm's
means over its seeds, per protocol), Table 5a (each run's exp(q_tau) profile, and the "excess"
change of the OE arm over the dense arm at each seed), Table 8b (each run's terminal scalars), each
beside the printed values where the paper prints that arm at that depth (and seed).
"""

from __future__ import annotations

import math
from typing import Any

from muonlab.diagnostics import Command, printed
from muonlab.diagnostics.audit002 import excess_change, format_audit_table, run_audit
from muonlab.diagnostics.run_selection import (SELECTION_OPTIONS, Selection, format_one_or_selection,
                                               one_run_or_selection)


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else None


def _family_means(audits: list[dict]) -> dict[str, dict]:
    out = {}
    for name in printed.TABLE4_FAMILIES:
        fams = [a["families"][name] for a in audits if name in a["families"]]
        if fams:
            energy = _mean([f.get("mean_row_energy") for f in fams])
            out[name] = {"srank": _mean([f["srank"] for f in fams]),
                         "mean_row_pct": None if energy is None else 100 * energy}
    return out


def _qtau_row(audit: dict) -> dict | None:
    q = audit.get("qtau")
    return None if q is None else {c: q[c] for c in printed.QTAU_COLUMNS}


def audit_runs(selection: Selection) -> dict[str, Any]:
    """Every selected run audited (final weights), then grouped into the paper's tables."""
    protocols = []
    for protocol, runs in selection.groups().items():
        order = {arm: i for i, arm in enumerate(dict.fromkeys(r.arm for r in runs))}
        runs = sorted(runs, key=lambda r: (order[r.arm], r.seed))
        audits = {(r.arm, r.seed): (r, run_audit(r.run_dir)) for r in runs}
        depth = runs[0].depth
        table4 = []
        for arm in dict.fromkeys(r.arm for r in runs):
            mine = [a for (name, _), (_, a) in audits.items() if name == arm]
            paper = printed.SEED002_TABLE4.get(depth, {}).get(arm)
            table4.append({"arm": arm, "seeds": sorted(s for (name, s) in audits if name == arm),
                           "families": _family_means(mine),
                           "paper": None if paper is None else {k: {"srank": v[0], "mean_row_pct": v[1]}
                                                                for k, v in paper.items() if v is not None}})
        table5a = []
        for (arm, seed), (_, a) in audits.items():
            row = _qtau_row(a)
            if row is not None:
                table5a.append({"arm": arm, "seed": seed, "values": row,
                                "paper": printed.TABLE5A.get((depth, seed, arm))})
        oe, dense = printed.EXCESS_PAIR
        excess = []
        for seed in sorted({s for (arm, s) in audits if arm == oe}):
            a, b = audits.get((oe, seed)), audits.get((dense, seed))
            if a is None or b is None or _qtau_row(a[1]) is None or _qtau_row(b[1]) is None:
                continue
            qa, qb = _qtau_row(a[1]), _qtau_row(b[1])
            mine = {c: None if qa[c] is None or qb[c] is None else 100 * excess_change(qa[c], qb[c])
                    for c in printed.QTAU_COLUMNS if c != "sd"}  # no middle layers below depth 4
            pa, pb = printed.TABLE5A.get((depth, seed, oe)), printed.TABLE5A.get((depth, seed, dense))
            paper = None if pa is None or pb is None else {c: 100 * excess_change(pa[c], pb[c]) for c in mine}
            excess.append({"seed": seed, "pair": [oe, dense], "excess_pct": mine, "paper": paper})
        table8b = [{"arm": arm, "seed": seed, "scalars": a["scalars"]} for (arm, seed), (_, a) in audits.items()]
        protocols.append({"protocol": protocol, "depth": depth, "runs": len(runs), "table4": table4,
                          "table5a": table5a, "excess": excess, "table8b": table8b})
    return {"protocols": protocols, "left_out": selection.left_out}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _cell(f: dict | None) -> str:
    if f is None:
        return "-"
    pct = f.get("mean_row_pct")
    return _num(f["srank"], ".2f") + ("" if pct is None else f" ({pct:.2f}%)")


def format_audit_runs(result: dict[str, Any]) -> str:
    lines = []
    for p in result["protocols"]:
        lines.append(f"protocol {p['protocol']} (depth {p['depth']}), {p['runs']} run(s)")
        lines.append("Table 4: stable rank (mean-row energy %), means over seeds")
        lines.append("  " + f"{'arm':<22}{'seeds':<12}" + "".join(f"{f:>18}" for f in printed.TABLE4_FAMILIES))
        for row in p["table4"]:
            seeds = ",".join(map(str, row["seeds"]))
            lines.append("  " + f"{row['arm']:<22}{seeds:<12}"
                         + "".join(f"{_cell(row['families'].get(f)):>18}" for f in printed.TABLE4_FAMILIES))
            if row["paper"]:
                lines.append("  " + f"{'  paper':<22}{'3 seeds':<12}"
                             + "".join(f"{_cell(row['paper'].get(f)):>18}" for f in printed.TABLE4_FAMILIES))
        if p["table5a"]:
            lines.append("Table 5a: exp(q_tau)")
            lines.append("  " + f"{'arm':<22}{'seed':>5}" + "".join(f"{c:>8}" for c in printed.QTAU_COLUMNS))
            for row in p["table5a"]:
                lines.append("  " + f"{row['arm']:<22}{row['seed']:>5}"
                             + "".join(f"{_num(row['values'][c], '.4f'):>8}" for c in printed.QTAU_COLUMNS))
                if row["paper"]:
                    lines.append("  " + f"{'  paper':<22}{row['seed']:>5}"
                                 + "".join(f"{row['paper'][c]:>8.4f}" for c in printed.QTAU_COLUMNS))
        for row in p["excess"]:
            cols = [c for c in printed.QTAU_COLUMNS if c != "sd"]
            lines.append(f"  % excess {row['pair'][0]} over {row['pair'][1]}, seed {row['seed']}: "
                         + ", ".join(f"{c} {_num(row['excess_pct'][c], '+.1f')}" for c in cols))
            if row["paper"]:
                lines.append("    paper: " + ", ".join(f"{c} {row['paper'][c]:+.1f}" for c in cols))
        lines.append("Table 8b: terminal scalars")
        for row in p["table8b"]:
            s = row["scalars"]
            lines.append(f"  {row['arm']:<22}{row['seed']:>5}  x0_lambdas ["
                         + ", ".join(f"{v:+.2f}" for v in s["x0_lambdas"]) + "]"
                         + "".join(f"  {k}[0] {s[k][0]:+.2f}" for k in ("wte_lambdas", "out_lambdas") if k in s))
    for why in result["left_out"]:
        lines.append(f"left out: {why}")
    return "\n".join(lines)


COMMAND = Command(
    'audit', "seed 002 checkpoint audits (stable rank, mean-row energy, q_tau profile, terminal scalars) of one "
             "run, or of several as Tables 4, 5a (with its percent excess) and 8b beside the printed values",
    options=SELECTION_OPTIONS,
    run=one_run_or_selection(run_audit, audit_runs),
    format=format_one_or_selection(format_audit_table, format_audit_runs))
