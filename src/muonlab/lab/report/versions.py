"""Arm versions: runs of one arm that ran different plug-in source are never pooled.

A run's config records the digest of each plug-in source it ran (muonlab.config.plugin_code). Where the
ledger's runs of an arm ran more than one version of that source, each version is reported as an arm of its
own, `ARM@<8 hex digits of the version>`, so an edited conditioner is compared with the baseline, and with
its earlier self, instead of being averaged with it.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any, Mapping

from muonlab.config import CODE_KEY


def version_of(record: dict) -> str | None:
    """8 hex digits naming the plug-in source a run ran (None: it ran none, or recorded none)."""
    config = record.get("config")
    code = config.get(CODE_KEY) if isinstance(config, dict) else None
    if not code:
        return None
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:8]


def split_versions(records: list[dict], arm_overrides: Mapping[str, Any]) -> tuple[list[dict], dict[str, Any], list[str]]:
    """(the records with each multi-version arm renamed per version, the overrides of the new names, notes)."""
    versions: dict[str, set[str | None]] = defaultdict(set)
    for r in records:
        versions[r.get("arm")].add(version_of(r))
    split = {arm: v for arm, v in versions.items() if len(v) > 1}
    if not split:
        return records, dict(arm_overrides), []
    out, overrides = [], dict(arm_overrides)
    for r in records:
        if r.get("arm") in split:
            arm = r["arm"]
            r = {**r, "arm": f"{arm}@{version_of(r) or 'unrecorded'}", "arm_name": arm}
            if arm in arm_overrides:
                overrides[r["arm"]] = arm_overrides[arm]
        out.append(r)
    notes = []
    for arm, found in sorted(split.items()):
        names = ", ".join(sorted(f"{arm}@{x or 'unrecorded'}" for x in found))
        notes.append(f"arm {arm!r} ran {len(found)} versions of its plug-in source: each is reported as an arm of "
                     f"its own ({names}), never pooled")
    return out, overrides, notes
