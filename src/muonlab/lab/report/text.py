"""Report rendering for the terminal: per study, compact tables of arms, contrasts (with their
p-values), requested contrasts and decisions; then contrasts across protocols and warnings."""

from __future__ import annotations

from typing import Any, Mapping

from muonlab.lab.report.render import ci_text, fmt, fmt_p, mean_sd, settings_text, study_title
from muonlab.lab.report.study import BPB_METRICS
from muonlab.lab.sweep_status import unfinished_text


def _contrast_lines(items: list[Mapping[str, Any]], w: int) -> list[str]:
    out = [f"{'contrast':<{w}}  {'n':>2}  {'mean Δ ± SD':<22}  {'95% CI':<24}  {'p':<8}  {'k/n':<5}  decision"]
    for c in items:
        if not c["estimable"]:
            out.append(f"{c['name']:<{w}}  {c['n']:>2}  {c['reason']}")
            continue
        mean_sd_text = f"{fmt(c['mean_delta'], True)} ± {fmt(c['sd_delta'])}"
        k = f"{c['seeds_improved']}/{c['n']}"
        out.append(f"{c['name']:<{w}}  {c['n']:>2}  {mean_sd_text:<22}  {ci_text(c):<24}  "
                   f"{fmt_p(c['p_value']):<8}  {k:<5}  {c['decision']}")
    return out


def _retention_lines(items: list[Mapping[str, Any]], w: int) -> list[str]:
    out = [f"{'retention (descriptive)':<{w}}  {'n':>2}  ratio"]
    for r in items:
        if r.get("percent") is None:
            out.append(f"{r['name']:<{w}}  {r['n']:>2}  n/a: {r.get('reason')}")
        else:
            out.append(f"{r['name']:<{w}}  {r['n']:>2}  {r['percent']:.1f} % ({fmt(r['conditional_mean'], True)} / "
                       f"{fmt(r['reference_mean'], True)})")
    return out


def _single_lines(items: list[Mapping[str, Any]], w: int, rule: str) -> list[str]:
    out = [f"single-seed decisions, {rule}:"]
    for d in items:
        delta = "" if d["delta"] is None else f"Δ {fmt(d['delta'], True)}: "
        out.append(f"  {d['name']:<{w}}  {delta}{d['text']} -> {d['decision']}")
    return out


def _study(report: Mapping[str, Any], study: Mapping[str, Any], index: int, total: int) -> list[str]:
    metric, baseline = report["metric"], report["baseline"]
    extra = [m for m in study["secondary"] if m in BPB_METRICS]
    requested = [*study["extra_contrasts"], *study["dods"]]
    names = [*study["arms"], *(c["name"] for c in [*study["contrasts"].values(), *requested, *study["retentions"]])]
    w = max([len(n) for n in names] + [8])
    out = [f"== study {index} of {total}: {study_title(study)}"]
    if study["settings"]:
        out.append(f"   differs in: {settings_text(study['settings'])}")
    out += [f"   {study['counts']['ok_used']} ok run(s) used, seeds {', '.join(map(str, study['seeds'])) or '—'}", "",
            f"{'arm':<{w}}  {'n':>2}  " + "  ".join(f"{m + ' mean ± SD':<24}" for m in [metric] + extra)]
    for arm, summary in study["arms"].items():
        cells = [mean_sd(summary)] + [mean_sd(study["secondary"][m]["arms"].get(arm)) for m in extra]
        out.append(f"{arm:<{w}}  {summary['n']:>2}  " + "  ".join(f"{c:<24}" for c in cells))
    own = {arm: diffs for arm, diffs in study["arm_settings"].items() if diffs}
    if own:  # each arm's own settings, so two arms of one method at two settings never read alike
        out += ["", f"settings of each arm that are not {baseline}'s:"]
        out += [f"  {arm:<{w}}  " + ", ".join(f"{k} = {a!r}" for k, (a, _) in diffs.items()) for arm, diffs in own.items()]
    out.append("")
    if not study["has_baseline"]:
        out.append(f"no contrasts against {baseline}: it has no ok run under this protocol")
    elif not study["contrasts"]:
        out.append(f"no contrasts: {baseline} is the only arm under this protocol")
    else:
        out += _contrast_lines(list(study["contrasts"].values()), w)
    if requested:
        out += ["", "requested contrasts:", *_contrast_lines(requested, w)]
    if study["retentions"]:
        out += ["", *_retention_lines(study["retentions"], w)]
    if study["single_seed"]:
        out += ["", *_single_lines(study["single_seed"], w, report["single_seed_rule"])]
    if study["failed_runs"]:
        out += ["", f"failed/diverged runs ({len(study['failed_runs'])}):"]
        out += [f"  {f['arm']} seed {f['seed']}: {f['status']} ({f['run_id']})" for f in study["failed_runs"]]
    if study["warnings"]:
        out += ["", f"warnings ({len(study['warnings'])}):"] + [f"  - {x}" for x in study["warnings"]]
    return out + [""]


def format_text(report: Mapping[str, Any]) -> str:
    """Compact terminal tables, one block per study, then across-protocol contrasts and warnings."""
    studies = report["studies"]
    where = " ".join(f"{k}={v}" for k, v in report["selection"]["where"].items())
    out = [f"report of {report['ledger']}: metric {report['metric']}, baseline {report['baseline']}, "
           f"rule {report['decision_rule']['kind']} (θ = {report['threshold']:g})"
           + (f", where {where}" if where else "")
           + (f", at {report['compared_at']['text']}" if report.get("compared_at") else ""),
           f"{len(studies)} protocol(s): " + ("each is its own study; select one with --where KEY=VALUE or "
                                              "--protocol ID" if len(studies) > 1 else "one study"), ""]
    for i, study in enumerate(studies, 1):
        out += _study(report, study, i, len(studies))
    across = [x for x in report["across"] if x["metric"] == report["metric"]]
    if across:
        w = max(len(x["name"]) for x in across)
        out += [f"across protocols ({report['selection']['across']}):"]
        out += _contrast_lines([x for x in across if x["kind"] == "dod"], w)
        rets = [x for x in across if x["kind"] == "retention"]
        out += _retention_lines(rets, w) if rets else []
        out.append("")
    notes = [n for n in report["notes"] if n.startswith(("--across", "compared at")) or "plug-in source" in n]
    out += [f"note: {n}" for n in notes]
    if report["warnings"]:
        out += [f"warnings ({len(report['warnings'])}):"] + [f"  - {x}" for x in report["warnings"]]
    if report.get("unfinished"):
        out += ["", unfinished_text(report["unfinished"])]
    files = report.get("files")
    if files:
        out += ["", "wrote " + ", ".join([files["report_md"], files["report_json"], *files["plots"].values()])]
    return "\n".join(out).rstrip("\n")
