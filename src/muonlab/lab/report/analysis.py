"""Report analysis: a ledger -> the report as a JSON-ready dict, one study per protocol.

A report never pools runs of two protocols (docs/design.md). The ledger's lines are selected
(`--where`, muonlab.lab.report.selection), grouped by protocol (exact ids, or ids derived for
older lines: muonlab.lab.report.grouping), and each protocol becomes its own study with its own
per-arm statistics, contrasts and decisions (muonlab.lab.report.study; the statistics are
muonlab.lab.stats': seed 002 §4.1, seed 000 §4.4 item 4; the default threshold is seed 003's
preregistered 0.0005 BPB). `--protocol ID` keeps one study; `--across KEY` compares one
contrast between two of them (muonlab.lab.report.across).

A malformed ledger line is skipped and reported with its line number.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from muonlab.errors import MuonlabError, UsageError
from muonlab.lab.report.across import across_protocols
from muonlab.lab.report.grouping import Protocol, agree, distinguishing, group_protocols
from muonlab.lab.report.loading import Curve, Point, evaluation_at, load_ledger, metric_value
from muonlab.lab.report.protocol import recorded_settings
from muonlab.lab.report.versions import split_versions
from muonlab.record.protocol import recorded_arm_overrides, recorded_protocol
from muonlab.lab.report.requests import Requests
from muonlab.lab.report.selection import parse_where, select_records
from muonlab.lab.report.study import HIGHER_IS_BETTER, analyse_study, failed_dict, not_ok_runs
from muonlab.lab.stats import SINGLE_SEED_RULE, DecisionRule, t_quantile
from muonlab.settings import flatten

DEFAULT_THRESHOLD = 0.0005  # BPB; seed 003's preregistered practical separation rule
STATISTICS = ("per arm mean ± sample SD (n−1); paired Δ = arm − reference per seed; 95% t-interval "
              "mean ± t_{0.975,n−1}·SD/√n with the two-sided paired t-test's p beside it; "
              "difference-of-differences per seed; retention = ratio of mean Δs (descriptive); "
              "no multiplicity adjustment")


def analyse(ledger: Path, baseline: str, metric: str, threshold: float, rule_kind: str,
            arm_overrides: Mapping[str, Any] | None, where: Sequence[str] | Mapping[str, Any] | None = None,
            protocol: str | None = None, requests: Requests | None = None,
            only: Collection[tuple[str, int, str | None]] | None = None, at: Point | None = None,
            protocol_free: bool = False) -> tuple[dict, dict[str, dict[str, list[Curve]]]]:
    """(the report dict, the training-loss curves per study id and arm) of one ledger.

    `arm_overrides` maps arm -> its override keys (or dict); None means the registered arms'.
    Raises UsageError for a missing ledger, an unknown baseline, metric or setting, a filter
    nothing matches; MuonlabError when the ledger has no ok run.
    """
    if not isinstance(metric, str) or not metric:
        raise UsageError(f"metric must be a metrics key such as val_bpb, got {metric!r}")
    requests = requests or Requests()
    filters = parse_where(where)
    records, problems = load_ledger(ledger)
    if only is not None:  # an experiment file's runs: its arms and seeds under its protocol
        records = [r for r in records if (r.get("arm"), r.get("seed"), recorded_protocol(r)) in only]
        if not records:
            raise MuonlabError(f"none of the experiment's {len(only)} planned run(s) is in {ledger} yet "
                               "(muonlab sweep --experiment FILE runs them)")
    # arms the ledger's own lines define (ad-hoc and experiment-file arms record their overrides)
    arm_overrides = {**recorded_arm_overrides(records), **(_registry() if arm_overrides is None else arm_overrides)}
    records, arm_overrides, version_notes = split_versions(records, arm_overrides)
    overrides = _override_keys(arm_overrides)
    if metric == AUTO_METRIC:
        metric = family_metric(records)
    rule = DecisionRule(threshold, rule_kind, higher_is_better=metric in HIGHER_IS_BETTER)
    warnings = [f"ledger {p}; skipped" for p in problems]
    notes: list[str] = list(version_notes)
    if at is not None:
        ok_before = sum(r["status"] == "ok" for r in records)
        records = _at_point(records, at, metric, ledger.parent, warnings, notes)
        if ok_before and not any(r["status"] == "ok" for r in records):
            raise MuonlabError(f"none of the {ok_before} ok run(s) in {ledger} evaluated at or before {at.describe()} "
                               "(they have no periodic evaluation there): train with --eval-every N, or score their "
                               "kept checkpoints with `muonlab eval RUN --every N`")
    ok_all = [r for r in records if r["status"] == "ok"]
    if not ok_all:
        raise MuonlabError(f"no runs with status 'ok' in {ledger} ({len(records)} failed, diverged or interrupted, "
                           f"{len(problems)} malformed line(s)); nothing to report")
    selected = select_records(records, filters)
    protocols, orphans = group_protocols(selected, overrides, protocol_free)
    protocols = _choose(protocols, protocol)
    used = [r for p in protocols for r in p.records]
    _require_reportable(ledger, used, baseline, metric, requests)
    if orphans:
        lines = ", ".join(str(r["_line"]) for r in orphans[:8]) + (" ..." if len(orphans) > 8 else "")
        warnings.append(
            f"{len(orphans)} run(s) recorded neither a config nor a protocol id (lines {lines}): nothing says "
            f"they ran alike, so they were pooled as one protocol because --protocol-free vouches for them"
            if protocol_free else
            f"{len(orphans)} run(s) recorded neither a config nor a protocol id (lines {lines}): nothing says they "
            f"ran alike, so each is a study of its own; --protocol-free pools them as one protocol if you vouch "
            f"that they did")
    ambiguous, protocol_notes = _protocol_notes(protocols)
    warnings += ambiguous
    notes += protocol_notes
    older = [r for r in used if (s := recorded_settings(r)) is not None and s.legacy]
    if older:  # hashes of format 1 cannot match today's: the runs are compared by their converted configs
        warnings.append(f"{len(older)} run(s) were recorded by an older muonlab (config format 1, hash "
                        f"{older[0].get('config_hash')}...): their configs were converted to today's "
                        "settings for the protocol checks; a sweep will not recognise them as done")
    shown = distinguishing(protocols)
    studies = [analyse_study(p, baseline, metric, threshold, rule_kind, requests, arm_overrides, ledger.parent,
                             shown[p.id])
               for p in protocols]
    across, across_notes = across_protocols(studies, requests, metric, threshold, rule_kind)
    notes += across_notes
    if len(studies) > 1:
        notes.insert(0, f"{len(studies)} protocols: each is its own study (runs of two protocols are never "
                        f"pooled); select one with --where KEY=VALUE or --protocol ID")
    report = {
        "ledger": str(ledger),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "metric": metric,
        "baseline": baseline,
        "threshold": threshold,
        "decision_rule": {"kind": rule.kind, "threshold": threshold,
                          "higher_is_better": rule.higher_is_better, "text": rule.describe()},
        "single_seed_rule": SINGLE_SEED_RULE,
        "statistics": STATISTICS,
        "t_975": t_quantiles([s.report for s in studies], across),
        "protocol_free": protocol_free,
        "compared_at": None if at is None else {"step": at.step, "tokens": at.tokens, "text": at.describe()},
        "selection": {"where": {f.key: f.raw for f in filters}, "protocol": protocol,
                      "across": requests.across.describe() if requests.across else None},
        "counts": {"records": len(records), "ok": len(ok_all),
                   "failed": sum(r["status"] == "failed" for r in records),
                   "diverged": sum(r["status"] == "diverged" for r in records),
                   "interrupted": sum(r["status"] == "interrupted" for r in records),
                   "malformed_lines": len(problems), "selected": len(used), "protocols": len(studies),
                   "without_protocol": len(orphans)},
        "studies": [s.report for s in studies],
        "across": across,
        "failed_runs": [{**failed_dict(r), "protocol": p.id} for p in protocols for r in not_ok_runs(p.records)],
        "warnings": warnings,
        "notes": notes,
        "ledger_problems": problems,
    }
    return report, {s.protocol.id: {"loss": s.curves, "val": s.val_curves} for s in studies}


AUTO_METRIC = "auto"


def family_metric(records: list[dict]) -> str:
    """The metric of the model families the ledger's runs belong to (autoresearch: val_bpb; seed
    004's families: val_ce, the validation loss the paper reports); one, or a usage error."""
    from muonlab.families import get_family  # noqa: PLC0415

    names = {(r.get("config") or {}).get("family", "autoresearch") for r in records if r.get("status") == "ok"}
    metrics = {}
    for name in sorted(n for n in names if isinstance(n, str)):
        try:
            metrics[name] = get_family(name).metric
        except UsageError:  # a family of a plugin not loaded here
            metrics[name] = "val_bpb"
    chosen = set(metrics.values()) or {"val_bpb"}
    if len(chosen) > 1:
        raise UsageError(f"the ledger's runs score by different metrics ({', '.join(f'{k}: {v}' for k, v in metrics.items())}); "
                         "pass --metric")
    return chosen.pop()


