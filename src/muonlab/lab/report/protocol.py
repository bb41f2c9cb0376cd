"""Recorded settings and protocol checks: what a run's config says, and do the runs a study
compares share one protocol?

Runs are grouped into protocols before anything is compared (muonlab.lab.report.grouping);
these checks are the second line: resolved configs are compared within each arm across seeds
and each arm against the baseline. Runs from different devices or software are flagged too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping

from muonlab.settings import Section, flatten, to_dict

# Configs are compared over what can change a number (RunConfig.hashed_values: bookkeeping and
# inert settings are out by construction), less the seed, which arms are paired over.
IGNORED_KEYS = frozenset({"seed"})
# What every arm must share when its own overrides are not known (PROTOCOL_KEYS), and what defines a
# protocol even when an arm sets it (DEFINING_KEYS: an arm that sets one has the protocol of its values;
# runs recorded without their layers that differ from the baseline's here are not contrasted with it)
from muonlab.config import DEFINING_KEYS, PROTOCOL_KEYS  # noqa: E402


@dataclass(frozen=True)
class RecordedSettings:
    """A ledger line's config, read once: `values` holds every recorded setting (flat, bookkeeping
    included: what --where reads), `countable` those that could change a number whether or not
    they act (what protocols are told apart by: an arm that switches a method off leaves the
    method's settings at the protocol's values), `legacy` whether it was config format 1."""

    values: dict[str, Any]
    countable: dict[str, Any]
    hashed: dict[str, Any]  # the settings that act (RunConfig.hashed_values): what the checks compare
    legacy: bool


def countable_values(obj: Section, prefix: str = "") -> dict[str, Any]:
    """Every setting of hashed sections and fields, active or not (settings.hashed_values less
    its activity rule)."""
    if not type(obj).HASHED:
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if not f.metadata.get("hashed", True):
            continue
        value = getattr(obj, f.name)
        if isinstance(value, Section):
            out.update(countable_values(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def recorded_settings(record: dict) -> RecordedSettings | None:
    """The settings of a ledger line's config (cached on the record), or None without a config.
    A config that no longer resolves is read as written, bookkeeping left out."""
    if "_settings" not in record:
        config = record.get("config")
        record["_settings"] = _read(json.dumps(config, sort_keys=True)) if isinstance(config, dict) else None
    return record["_settings"]


@lru_cache(maxsize=4096)  # resolving a config takes milliseconds; reports of one ledger repeat them
def _read(config_json: str) -> RecordedSettings:
    from muonlab.config import RunConfig, is_legacy  # noqa: PLC0415
    from muonlab.errors import MuonlabError  # noqa: PLC0415

    config = json.loads(config_json)
    try:
        cfg = RunConfig.from_dict(config)
        return RecordedSettings(flatten(to_dict(cfg)), countable_values(cfg), cfg.hashed_values(), is_legacy(config))
    except (MuonlabError, TypeError, ValueError):  # compared as written
        flat = {k: v for k, v in flatten(config).items() if k not in ("format", "protocol", "layers", "arm")}
        countable = {k: v for k, v in flat.items() if not k.startswith("record.")}
        return RecordedSettings(flat, countable, countable, is_legacy(config))


def _override_keys(overrides: Iterable[str] | Mapping[str, Any]) -> set[str]:
    if isinstance(overrides, Mapping):
        return set(flatten(overrides))
    return set(overrides)


def is_overridden(key: str, overridden: set[str]) -> bool:
    # an override named without its section ('vocab_size') also covers 'data.vocab_size'
    return any(key == k or key.endswith("." + k) for k in overridden)


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Settings both configs have and set differently. A setting only one of them has is inert in
    the other (its method is off there: adamw_only has no Muon momentum), so it cannot differ."""
    return {k: (a[k], b[k]) for k in sorted(set(a) & set(b)) if k not in IGNORED_KEYS and a[k] != b[k]}


def _own_settings(a: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, list]:
    """Every hashed setting of arm `a` that is not the baseline's: those both set differently, and those that
    act only in the arm (its method's own, e.g. optim.prepolar.tau = 10 of an HBIEQ arm; the baseline's value
    None: off there), so two arms of one method at two settings never read alike."""
    return {k: [a.get(k), base.get(k)] for k in sorted(set(a) | set(base))
            if k not in IGNORED_KEYS and k in a and a.get(k) != base.get(k)}


def _show(diffs: Mapping[str, tuple[Any, Any]], limit: int = 6) -> str:
    items = [f"{k}={a!r} vs {b!r}" for k, (a, b) in list(diffs.items())[:limit]]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return ", ".join(items) + more


def check_protocol(runs: Mapping[str, list[dict]], baseline: str,
                   arm_overrides: Mapping[str, Any] | None = None
                   ) -> tuple[list[str], dict[str, dict[str, list]], list[str], dict[str, str]]:
    """Compare resolved configs: within each arm across seeds, and each arm against the baseline.

    Within an arm every seed must share one config (seed and bookkeeping aside). Across arms,
    where `arm_overrides` names both arms' override keys, everything else must match; where it
    does not, only PROTOCOL_KEYS are compared. An arm that differs from the baseline in a setting
    that defines a protocol (DEFINING_KEYS), even one of its own overrides, is refused a contrast
    with it. Returns (warnings, per-arm differences from the baseline for the report, notes,
    {refused arm: why}).
    """
    warnings, notes, settings, refused = [], [], {}, {}
    overrides = {arm: _override_keys(v) for arm, v in (arm_overrides or {}).items()}
    reference: dict[str, dict] = {}
    for arm, records in runs.items():
        configs = [(r["seed"], recorded_settings(r)) for r in sorted(records, key=lambda r: r["seed"])]
        missing = [seed for seed, settings in configs if settings is None]
        if missing:
            warnings.append(f"arm {arm!r}: no config recorded for seed(s) {missing}; protocol not checked")
        configs = [(seed, settings.hashed) for seed, settings in configs if settings is not None]
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
        return warnings, settings, notes, refused
    unknown = []
    for arm, flat in reference.items():
        if arm == baseline:
            continue
        diffs = _differences(flat, base)
        settings[arm] = _own_settings(flat, base)
        defining = {k: v for k, v in diffs.items() if k in DEFINING_KEYS}
        if defining:
            refused[arm] = (f"arm {arm!r} runs at {_show(defining)} (the baseline's values second): settings that "
                            f"define a protocol, so it is not contrasted with baseline {baseline!r}; compare it "
                            f"with a baseline run at its values")
            warnings.append(f"PROTOCOL MISMATCH: {refused[arm]}")
            continue
        if arm in overrides and baseline in overrides:
            allowed = overrides[arm] | overrides[baseline]
            bad = {k: v for k, v in diffs.items() if not is_overridden(k, allowed)}
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
    return warnings, settings, notes, refused


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
