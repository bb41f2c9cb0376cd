"""Protocol checks: do the runs a report compares share one protocol?

Resolved configs are compared within each arm across seeds and each arm against the baseline;
a report never silently pools two protocols. Runs from different devices or software are
flagged too.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from muonlab.settings import flatten

# Configs are compared over what can change a number (RunConfig.hashed_values: bookkeeping and
# inert settings are out by construction), less the seed, which arms are paired over.
IGNORED_KEYS = frozenset({"seed"})
# What every arm must share when its own overrides are not known.
PROTOCOL_KEYS = ("data.source", "train.num_steps", "train.time_budget", "train.total_batch_size",
                 "train.sequence_len", "train.eval_tokens", "data.vocab_size", "model.depth")


def comparable(config: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the flat settings that can change a number, whether the config was of the older flat
    format 1 and converted). A config that no longer resolves is compared as written."""
    from muonlab.config import RunConfig, is_legacy  # noqa: PLC0415
    from muonlab.errors import MuonlabError  # noqa: PLC0415

    legacy = is_legacy(dict(config))
    try:
        return RunConfig.from_dict(dict(config)).hashed_values(), legacy
    except (MuonlabError, TypeError, ValueError):
        return flatten(config), legacy


def _override_keys(overrides: Iterable[str] | Mapping[str, Any]) -> set[str]:
    if isinstance(overrides, Mapping):
        return set(flatten(overrides))
    return set(overrides)


def _is_overridden(key: str, overridden: set[str]) -> bool:
    # an override named without its section ('vocab_size') also covers 'data.vocab_size'
    return any(key == k or key.endswith("." + k) for k in overridden)


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Settings both configs have and set differently. A setting only one of them has is inert in
    the other (its method is off there: adamw_only has no Muon momentum), so it cannot differ."""
    return {k: (a[k], b[k]) for k in sorted(set(a) & set(b)) if k not in IGNORED_KEYS and a[k] != b[k]}


def _show(diffs: Mapping[str, tuple[Any, Any]], limit: int = 6) -> str:
    items = [f"{k}={a!r} vs {b!r}" for k, (a, b) in list(diffs.items())[:limit]]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return ", ".join(items) + more


def check_protocol(runs: Mapping[str, list[dict]], baseline: str,
                   arm_overrides: Mapping[str, Any] | None = None
                   ) -> tuple[list[str], dict[str, dict[str, list]], list[str]]:
    """Compare resolved configs: within each arm across seeds, and each arm against the baseline.

    Within an arm every seed must share one config (seed and bookkeeping aside). Across arms,
    where `arm_overrides` names both arms' override keys, everything else must match; where it
    does not, only PROTOCOL_KEYS are compared. Returns (warnings, per-arm differences from the
    baseline for the report, notes).
    """
    warnings, notes, settings = [], [], {}
    overrides = {arm: _override_keys(v) for arm, v in (arm_overrides or {}).items()}
    reference: dict[str, dict] = {}
    for arm, records in runs.items():
        configs = [(r["seed"], r.get("config")) for r in sorted(records, key=lambda r: r["seed"])]
        missing = [seed for seed, cfg in configs if not isinstance(cfg, dict)]
        if missing:
            warnings.append(f"arm {arm!r}: no config recorded for seed(s) {missing}; protocol not checked")
        configs = [(seed, comparable(cfg)[0]) for seed, cfg in configs if isinstance(cfg, dict)]
        if not configs:
            continue
        seed0, first = configs[0]
        reference[arm] = first
        for seed, flat in configs[1:]:
            diffs = _differences(flat, first)
            if diffs:
                warnings.append(f"PROTOCOL MISMATCH within arm {arm!r}: seed {seed} differs from "
                                f"seed {seed0} in {_show(diffs)}")
    base = reference.get(baseline)
    if base is None:
        return warnings, settings, notes
    unknown = []
    for arm, flat in reference.items():
        if arm == baseline:
            continue
        diffs = _differences(flat, base)
        settings[arm] = {k: [a, b] for k, (a, b) in diffs.items()}
        if arm in overrides and baseline in overrides:
            allowed = overrides[arm] | overrides[baseline]
            bad = {k: v for k, v in diffs.items() if not _is_overridden(k, allowed)}
            where = "outside its overrides"
        else:
            unknown.append(arm)
            bad = {k: v for k, v in diffs.items() if k in PROTOCOL_KEYS}
            where = "in protocol settings"
        if bad:
            warnings.append(f"PROTOCOL MISMATCH: arm {arm!r} differs from baseline {baseline!r} "
                            f"{where}: {_show(bad)}; its contrast compares different protocols")
    if unknown:
        notes.append(f"overrides unknown for arm(s) {', '.join(unknown)}: only the protocol keys "
                     f"({', '.join(PROTOCOL_KEYS)}) were compared with the baseline")
    return warnings, settings, notes


def provenance_warning(records: Iterable[dict]) -> str | None:
    """A warning when the runs come from more than one device/software setup, else None."""
    envs = set()
    for r in records:
        prov = r.get("provenance") if isinstance(r.get("provenance"), dict) else {}
        envs.add((prov.get("device_name"), prov.get("torch"), prov.get("cuda")))
    if len(envs) > 1:
        shown = "; ".join(f"device {d}, torch {t}, cuda {c}" for d, t, c in sorted(envs, key=str))
        return f"runs come from {len(envs)} different device/software setups ({shown})"
    return None