def _at_point(records: list[dict], at: Point, metric: str, ledger_dir: Path, warnings: list[str],
              notes: list[str]) -> list[dict]:
    """The records with each ok run's metrics read at its last periodic evaluation at or before
    `at`; an ok run that evaluated nowhere before it is left out, and said so."""
    if not metric.startswith("val_"):
        raise UsageError(f"periodic evaluations score the val split only: compare {metric} at the end, or a "
                         f"val_ metric at {at.describe()}")
    out, missing, steps = [], [], set()
    for r in records:
        if r["status"] != "ok":
            out.append(r)
            continue
        found = evaluation_at(r, at, ledger_dir)
        if found is None:
            missing.append(str(r.get("run_id", r["_line"])))
            continue
        steps.add(found["step"])
        out.append({**r, "metrics": {k: v for k, v in found.items() if k.startswith("val_")},
                    "compared_at_step": found["step"]})
    if missing:
        warnings.append(f"{len(missing)} ok run(s) have no periodic evaluation at or before {at.describe()} "
                        f"(left out): {', '.join(missing[:8])}")
    if steps:
        notes.append(f"compared at {at.describe()}: each run's last periodic evaluation at or before it, after "
                     f"step {', '.join(f'{s:,}' for s in sorted(steps))}")
    if len(steps) > 1:
        warnings.append(f"the runs evaluated at different steps before {at.describe()} "
                        f"({', '.join(map(str, sorted(steps)))}): their values are not from one point")
    return out


