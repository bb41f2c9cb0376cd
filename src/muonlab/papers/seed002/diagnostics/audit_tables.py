"""`muonlab diagnose audit`: seed 002's checkpoint audits (audit002) of one run, or over several runs as the
paper tabulates them: Table 4 (each arm's
means over its seeds, per protocol), Table 5a (each run's exp(q_tau) profile, and the "excess"
change of the OE arm over the dense arm at each seed), Table 6's oe_tables stable rank (the
Table-Neumann and BF16-state controls and their references: the arm's mean over its seeds, or the
seed-42 run where the paper prints one seed), Table 8b (each run's terminal scalars, and each arm's
means over its seeds), each beside the printed values where the paper prints that arm at that depth
(and seed). Table 8b prints seeds, not means: the paper's mean is that of its printed values over the
seeds the arm was measured at.
"""

from __future__ import annotations

import math
from typing import Any

from muonlab.diagnostics import Command
from muonlab.papers.seed002 import printed
from muonlab.papers.seed002.diagnostics.audit002 import excess_change, format_audit_table, run_audit
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


def _vector_mean(vectors: list[list[float]]) -> list[float] | None:
    """Elementwise mean of equal-length vectors (None: none, or of different lengths)."""
    if not vectors or len({len(v) for v in vectors}) != 1:
        return None
    return [sum(col) / len(vectors) for col in zip(*vectors)]


def _table6(depth: int | None, audits: dict) -> list[dict]:
    """Table 6's oe_tables stable rank of every printed (arm, seed) the selection has: the mean over the arm's
    runs (the paper's 3-seed means) or the one seed's run (#3b, #3c and their seed-42 references)."""
    rows = []
    for (d, arm, seed), (srank, bound) in printed.SEED002_TABLE6_SRANK.items():
        if d != depth:
            continue
        fams = {s: a["families"]["oe_tables"] for (name, s), (_, a) in audits.items()
                if name == arm and (seed is None or s == seed) and "oe_tables" in a["families"]}
        if not fams:
            continue
        rows.append({"arm": arm, "seeds": sorted(fams), "srank": _mean([f["srank"] for f in fams.values()]),
                     "srank_bound": _mean([f["srank_bound"] for f in fams.values()]),
                     "paper": {"srank": srank, "srank_bound": bound, "seeds": "3 seeds" if seed is None else [seed]}})
    return rows


def _table8b_means(depth: int | None, audits: dict) -> list[dict]:
    """Each arm's Table 8b scalars averaged over its runs, beside the mean of the paper's printed values over
    the same seeds (where it prints them)."""
    rows = []
    for arm in dict.fromkeys(name for name, _ in audits):
        mine = {s: a["scalars"] for (name, s), (_, a) in audits.items() if name == arm}
        measured = {k: _vector_mean([v[k] for v in mine.values() if k in v]) for k in printed.TABLE8B_FIELDS}
        paper_seeds = [s for s in sorted(mine) if (depth, arm, s) in printed.TABLE8B]
        paper = None
        if paper_seeds:
            rows_p = [printed.TABLE8B[(depth, arm, s)] for s in paper_seeds]
            paper = {k: (None if any(r[k] is None for r in rows_p) else _vector_mean([r[k] for r in rows_p]))
                     for k in printed.TABLE8B_FIELDS}
        rows.append({"arm": arm, "seeds": sorted(mine), "scalars": measured, "paper_seeds": paper_seeds,
                     "paper": paper})
    return rows


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
        table8b = [{"arm": arm, "seed": seed, "scalars": a["scalars"], "paper": printed.TABLE8B.get((depth, arm, seed))}
                   for (arm, seed), (_, a) in audits.items()]
        protocols.append({"protocol": protocol, "depth": depth, "runs": len(runs), "table4": table4,
                          "table5a": table5a, "excess": excess, "table6": _table6(depth, audits),
                          "table8b": table8b, "table8b_means": _table8b_means(depth, audits)})
    return {"protocols": protocols, "left_out": selection.left_out}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _cell(f: dict | None) -> str:
    if f is None:
        return "-"
    pct = f.get("mean_row_pct")
    return _num(f["srank"], ".2f") + ("" if pct is None else f" ({pct:.2f}%)")


def _scalars(s: dict) -> str:
    """Table 8b's cells as the paper prints them: signed with 2 decimals, resid_lambdas with 3; "—" for none."""
    def vec(key: str, fmt: str) -> str:
        v = s.get(key)
        return "—" if v is None else "[" + ", ".join(_num(x, fmt) for x in v) + "]"
    return (f"x0 {vec('x0_lambdas', '+.2f')}  wte {vec('wte_lambdas', '+.2f')}  "
            f"resid[0:2] {vec('resid_lambdas[0:2]', '.3f')}  out {vec('out_lambdas', '+.2f')}")


