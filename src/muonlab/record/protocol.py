"""The protocol id a run records: which runs may be pooled into one sample.

A run's protocol is what every arm of its study shares: its configuration resolved without the
arm's overrides and without the seed (muonlab.config computes the settings; this module names
and hashes them). A report never pools runs of two protocols (docs/design.md, Contracts).

The id is written as `protocol` in the ledger line and inside the saved config (beside
`format`); ledger lines written before it existed have none, and the report derives one from
their recorded config instead (muonlab.lab.report.grouping) and says so.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

PROTOCOL_FORMAT = 1  # bump when the settings a protocol covers change meaning
PROTOCOL_KEY = "protocol"


def protocol_hash(values: Mapping[str, Any]) -> str:
    """sha256 (first 16 hex digits) of a protocol's flat {dotted key: value} settings."""
    blob = json.dumps({"protocol_format": PROTOCOL_FORMAT, **values}, sort_keys=True, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def recorded_protocol(record: Mapping[str, Any]) -> str | None:
    """The protocol id a ledger line carries (its own field, else its saved config's), or None."""
    value = record.get(PROTOCOL_KEY)
    config = record.get("config")
    if not value and isinstance(config, Mapping):
        value = config.get(PROTOCOL_KEY)
    return value if isinstance(value, str) and value else None


def recorded_arm_overrides(records: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """arm -> the overrides its lines recorded (the "arm" layer of their saved config), for every
    arm whose lines hold one: what an arm defined outside the registry is."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        config = r.get("config")
        layers = config.get("layers") if isinstance(config, dict) else None
        if isinstance(layers, list) and isinstance(r.get("arm"), str):
            values = {k: v for x in layers if isinstance(x, dict) and x.get("origin") == "arm"
                      and isinstance(x.get("values"), dict) for k, v in x["values"].items()}
            out.setdefault(r["arm"], values)
    return out