def _registry() -> dict[str, Any]:
    from muonlab.arms import ARMS  # noqa: PLC0415

    return {name: arm.overrides for name, arm in ARMS.items()}


def _override_keys(arm_overrides: Mapping[str, Any] | None) -> dict[str, set[str]]:
    """arm -> the dotted keys it overrides (a key named without its section, e.g. vocab_size,
    is kept as given and matches any section)."""
    source = _registry() if arm_overrides is None else arm_overrides
    out = {}
    for arm, value in source.items():
        keys = set(flatten(value)) if isinstance(value, Mapping) else set(value)
        out[arm] = {_dotted(k) for k in keys}
    return out


def _dotted(key: str) -> str:
    from muonlab.config import canonical_key  # noqa: PLC0415

    try:
        return canonical_key(key)
    except UsageError:
        return key


def _choose(protocols: list[Protocol], prefix: str | None) -> list[Protocol]:
    if prefix is None:
        return protocols
    chosen = [p for p in protocols if p.id.startswith(prefix.strip())] if prefix.strip() else []
    if len(chosen) != 1:
        what = "matches no" if not chosen else f"matches {len(chosen)}"
        raise UsageError(f"--protocol {prefix!r} {what} protocol of the selected runs; their ids: "
                         f"{', '.join(p.id for p in protocols)}")
    return chosen


