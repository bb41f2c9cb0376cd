"""Report rendering to Markdown (report.md): the method, then one section per protocol's study,
then contrasts across protocols. The terminal text is muonlab.lab.report.text.

Numbers print with 6 decimals as the seed papers print BPB, p-values with 4 (or 3 significant
digits below 0.001); nothing here computes a statistic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from muonlab.lab.report.study import BPB_METRICS


def fmt(value: float | None, signed: bool = False) -> str:
    """6 decimals for BPB-sized numbers (as the papers print), fewer for large ones."""
    if value is None:
        return "n/a"
    sign = "+" if signed else ""
    if abs(value) >= 1000:
        return f"{value:{sign},.1f}"
    return f"{value:{sign}.6f}"


def fmt_p(p: float | None) -> str:
    """A two-sided p-value: 4 decimals, or 3 significant digits below 0.001."""
    if p is None:
        return "n/a"
    return f"{p:.4f}" if p >= 0.001 else f"{p:.3g}"


def fmt_setting(value: Any) -> str:
    return "none" if value is None else str(value)


def settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {fmt_setting(v)}" for k, v in settings.items())


def study_title(study: Mapping[str, Any]) -> str:
    kind = (" (no protocol recorded)" if study.get("unknown") else
            " (derived from recorded configs)" if study["derived"] else "")
    kind += " (ambiguous)" if study["ambiguous"] else ""
    kind += " (written by a newer muonlab)" if study.get("unread") else ""
    return f"protocol {study['protocol']}{kind}"


def mean_sd(summary: Mapping[str, Any] | None) -> str:
    if not summary or summary.get("n", 0) == 0:
        return "no ok runs"
    sd = f" ± {fmt(summary['sd'])}" if summary.get("sd") is not None else " (n = 1, no SD)"
    return fmt(summary["mean"]) + sd


def ci_text(contrast: Mapping[str, Any]) -> str:
    ci = contrast.get("ci95")
    return f"[{fmt(ci[0], True)}, {fmt(ci[1], True)}]" if ci else "n/a"


def _per_seed(contrast: Mapping[str, Any]) -> str:
    return ", ".join(f"s{s}: {fmt(d, True)}" for s, d in zip(contrast["seeds"], contrast["deltas"])) or "—"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


CONTRAST_HEADER = [_row("contrast", "n", "mean Δ ± SD", "95% CI", "p (paired t)", "improved", "decision",
                        "per-seed Δ"), _row(*["---"] * 8)]


def _contrast_row(c: Mapping[str, Any]) -> str:
    if not c["estimable"]:
        return _row(c["name"], c["n"], "not estimable", "n/a", "n/a", "n/a", c["decision"],
                    c.get("reason") if c["n"] == 0 else _per_seed(c))
    return _row(c["name"], c["n"], f"{fmt(c['mean_delta'], True)} ± {fmt(c['sd_delta'])}", ci_text(c),
                fmt_p(c["p_value"]), f"{c['seeds_improved']}/{c['n']}", f"**{c['decision']}**", _per_seed(c))


def _retention_rows(items: list[Mapping[str, Any]]) -> list[str]:
    lines = [_row("retention", "n", "conditional mean Δ", "reference mean Δ", "ratio", "seeds"),
             _row(*["---"] * 6)]
    for r in items:
        ratio = f"{r['percent']:.1f} %" if r.get("percent") is not None else f"n/a ({r.get('reason')})"
        lines.append(_row(r["name"], r["n"], fmt(r.get("conditional_mean"), True),
                          fmt(r.get("reference_mean"), True), ratio, ", ".join(map(str, r["seeds"])) or "—"))
    return lines


def _single_rows(items: list[Mapping[str, Any]]) -> list[str]:
    lines = [_row("single-seed contrast", "seed", "Δ", "against θ", "decision"), _row(*["---"] * 5)]
    lines += [_row(d["name"], d["seed"] if d["seed"] is not None else "—", fmt(d["delta"], True), d["text"],
                   f"**{d['decision']}**") for d in items]
    return lines


def _requested(table: Mapping[str, Any], single_seed_rule: str) -> list[str]:
    lines: list[str] = []
    if table["extra_contrasts"] or table["dods"]:
        lines += CONTRAST_HEADER + [_contrast_row(c) for c in [*table["extra_contrasts"], *table["dods"]]] + [""]
    if table["retentions"]:
        lines += ["Retention ratios (descriptive: both means carry sampling error, no interval):", ""]
        lines += _retention_rows(table["retentions"]) + [""]
    if table["single_seed"]:
        lines += [f"Single-seed decisions, {single_seed_rule}:", ""] + _single_rows(table["single_seed"]) + [""]
    return lines


def _value_of(table: Mapping[str, Any] | None, seed: int) -> str:
    if not table or seed not in table.get("seeds", []):
        return "n/a"
    return fmt(table["values"][table["seeds"].index(seed)])


def _failure_detail(f: Mapping[str, Any]) -> str:
    if f["diverged_step"] is not None:
        return f"diverged at step {f['diverged_step']}"
    return (f["error"] or "").replace("|", "/")


def _warning_lines(warnings: list[str]) -> list[str]:
    return [f"- **{w}**" if w.startswith("PROTOCOL") else f"- {w}" for w in warnings]


def _study(report: Mapping[str, Any], study: Mapping[str, Any], index: int, total: int) -> list[str]:
    metric, baseline = report["metric"], report["baseline"]
    shown = [metric] + [m for m in BPB_METRICS if m != metric and m in study["secondary"]]
    tables = {metric: study["arms"], **{m: t["arms"] for m, t in study["secondary"].items()}}
    c = study["counts"]
    lines = [f"## Study {index} of {total}: {study_title(study)}", ""]
    if study["settings"]:
        lines.append(f"- Settings that tell it from the other protocols: {settings_text(study['settings'])}.")
    lines += [f"- Settings: {settings_text(study['protocol_settings'])}.",
              f"- Runs: {c['records']} records, {c['ok']} ok ({c['ok_used']} used after de-duplication), "
              f"{c['failed']} failed, {c['diverged']} diverged; seeds {', '.join(map(str, study['seeds'])) or '—'}.",
              ""]
    if study["warnings"]:
        lines += ["### Warnings", ""] + _warning_lines(study["warnings"]) + [""]
    lines += ["### Arms", "", _row("arm", "n", *(f"{m} mean ± SD" for m in shown)), _row(*["---"] * (2 + len(shown)))]
    for arm, summary in study["arms"].items():
        lines.append(_row(arm, summary["n"], *(mean_sd(tables[m].get(arm)) for m in shown)))
    lines.append("")
    for arm, summary in study["arms"].items():
        lines += [f"#### {arm}", "", _row("seed", "run", *shown), _row(*["---"] * (2 + len(shown)))]
        for seed, run_id in zip(summary["seeds"], summary["run_ids"]):
            lines.append(_row(seed, run_id, *(_value_of(tables[m].get(arm), seed) for m in shown)))
        for f in (f for f in study["failed_runs"] if f["arm"] == arm):
            lines.append(_row(f["seed"], f["run_id"], *[f["status"]] * len(shown)))
        lines += [_row("**mean ± SD**", f"n = {summary['n']}", *(mean_sd(tables[m].get(arm)) for m in shown)), ""]
        diffs = study["arm_settings"].get(arm)
        if diffs:
            lines += ["Settings that differ from the baseline: " +
                      ", ".join(f"`{k}` = {a!r} (baseline {'off' if b is None else repr(b)})"
                                for k, (a, b) in diffs.items()), ""]
    if study["has_baseline"]:
        lines += [f"### Contrasts vs `{baseline}` ({metric}; Δ < 0 means lower)", ""] + CONTRAST_HEADER
        lines += [_contrast_row(x) for x in study["contrasts"].values()] + [""]
    requested = _requested(study, report["single_seed_rule"])
    if requested:
        lines += [f"### Requested contrasts ({metric})", ""] + requested
    for m, table in study["secondary"].items():
        lines += [f"### Secondary metric: {m} (same rules and θ; {metric} is the primary endpoint)", ""]
        if study["has_baseline"]:
            lines += CONTRAST_HEADER + [_contrast_row(x) for x in table["contrasts"].values()] + [""]
        lines += _requested(table, report["single_seed_rule"])
    lines += ["### Failed and diverged runs", ""]
    if study["failed_runs"]:
        lines += [_row("run", "arm", "seed", "status", "detail"), _row(*["---"] * 5)]
        lines += [_row(f["run_id"], f["arm"], f["seed"], f["status"], _failure_detail(f)) for f in study["failed_runs"]]
    else:
        lines.append("None.")
    lines.append("")
    if study.get("plots"):
        lines += ["### Plots", ""] + [f"![{name}]({Path(path).name})" for name, path in study["plots"].items()] + [""]
    if study["notes"]:
        lines += ["### Notes", ""] + [f"- {n}" for n in study["notes"]] + [""]
    return lines


def _across(report: Mapping[str, Any]) -> list[str]:
    items = report["across"]
    if not items:
        return []
    lines = [f"## Across protocols ({report['selection']['across']})", "",
             "Per seed, one contrast in the first protocol minus the same contrast in the second.", ""]
    for m in dict.fromkeys(x["metric"] for x in items):
        dods = [x for x in items if x["metric"] == m and x["kind"] == "dod"]
        rets = [x for x in items if x["metric"] == m and x["kind"] == "retention"]
        lines += [f"### {m}", ""]
        if dods:
            lines += CONTRAST_HEADER + [_contrast_row(x) for x in dods] + [""]
        if rets:
            lines += _retention_rows(rets) + [""]
        protocols = sorted({tuple(x["protocols"]) for x in dods + rets})
        lines += [f"- {a} vs {b}" for a, b in protocols] + [""]
    return lines


def _quantiles(t_975: Mapping[str, float]) -> str:
    """The t quantiles the intervals used, each for its own df (n - 1 paired seeds)."""
    if not t_975:
        return ""
    return " (" + ", ".join(f"t_0.975,{df} = {t:.6f}" for df, t in t_975.items()) + ")"


def render_markdown(report: Mapping[str, Any]) -> str:
    """report.md: the method, ledger warnings, one section per study, contrasts across protocols."""
    counts, selection = report["counts"], report["selection"]
    studies = report["studies"]
    where = ", ".join(f"{k} = {v}" for k, v in selection["where"].items())
    lines = [f"# Experiment report: {report.get('title') or Path(report['ledger']).name}", "",
             f"Ledger `{report['ledger']}`, generated {report['generated_at']}.", "", "## Method", "",
             f"- Primary metric: `{report['metric']}`; baseline arm: `{report['baseline']}`"
             + (f"; compared at {report['compared_at']['text']} (each run's last periodic evaluation at or "
                "before it)." if report.get("compared_at") else "; each run's final value."),
             f"- Statistics: {report['statistics']}" + _quantiles(report["t_975"]) + ".",
             f"- Decision rule: {report['decision_rule']['text']}. "
             f"A contrast with fewer than 2 paired seeds is not estimable.",
             f"- Single-seed decisions (when asked for): {report['single_seed_rule']}.",
             f"- Runs: {counts['records']} ledger records, {counts['ok']} ok, {counts['failed']} failed, "
             f"{counts['diverged']} diverged, {counts['malformed_lines']} malformed line(s); {counts['selected']} "
             f"selected" + (f" by {where}" if where else "") + f", in {counts['protocols']} protocol(s). Runs of "
             f"two protocols are never pooled: each protocol is its own study. Only ok runs enter the statistics; "
             f"every failed or diverged run is listed.", ""]
    if report["warnings"]:
        lines += ["## Warnings", ""] + _warning_lines(report["warnings"]) + [""]
    if report.get("unfinished"):
        lines += ["## Still out", "", f"{len(report['unfinished'])} submitted run(s) have no final record yet "
                  "(`muonlab sweep --status`); the statistics below leave them out.", ""]
        lines += [f"- `{u['arm']}` seed {u['seed']}: {u['state']}" + (f", {u['detail']}" if u["detail"] else "")
                  for u in report["unfinished"]] + [""]
    for i, study in enumerate(studies, 1):
        lines += _study(report, study, i, len(studies))
    lines += _across(report)
    if report["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in report["notes"]] + [""]
    return "\n".join(lines)
