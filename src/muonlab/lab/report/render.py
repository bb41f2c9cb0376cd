"""Report rendering: the report dict -> report.md (Markdown) and compact terminal text.

Numbers print with 6 decimals as the seed papers print BPB; nothing here computes a statistic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from muonlab.lab.report.analysis import BPB_METRICS


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