def _require_reportable(ledger: Path, used: list[dict], baseline: str, metric: str, requests: Requests) -> None:
    """Refuse a selection whose baseline (or a requested arm) has no ok run, or a metric no run has."""
    ok = [r for r in used if r["status"] == "ok"]
    arms = list(dict.fromkeys(r["arm"] for r in used))
    ok_arms = {r["arm"] for r in ok}
    if not ok:
        raise MuonlabError(f"no runs with status 'ok' among the selected runs of {ledger}; nothing to report")
    if baseline not in ok_arms:
        raise UsageError(f"baseline arm {baseline!r} has no ok runs in {ledger}; arms with ok runs: "
                         f"{', '.join(a for a in arms if a in ok_arms)}")
    unknown = [a for a in requests.arms if a not in ok_arms]
    if unknown:
        raise UsageError(f"arm(s) {', '.join(map(repr, unknown))} named in a contrast have no ok runs in the "
                         f"selected runs; arms with ok runs: {', '.join(a for a in arms if a in ok_arms)}")
    if not any(metric_value(r, metric) is not None for r in ok):
        numeric = sorted({k for r in ok for k in (r.get("metrics") or {}) if metric_value(r, k) is not None})
        raise UsageError(f"metric {metric!r} has no numeric value in any ok run; numeric metrics in "
                         f"this ledger: {', '.join(numeric) or 'none'}")


def _protocol_notes(protocols: Iterable[Protocol]) -> tuple[list[str], list[str]]:
    """(warnings, notes): which protocols were derived (and what that could not check), which
    are ambiguous, which derived ones agree with an exact one (older and newer lines are kept
    apart)."""
    protocols = list(protocols)
    warnings, notes = [], []
    exact = [p for p in protocols if not p.derived]
    for p in protocols:
        if p.unread:
            notes.append(f"protocol {p.id}: {len(p.records)} line(s) whose config this muonlab cannot read ({p.unread}): "
                         "a study of their own, never pooled with the others; report them with the muonlab that "
                         "wrote them")
        if not p.derived:
            continue
        unchecked = ", ".join(p.unchecked[:6]) + (f" and {len(p.unchecked) - 6} more" if len(p.unchecked) > 6 else "")
        notes.append(f"protocol {p.id} was derived from the recorded configs of {len(p.records)} line(s) without a "
                     f"protocol id (an older muonlab): every setting that can change a number, less the seed"
                     + (f" and the settings arms override ({unchecked}), which it cannot check" if p.unchecked
                        else ""))
        if p.ambiguous:
            warnings.append(f"PROTOCOL AMBIGUOUS: protocol {p.id} holds older lines whose arms override a setting "
                         f"on which the other older lines disagree; they cannot be placed, so they stand alone")
        twins = [e.id for e in exact if agree(p.shared, e.shared)]
        if twins:
            notes.append(f"derived protocol {p.id} records the same settings as protocol {', '.join(twins)}; "
                         f"kept apart because its lines carry no protocol id")
    return warnings, notes


def t_quantiles(*parts: Any) -> dict[str, float]:
    """{df: t_0.975,df} for the degrees of freedom of every estimable interval in `parts` (a contrast's own
    n - 1: a 2-seed contrast's interval uses t_0.975,1 = 12.706205, a 3-seed one's t_0.975,2 = 4.302653)."""
    dfs: set[int] = set()

    def walk(x: Any) -> None:
        if isinstance(x, Mapping):
            if isinstance(x.get("df"), int) and x.get("ci95") is not None:
                dfs.add(x["df"])
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(parts)
    return {str(df): t_quantile(df + 1) for df in sorted(dfs)}