def format_audit_runs(result: dict[str, Any]) -> str:
    lines = []
    for p in result["protocols"]:
        lines.append(f"protocol {p['protocol']} (depth {p['depth']}), {p['runs']} run(s)")
        lines.append("Table 4: stable rank (mean-row energy %), means over seeds")
        lines.append("  " + f"{'arm':<32}{'seeds':<12}" + "".join(f"{f:>18}" for f in printed.TABLE4_FAMILIES))
        for row in p["table4"]:
            seeds = ",".join(map(str, row["seeds"]))
            lines.append("  " + f"{row['arm']:<32}{seeds:<12}"
                         + "".join(f"{_cell(row['families'].get(f)):>18}" for f in printed.TABLE4_FAMILIES))
            if row["paper"]:
                lines.append("  " + f"{'  paper':<32}{'3 seeds':<12}"
                             + "".join(f"{_cell(row['paper'].get(f)):>18}" for f in printed.TABLE4_FAMILIES))
        if p["table5a"]:
            lines.append("Table 5a: exp(q_tau)")
            lines.append("  " + f"{'arm':<32}{'seed':>5}" + "".join(f"{c:>8}" for c in printed.QTAU_COLUMNS))
            for row in p["table5a"]:
                lines.append("  " + f"{row['arm']:<32}{row['seed']:>5}"
                             + "".join(f"{_num(row['values'][c], '.4f'):>8}" for c in printed.QTAU_COLUMNS))
                if row["paper"]:
                    lines.append("  " + f"{'  paper':<32}{row['seed']:>5}"
                                 + "".join(f"{row['paper'][c]:>8.4f}" for c in printed.QTAU_COLUMNS))
        for row in p["excess"]:
            cols = [c for c in printed.QTAU_COLUMNS if c != "sd"]
            lines.append(f"  % excess {row['pair'][0]} over {row['pair'][1]}, seed {row['seed']}: "
                         + ", ".join(f"{c} {_num(row['excess_pct'][c], '+.1f')}" for c in cols))
            if row["paper"]:
                lines.append("    paper: " + ", ".join(f"{c} {row['paper'][c]:+.1f}" for c in cols))
        if p.get("table6"):
            lines.append("Table 6: oe_tables stable rank / bound")
            for row in p["table6"]:
                seeds, paper = ",".join(map(str, row["seeds"])), row["paper"]
                where = (paper["seeds"] if isinstance(paper["seeds"], str)
                         else "seed " + ",".join(map(str, paper["seeds"])))
                lines.append("  " + f"{row['arm']:<32}{seeds:<12}{_num(row['srank'], '.2f'):>8} / "
                             f"{_num(row['srank_bound'], '.0f'):<6}paper ({where}) {paper['srank']:.2f} / "
                             f"{paper['srank_bound']}")
        lines.append("Table 8b: terminal scalars: x0_lambdas, wte_lambdas [L0..], resid_lambdas[0:2], "
                     "out_lambdas [x0, x0_wte]")
        for row in p["table8b"]:
            lines.append("  " + f"{row['arm']:<32}{row['seed']:<12}" + _scalars(row["scalars"]))
            if row["paper"]:
                lines.append("  " + f"{'  paper':<32}{row['seed']:<12}" + _scalars(row["paper"]))
        for row in p.get("table8b_means", []):
            if len(row["seeds"]) < 2:  # one run: its row above is the mean
                continue
            lines.append("  " + f"{row['arm']:<32}{'mean ' + ','.join(map(str, row['seeds'])):<12}"
                         + _scalars(row["scalars"]))
            if row["paper"]:
                lines.append("  " + f"{'  paper':<32}{'mean ' + ','.join(map(str, row['paper_seeds'])):<12}"
                             + _scalars(row["paper"]))
    for why in result["left_out"]:
        lines.append(f"left out: {why}")
    return "\n".join(lines)


COMMAND = Command(
    'audit', "seed 002 checkpoint audits (stable rank, mean-row energy, q_tau profile, terminal scalars) of one "
             "run, or of several as Tables 4, 5a (with its percent excess), 6 (oe_tables stable rank) and 8b "
             "beside the printed values",
    options=SELECTION_OPTIONS,
    run=one_run_or_selection(run_audit, audit_runs),
    format=format_one_or_selection(format_audit_table, format_audit_runs))
